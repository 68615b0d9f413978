import React, { ChangeEvent } from 'react';
import { QueryEditorProps, SelectableValue } from '@grafana/data';
import { InlineField, InlineFieldRow, Input, Select } from '@grafana/ui';

import type { DataSource } from '../datasource';
import { DeepSeedOptions, DeepSeedQuery, VariableKind, VariableQuery } from '../types';

type Props = QueryEditorProps<DataSource, DeepSeedQuery, DeepSeedOptions, VariableQuery>;

const kinds: Array<SelectableValue<VariableKind>> = [
  { value: 'projects', label: 'Projects' },
  { value: 'runs', label: 'Runs', description: 'Filtered by project, sweep and tag' },
  { value: 'metrics', label: 'Metrics', description: "Step metrics, with a run's own metrics" },
  { value: 'ranks', label: 'Ranks', description: 'Ranks of a run' },
  { value: 'hosts', label: 'Hosts', description: 'Hosts with GPU samples in the time range' },
];

/** VariableQueryEditor defines a template variable from one of the backend's lists. */
export function VariableQueryEditor({ query, onChange }: Props) {
  const q: VariableQuery = { ...query, kind: query.kind || 'runs' };
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
            inputId="deepseed-variable-kind"
            aria-label="List"
            width={24}
            options={kinds}
            value={q.kind}
            onChange={(v) => onChange({ ...q, kind: v.value as VariableKind })}
          />
        </InlineField>
      </InlineFieldRow>
      {q.kind === 'runs' && (
        <InlineFieldRow>
          {field('project', 'Project', '$project')}
          {field('sweep', 'Sweep', 'optional')}
          {field('tag', 'Tag', 'optional')}
        </InlineFieldRow>
      )}
      {(q.kind === 'metrics' || q.kind === 'ranks' || q.kind === 'hosts') && (
        <InlineFieldRow>{field('run', 'Run', q.kind === 'ranks' ? '$run' : 'optional, e.g. $run')}</InlineFieldRow>
      )}
    </>
  );
}
