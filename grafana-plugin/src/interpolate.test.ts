import { ScopedVars } from '@grafana/data';

import { interpolateQuery } from './interpolate';
import { DeepSeedQuery } from './types';

// replace mimics Grafana's template service for $run (multi-value) and $project.
const vars: Record<string, string[]> = { run: ['bert-z2', 'bert-z3'], project: ['nlp'], metric: ['loss', 'lr'] };
function replace(value: string, _sv: ScopedVars, format?: string): string {
  return value.replace(/\$\{?(\w+)\}?|\[\[(\w+)\]\]/g, (_m, n1: string, n2: string) => {
    const name = n1 || n2;
    const v = vars[name] || [];
    return format === 'csv' ? v.join(',') : v.length > 1 ? `{${v.join(',')}}` : v.join('');
  });
}

describe('interpolateQuery', () => {
  it('expands multi-value variables in runIds and metrics and replaces the rest', () => {
    const q: DeepSeedQuery = {
      refId: 'A',
      queryType: 'compare',
      runIds: ['$run', 'extra'],
      metrics: ['$metric'],
      project: '$project',
      baseline: 'bert-z2',
    };
    const out = interpolateQuery(q, {}, replace);
    expect(out.runIds).toEqual(['bert-z2', 'bert-z3', 'extra']);
    expect(out.metrics).toEqual(['loss', 'lr']);
    expect(out.project).toBe('nlp');
    expect(out.baseline).toBe('bert-z2');
    expect(out.refId).toBe('A');
  });

  it('expands a multi-value variable of event types', () => {
    vars.types = ['checkpoint', 'eval'];
    const out = interpolateQuery({ refId: 'A', queryType: 'annotations', eventTypes: ['$types', 'restart'] }, {}, replace);
    expect(out.eventTypes).toEqual(['checkpoint', 'eval', 'restart']);
  });

  it('replaces variables in every string field, also those it has never heard of', () => {
    vars.state = ['running'];
    vars.goal = ['max'];
    const q = { refId: 'A', queryType: 'sweep_trials', state: '$state', metric: '${project}_acc', goal: '[[goal]]', later: '$project', maxSteps: 5 };
    const out = interpolateQuery(q as DeepSeedQuery, {}, replace) as typeof q;
    expect(out.state).toBe('running');
    expect(out.metric).toBe('nlp_acc');
    expect(out.goal).toBe('max');
    expect(out.later).toBe('nlp');
    expect(out.maxSteps).toBe(5);
    expect(out.queryType).toBe('sweep_trials');
  });

  it('leaves absent fields absent', () => {
    const out = interpolateQuery({ refId: 'A', queryType: 'runs' }, {}, replace);
    expect(out.runIds).toBeUndefined();
    expect(out.runId).toBeUndefined();
  });
});
