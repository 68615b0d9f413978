/// <reference types="node" />
import { ScopedVars } from '@grafana/data';
import { readdirSync, readFileSync, writeFileSync } from 'fs';
import { join, resolve } from 'path';

import { DataSource } from './datasource';
import { unresolvedVariables } from './interpolate';
import { DeepSeedQuery } from './types';

// Every target of every provisioned dashboard goes through the data
// source's own applyTemplateVariables and interpolateVariablesInQueries,
// with getTemplateSrv() answered by a template service that substitutes
// the dashboard's variables as Grafana's does. Run alone, the variables
// take placeholder values; the dashboards package's Go test runs this file
// with the values a real server's variable resources offer, one set per
// run to look at (DEEPSEED_DASHBOARD_VARIABLES), and sends the queries it
// writes (DEEPSEED_DASHBOARD_QUERIES) to that server through the plugin.

const PLUGIN_ID = 'deepseed-telemetry-datasource';
const DASHBOARDS = resolve(__dirname, '../../dashboards/json');

interface Variable {
  name: string;
  multi?: boolean;
  includeAll?: boolean;
  allValue?: string;
  current?: { value?: string | string[] };
  options?: Array<{ value: string }>;
}

interface Target extends DeepSeedQuery {
  datasource?: { type?: string; uid?: string };
}

interface Panel {
  id: number;
  type: string;
  title: string;
  repeat?: string;
  datasource?: { type?: string };
  targets?: Target[];
  panels?: Panel[];
}

interface Dashboard {
  uid: string;
  panels: Panel[];
  templating: { list: Variable[] };
  annotations: { list: Array<{ name: string; datasource?: { type?: string }; target?: Target }> };
}

/** Written for the Go side: one entry per query as the browser sends it. */
export interface RenderedQuery {
  dashboard: string;
  /** The variables' values the query was rendered with. */
  variables: Record<string, string[]>;
  panel: string;
  query: DeepSeedQuery;
}

/** Per dashboard, the sets of variable values to render its queries with. */
const picked: Record<string, Array<Record<string, string[]>>> = process.env.DEEPSEED_DASHBOARD_VARIABLES
  ? JSON.parse(readFileSync(process.env.DEEPSEED_DASHBOARD_VARIABLES, 'utf8'))
  : {};

/**
 * valuesOf is a variable's value on first load: the pick given for it, its
 * saved current value (a saved "All" as the all value, as Grafana renders
 * it), or a placeholder; "All" where the variable offers it with an all
 * value of its own.
 */
function valuesOf(given: Record<string, string[]>, v: Variable): string[] {
  const pick = given[v.name];
  if (pick && pick.length) {
    return pick;
  }
  const cur = v.current?.value;
  const all = (Array.isArray(cur) ? cur : [cur]).includes('$__all');
  if (all && v.includeAll && v.allValue) {
    // A saved "All" is Grafana's $__all, which it renders as the all value.
    return [v.allValue];
  }
  if (cur !== undefined && cur !== '' && !all) {
    return Array.isArray(cur) ? cur : [cur];
  }
  if (v.includeAll && v.allValue) {
    return [v.allValue];
  }
  return v.options?.length ? [v.options[0].value] : [`${v.name}-value`];
}

const VAR = /\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?::([^}]+))?\}/g;

/**
 * templateService does what Grafana's template service does to a string:
 * $name, ${name}, ${name:format} and [[name]], scoped variables first, a
 * multi-value variable as {a,b} or, formatted csv, as a,b; unknown names
 * are left as written.
 */
export function templateService(vars: Record<string, string[]>) {
  return {
    replace(target: string, scopedVars?: ScopedVars, format?: string): string {
      return (target ?? '').replace(VAR, (match, n1, n2, f2, n3, f3) => {
        const name: string = n1 || n2 || n3;
        const fmt: string | undefined = f2 || f3 || format;
        const scoped = scopedVars?.[name];
        const values = scoped ? [String(scoped.value)] : vars[name];
        if (!values) {
          return match;
        }
        if (values.length === 1) {
          return values[0];
        }
        return fmt === 'csv' ? values.join(',') : `{${values.join(',')}}`;
      });
    },
    getVariables: () => [],
    containsTemplate: (t?: string) => !!t && t.match(VAR) !== null,
    updateTimeRange: () => {},
  };
}

let template = templateService({});
vi.mock('@grafana/runtime', () => ({
  DataSourceWithBackend: class {
    getRef() {
      return { type: PLUGIN_ID, uid: 'deepseed' };
    }
  },
  getTemplateSrv: () => template,
}));

function dashboards(): Dashboard[] {
  return readdirSync(DASHBOARDS)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => JSON.parse(readFileSync(join(DASHBOARDS, f), 'utf8')) as Dashboard);
}

/** panelTargets lists each panel with the scoped variables of the row it repeats under. */
function panelTargets(d: Dashboard, vars: Record<string, string[]>) {
  const out: Array<{ panel: Panel; scopedVars: ScopedVars }> = [];
  let repeat: string | undefined;
  const visit = (p: Panel) => {
    if (p.type === 'row') {
      repeat = p.repeat;
      (p.panels || []).forEach(visit);
      return;
    }
    const by = p.repeat || repeat;
    const scopedVars: ScopedVars = by && vars[by] ? { [by]: { text: vars[by][0], value: vars[by][0] } } : {};
    out.push({ panel: p, scopedVars });
  };
  d.panels.forEach(visit);
  return out;
}

function ours(t: Target, p?: Panel): boolean {
  const type = t.datasource?.type ?? p?.datasource?.type;
  return type === undefined || type === PLUGIN_ID;
}

describe('provisioned dashboards through the frontend', () => {
  const ds = new DataSource({ jsonData: {} } as never);
  const rendered: RenderedQuery[] = [];

  afterAll(() => {
    if (process.env.DEEPSEED_DASHBOARD_QUERIES) {
      writeFileSync(process.env.DEEPSEED_DASHBOARD_QUERIES, JSON.stringify(rendered, null, 1));
    }
  });

  for (const d of dashboards()) {
    for (const given of picked[d.uid] ?? [{}]) {
      const label = Object.keys(given).length ? ` (${JSON.stringify(given)})` : '';
      it(`${d.uid}: every query has every variable replaced${label}`, () => {
        const vars: Record<string, string[]> = {};
        for (const v of d.templating.list) {
          vars[v.name] = valuesOf(given, v);
        }
        template = templateService(vars);
        let n = 0;
        for (const { panel, scopedVars } of panelTargets(d, vars)) {
          const targets = (panel.targets || []).filter((t) => ours(t, panel));
          // Grafana's DataSourceWithBackend.query: filterQuery, then applyTemplateVariables.
          for (const t of targets.filter((q) => ds.filterQuery(q))) {
            const q = ds.applyTemplateVariables(t, scopedVars);
            expect(unresolvedVariables(q), `${d.uid} "${panel.title}" ${t.refId}: ${JSON.stringify(q)}`).toEqual([]);
            rendered.push({ dashboard: d.uid, variables: vars, panel: panel.title, query: q });
            n++;
          }
          // Explore and "copy to another data source" go through interpolateVariablesInQueries.
          for (const q of ds.interpolateVariablesInQueries(targets, scopedVars)) {
            expect(unresolvedVariables(q), `${d.uid} "${panel.title}" ${q.refId}`).toEqual([]);
          }
        }
        for (const a of d.annotations.list) {
          if (a.target && a.datasource?.type === PLUGIN_ID) {
            const q = ds.applyTemplateVariables(a.target, {});
            expect(unresolvedVariables(q), `${d.uid} annotation ${a.name}`).toEqual([]);
            rendered.push({ dashboard: d.uid, variables: vars, panel: `annotation ${a.name}`, query: q });
            n++;
          }
        }
        expect(n).toBeGreaterThan(0);
      });
    }
  }

  it('leaves a variable nobody defined for the check to find', () => {
    template = templateService({ project: ['nlp'] });
    const q = ds.applyTemplateVariables({ refId: 'A', queryType: 'jobs', project: '$project', state: '$nothing' }, {});
    expect(q.project).toBe('nlp');
    expect(unresolvedVariables(q)).toEqual(['$nothing']);
  });
});
