import { DataQueryRequest, dateTime } from '@grafana/data';
import { firstValueFrom } from 'rxjs';

import { DataSource, DeepSeedVariableSupport } from './datasource';

// The runtime needs a Grafana page around it; the variable support only
// calls the data source passed in.
vi.mock('@grafana/runtime', () => ({
  DataSourceWithBackend: class {},
  getTemplateSrv: () => ({ replace: (v: string) => v }),
}));
import { VariableQuery } from './types';

function request(target: unknown): DataQueryRequest<VariableQuery> {
  const from = dateTime('2024-03-01T11:00:00Z');
  const to = dateTime('2024-03-01T13:00:00Z');
  return {
    targets: [target as VariableQuery],
    range: { from, to, raw: { from, to } },
  } as unknown as DataQueryRequest<VariableQuery>;
}

describe('DeepSeedVariableSupport', () => {
  const fetchOptions = vi.fn(async () => [{ text: 'zero-sweep', value: 'zero-sweep' }]);
  const support = new DeepSeedVariableSupport({ fetchOptions } as unknown as DataSource);

  it('fetches the resource a dashboard variable names, with its filters', async () => {
    const res = await firstValueFrom(support.query(request({ refId: 'var-sweep', resource: 'sweeps', project: 'nlp' })));
    expect(fetchOptions).toHaveBeenLastCalledWith('sweeps', { project: 'nlp' });
    expect(res.data).toEqual([{ text: 'zero-sweep', value: 'zero-sweep' }]);
  });

  it('still reads a variable saved with kind', async () => {
    await firstValueFrom(support.query(request({ refId: 'V', kind: 'ranks', run: 'bert-z2' })));
    expect(fetchOptions).toHaveBeenLastCalledWith('ranks', { run: 'bert-z2' });
  });

  it('gives hosts the time range', async () => {
    await firstValueFrom(support.query(request({ refId: 'V', resource: 'hosts' })));
    expect(fetchOptions).toHaveBeenLastCalledWith('hosts', {
      run: undefined,
      from: '2024-03-01T11:00:00.000Z',
      to: '2024-03-01T13:00:00.000Z',
    });
  });
});
