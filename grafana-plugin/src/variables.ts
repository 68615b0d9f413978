import { VARIABLE_RESOURCES, VariableQuery, VariableResource } from './types';

/** A variable query as stored by any version: today's model, the first release's `kind`, or a bare list name. */
export type StoredVariableQuery = string | (Partial<VariableQuery> & { kind?: string });

function asResource(v: unknown): VariableResource | undefined {
  return typeof v === 'string' && (VARIABLE_RESOURCES as string[]).includes(v) ? (v as VariableResource) : undefined;
}

/**
 * normalizeVariableQuery reads a stored variable query into today's model.
 * The first release named the list `kind`; variables saved then still
 * work, and are written back with `resource` only. A missing or unknown
 * list falls back to runs, the list most variables want.
 */
export function normalizeVariableQuery(stored: StoredVariableQuery | undefined): VariableQuery {
  if (typeof stored === 'string') {
    return { refId: 'variable', resource: asResource(stored.trim()) ?? 'runs' };
  }
  const { kind, ...rest } = stored ?? {};
  return {
    ...rest,
    refId: rest.refId || 'variable',
    resource: asResource(rest.resource) ?? asResource(kind) ?? 'runs',
  };
}

/** variableParams gives the resource call's query string: the filters the list uses. */
export function variableParams(q: VariableQuery): Record<string, string | undefined> {
  switch (q.resource) {
    case 'runs':
      return {
        project: q.project,
        sweep: q.sweep,
        tag: q.tag,
        status: q.status,
        baseline: q.baseline ? 'true' : undefined,
      };
    case 'sweeps':
      return { project: q.project };
    case 'metrics':
    case 'ranks':
    case 'hosts':
      return { run: q.run };
    case 'window':
      return { run: q.run, part: q.part };
    case 'job_sweeps':
      return { project: q.project };
    case 'sweep_metrics':
      return { sweep: q.sweep, project: q.project };
    case 'sweep_goals':
      return { sweep: q.sweep, project: q.project, metric: q.metric };
    default:
      return {};
  }
}
