import { ScopedVars } from '@grafana/data';

import { DeepSeedQuery } from './types';

export type Replace = (value: string, scopedVars: ScopedVars, format?: string) => string;

/**
 * interpolateQuery replaces template variables in every string of a query.
 * Multi-value variables in runIds and metrics expand to several entries.
 */
export function interpolateQuery(query: DeepSeedQuery, scopedVars: ScopedVars, replace: Replace): DeepSeedQuery {
  const one = (v?: string) => (v ? replace(v, scopedVars) : v);
  const many = (vs?: string[]) =>
    vs
      ? vs
          .flatMap((v) => replace(v, scopedVars, 'csv').split(','))
          .map((v) => v.trim())
          .filter((v) => v !== '')
      : vs;
  return {
    ...query,
    project: one(query.project),
    runId: one(query.runId),
    runIds: many(query.runIds),
    sweep: one(query.sweep),
    tag: one(query.tag),
    status: one(query.status),
    baseline: one(query.baseline),
    metrics: many(query.metrics),
    rank: one(query.rank),
    host: one(query.host),
    gpu: one(query.gpu),
    eventTypes: many(query.eventTypes),
  };
}
