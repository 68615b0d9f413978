import React, { ChangeEvent } from 'react';
import { QueryEditorProps, SelectableValue } from '@grafana/data';
import { InlineField, InlineFieldRow, Input, Select } from '@grafana/ui';

import type { DataSource } from '../datasource';
import { DeepSeedOptions, DeepSeedQuery, VariableQuery, VariableResource } from '../types';
import { normalizeVariableQuery, StoredVariableQuery } from '../variables';

type Props = QueryEditorProps<DataSource, DeepSeedQuery, DeepSeedOptions, VariableQuery>;

const resources: Array<SelectableValue<VariableResource>> = [
  { value: 'projects', label: 'Projects' },
  { value: 'runs', label: 'Runs', description: 'Filtered by project, sweep, tag and status' },
  { value: 'sweeps', label: 'Sweeps', description: 'Sweeps of a project' },
  { value: 'metrics', label: 'Metrics', description: "Step metrics, with a run's own metrics" },
  { value: 'ranks', label: 'Ranks', description: 'Ranks of a run' },
  { value: 'hosts', label: 'Hosts', description: 'Hosts with GPU samples in the time range' },
  {
    value: 'window',
    label: 'Run window',
    description: "One part of a run's time window (span, shift, from, to), for panel time overrides and links",
  },
  { value: 'job_projects', label: 'Job projects', description: 'Projects of jobs and quotas' },
  { value: 'job_sweeps', label: 'Job sweeps', description: 'Sweeps of jobs, newest first' },
  { value: 'job_states', label: 'Job states', description: 'queued, running, finished, failed, cancelled, lost' },
  { value: 'sweep_metrics', label: 'Sweep metrics', description: "Eval metrics to rank a sweep's trials by, its own first" },
  { value: 'sweep_goals', label: 'Sweep goals', description: 'max and min, the one that suits the metric first' },
];

/**
 * VariableQueryEditor defines a template variable from one of the backend's
 * lists. A variable saved with the first release's `kind` is shown as its
 * resource and saved back in today's model on the first change.
 */
export function VariableQueryEditor({ query, onChange }: Props) {
  const q = normalizeVariableQuery(query as StoredVariableQuery);
  const field = (name: keyof VariableQuery, label: string, placeholder: string) => (
    <InlineField label={label} labelWidth={10}>
      <Input
        aria-label={label}
        width={24}
        placeholder={placeholder}
        value={(q[name] as string | undefined) ?? ''}
        onChange={(e: ChangeEvent<HTMLInputElement>) => onChange({ ...q, [name]: e.target.value || undefined })}
      />
    </InlineField>
  );
  return (
    <>
      <InlineFieldRow>
        <InlineField label="List" labelWidth={10}>
          <Select
            inputId="deepseed-variable-resource"
            aria-label="List"
            width={24}
            options={resources}
            value={q.resource}
            onChange={(v) => onChange({ ...q, resource: v.value as VariableResource })}
          />
        </InlineField>
      </InlineFieldRow>
      {q.resource === 'runs' && (
        <InlineFieldRow>
          {field('project', 'Project', '$project')}
          {field('sweep', 'Sweep', 'optional')}
          {field('tag', 'Tag', 'optional')}
          {field('status', 'Status', 'optional')}
        </InlineFieldRow>
      )}
      {q.resource === 'sweeps' && <InlineFieldRow>{field('project', 'Project', 'optional, e.g. $project')}</InlineFieldRow>}
      {(q.resource === 'metrics' || q.resource === 'ranks' || q.resource === 'hosts') && (
        <InlineFieldRow>{field('run', 'Run', q.resource === 'ranks' ? '$run' : 'optional, e.g. $run')}</InlineFieldRow>
      )}
      {q.resource === 'job_sweeps' && <InlineFieldRow>{field('project', 'Project', 'optional, e.g. $project')}</InlineFieldRow>}
      {(q.resource === 'sweep_metrics' || q.resource === 'sweep_goals') && (
        <InlineFieldRow>
          {field('sweep', 'Sweep', '$sweep; empty for the newest')}
          {field('project', 'Project', 'optional, e.g. $project')}
          {q.resource === 'sweep_goals' && field('metric', 'Metric', '$metric')}
        </InlineFieldRow>
      )}
      {q.resource === 'window' && (
        <InlineFieldRow>
          {field('run', 'Run', '$run')}
          {field('part', 'Part', 'span, shift, from or to')}
        </InlineFieldRow>
      )}
    </>
  );
}
