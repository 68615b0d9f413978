import { normalizeVariableQuery, variableParams } from './variables';

describe('normalizeVariableQuery', () => {
  it('keeps the model the provisioned dashboards write', () => {
    const q = normalizeVariableQuery({ refId: 'var-sweep', resource: 'sweeps', project: '$project' });
    expect(q).toEqual({ refId: 'var-sweep', resource: 'sweeps', project: '$project' });
  });

  it('reads the first release’s kind and writes resource only', () => {
    const q = normalizeVariableQuery({ refId: 'V', kind: 'ranks', run: '$run' });
    expect(q).toEqual({ refId: 'V', resource: 'ranks', run: '$run' });
    expect('kind' in q).toBe(false);
  });

  it('prefers resource over kind and falls back to runs', () => {
    expect(normalizeVariableQuery({ refId: 'V', resource: 'hosts', kind: 'runs' }).resource).toBe('hosts');
    expect(normalizeVariableQuery({ refId: 'V', kind: 'bogus' }).resource).toBe('runs');
    expect(normalizeVariableQuery(undefined).resource).toBe('runs');
    expect(normalizeVariableQuery('projects').resource).toBe('projects');
  });
});

describe('variableParams', () => {
  it('sends only the filters of the list', () => {
    expect(variableParams({ refId: 'V', resource: 'sweeps', project: 'nlp', run: 'x' })).toEqual({ project: 'nlp' });
    expect(variableParams({ refId: 'V', resource: 'runs', project: 'nlp', sweep: 's', status: 'running' })).toEqual({
      project: 'nlp',
      sweep: 's',
      tag: undefined,
      status: 'running',
    });
    expect(variableParams({ refId: 'V', resource: 'runs', project: '$project', baseline: true })).toEqual({
      project: '$project',
      baseline: 'true',
    });
    expect(variableParams({ refId: 'V', resource: 'projects', project: 'nlp' })).toEqual({});
    expect(variableParams({ refId: 'V', resource: 'window', run: '$run', part: 'span', project: 'nlp' })).toEqual({
      run: '$run',
      part: 'span',
    });
  });

  it('sends the job lists their filters', () => {
    expect(variableParams({ refId: 'V', resource: 'job_sweeps', project: '$project', sweep: 'x' })).toEqual({ project: '$project' });
    expect(variableParams({ refId: 'V', resource: 'job_states', project: 'imdb' })).toEqual({});
    expect(variableParams({ refId: 'V', resource: 'sweep_goals', sweep: '$sweep', project: '*', metric: '$metric', run: 'r' })).toEqual({
      sweep: '$sweep',
      project: '*',
      metric: '$metric',
    });
    expect(normalizeVariableQuery({ refId: 'V', resource: 'sweep_metrics' }).resource).toBe('sweep_metrics');
  });
});
