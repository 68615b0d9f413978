import React from 'react';
import { render, screen, waitFor, fireEvent } from '@testing-library/react';
import userEvent from '@testing-library/user-event';

import { QueryEditor } from './QueryEditor';
import type { DataSource } from '../datasource';
import { DeepSeedQuery } from '../types';

function fakeDatasource() {
  const fetchOptions = vi.fn(async (kind: string) => {
    if (kind === 'runs') {
      return [
        { text: 'BERT ZeRO-2', value: 'bert-z2' },
        { text: 'BERT ZeRO-3', value: 'bert-z3' },
      ];
    }
    if (kind === 'metrics') {
      return [
        { text: 'loss', value: 'loss' },
        { text: 'metrics.tokens_seen', value: 'metrics.tokens_seen' },
      ];
    }
    return [];
  });
  return { ds: { fetchOptions } as unknown as DataSource, fetchOptions };
}

function setup(query: Partial<DeepSeedQuery>) {
  const { ds, fetchOptions } = fakeDatasource();
  const onChange = vi.fn();
  const onRunQuery = vi.fn();
  const q = { refId: 'A', ...query } as DeepSeedQuery;
  const utils = render(<QueryEditor query={q} datasource={ds} onChange={onChange} onRunQuery={onRunQuery} />);
  return { ...utils, onChange, onRunQuery, fetchOptions };
}

describe('QueryEditor', () => {
  it('shows the fields of a series query and loads runs and metrics from the backend', async () => {
    const { fetchOptions } = setup({ queryType: 'series', runId: 'bert-z2', metrics: ['loss'] });
    expect(screen.getByLabelText('Metrics')).toBeInTheDocument();
    expect(screen.getByLabelText('Rank')).toBeInTheDocument();
    expect(screen.getByText('Step')).toBeInTheDocument();
    expect(screen.getByLabelText('Min/max')).toBeInTheDocument();
    expect(screen.queryByLabelText('Columns')).not.toBeInTheDocument();
    await waitFor(() => expect(fetchOptions).toHaveBeenCalledWith('runs', {}));
    expect(fetchOptions).toHaveBeenCalledWith('metrics', { run: 'bert-z2' });
  });

  it('writes the rank typed and runs the query on blur', () => {
    const { onChange, onRunQuery } = setup({ queryType: 'series', runId: 'r', metrics: ['loss'] });
    const rank = screen.getByLabelText('Rank');
    fireEvent.change(rank, { target: { value: 'all' } });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ rank: 'all', queryType: 'series' }));
    fireEvent.blur(rank);
    expect(onRunQuery).toHaveBeenCalled();
  });

  it('switches to the step axis for the trend panel', async () => {
    const { onChange } = setup({ queryType: 'series', runId: 'r', metrics: ['loss'] });
    await userEvent.click(screen.getByText('Step'));
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ xAxis: 'step' }));
  });

  it('changes the query type from the picker', async () => {
    const { onChange } = setup({ queryType: 'series', runId: 'r', metrics: ['loss'] });
    await userEvent.click(screen.getByLabelText('Query type'));
    await userEvent.click(await screen.findByText('Layer heatmap'));
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ queryType: 'heatmap' }));
  });

  it('shows pass and columns for a heatmap, not metrics', () => {
    const { onChange } = setup({ queryType: 'heatmap', runId: 'r' });
    expect(screen.getByText('Backward')).toBeInTheDocument();
    expect(screen.queryByLabelText('Metrics')).not.toBeInTheDocument();
    fireEvent.change(screen.getByLabelText('Columns'), { target: { value: '200' } });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ maxSteps: 200 }));
  });

  it('asks a ranks query for the per-host roll-up', async () => {
    const { onChange } = setup({ queryType: 'ranks', runId: 'r' });
    await userEvent.click(screen.getByText('Hosts'));
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ queryType: 'ranks', part: 'hosts' }));
  });

  it('takes runs, a sweep and a baseline for compare', () => {
    const { onChange } = setup({ queryType: 'compare', runIds: ['$run'] });
    expect(screen.getByLabelText('Runs')).toBeInTheDocument();
    expect(screen.getByText('$run')).toBeInTheDocument();
    fireEvent.change(screen.getByLabelText('Baseline'), { target: { value: 'bert-z2' } });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ baseline: 'bert-z2', runIds: ['$run'] }));
  });

  it('takes runs or a project for the ledger, and pinned baseline runs for a regression', () => {
    const { onChange } = setup({ queryType: 'ledger', runIds: ['$run'] });
    expect(screen.getByText('$run')).toBeInTheDocument();
    fireEvent.change(screen.getByLabelText('Project'), { target: { value: 'nlp' } });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ queryType: 'ledger', project: 'nlp', runIds: ['$run'] }));
    const r = setup({ queryType: 'regression', runId: '$run' });
    fireEvent.change(screen.getByLabelText('Baseline'), { target: { value: 'base-1,base-2' } });
    expect(r.onChange).toHaveBeenLastCalledWith(expect.objectContaining({ queryType: 'regression', baseline: 'base-1,base-2' }));
  });

  it('picks the event types of an annotation', async () => {
    const { onChange } = setup({ queryType: 'annotations', runId: '$run', eventTypes: ['checkpoint'] });
    expect(screen.getByText('Checkpoints')).toBeInTheDocument();
    expect(screen.queryByLabelText('Metrics')).not.toBeInTheDocument();
    await userEvent.click(screen.getByLabelText('Event types'));
    await userEvent.click(await screen.findByText('Overflow skips'));
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ eventTypes: ['checkpoint', 'overflow'] }));
  });

  it('shows host and GPU for GPU telemetry', () => {
    const { onChange } = setup({ queryType: 'gpus' });
    fireEvent.change(screen.getByLabelText('GPU'), { target: { value: '3' } });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ gpu: '3' }));
    expect(screen.getByLabelText('Host')).toBeInTheDocument();
  });

  it('ranks sweep trials by a metric and goal, with no run to pick', async () => {
    const { onChange, fetchOptions } = setup({ queryType: 'sweep_trials', sweep: '$sweep' });
    expect(screen.queryByLabelText('Run')).not.toBeInTheDocument();
    expect(screen.queryByLabelText('State')).not.toBeInTheDocument();
    fireEvent.change(screen.getByLabelText('Metric'), { target: { value: 'val_loss' } });
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ metric: 'val_loss', sweep: '$sweep' }));
    await userEvent.click(screen.getByText('Min'));
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ goal: 'min' }));
    expect(fetchOptions).not.toHaveBeenCalledWith('runs', expect.anything());
  });

  it('filters jobs by state, and quotas only by project', async () => {
    const { onChange, unmount } = setup({ queryType: 'jobs', project: 'imdb' });
    expect(screen.queryByLabelText('Metric')).not.toBeInTheDocument();
    await userEvent.click(screen.getByLabelText('State'));
    await userEvent.click(await screen.findByText('failed'));
    expect(onChange).toHaveBeenLastCalledWith(expect.objectContaining({ state: 'failed', project: 'imdb', queryType: 'jobs' }));
    unmount();
    setup({ queryType: 'quotas' });
    expect(screen.getByLabelText('Project')).toBeInTheDocument();
    expect(screen.queryByLabelText('Sweep')).not.toBeInTheDocument();
    expect(screen.queryByLabelText('State')).not.toBeInTheDocument();
  });
});
