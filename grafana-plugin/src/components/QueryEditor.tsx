import React, { ChangeEvent, useEffect, useMemo, useState } from 'react';
import { QueryEditorProps, SelectableValue } from '@grafana/data';
import { InlineField, InlineFieldRow, InlineSwitch, Input, MultiSelect, RadioButtonGroup, Select } from '@grafana/ui';

import { DataSource } from '../datasource';
import {
  DeepSeedOptions,
  DeepSeedQuery,
  EVENT_TYPES,
  GPU_METRICS,
  JOB_STATES,
  Option,
  QUERY_TYPES,
  QueryType,
  STEP_METRICS,
} from '../types';

type Props = QueryEditorProps<DataSource, DeepSeedQuery, DeepSeedOptions>;

const LABEL = 14;

const typeOptions: Array<SelectableValue<QueryType>> = QUERY_TYPES.map((t) => ({
  value: t.value,
  label: t.label,
  description: t.description,
}));

const xAxisOptions: Array<SelectableValue<'time' | 'step'>> = [
  { value: 'time', label: 'Time' },
  { value: 'step', label: 'Step' },
];

const passOptions: Array<SelectableValue<'forward' | 'backward'>> = [
  { value: 'forward', label: 'Forward' },
  { value: 'backward', label: 'Backward' },
];

const partOptions: Array<SelectableValue<string>> = [
  { value: '', label: 'Ranks' },
  { value: 'hosts', label: 'Hosts' },
];

const goalOptions: Array<SelectableValue<string>> = [
  { value: '', label: 'Auto' },
  { value: 'max', label: 'Max' },
  { value: 'min', label: 'Min' },
];

const toSelectable = (opts: Option[]): Array<SelectableValue<string>> => opts.map((o) => ({ value: o.value, label: o.text }));

const withCurrent = (opts: Array<SelectableValue<string>>, values: Array<string | undefined>) => {
  const out = [...opts];
  for (const v of values) {
    if (v && !out.some((o) => o.value === v)) {
      out.push({ value: v, label: v });
    }
  }
  return out;
};

/** useOptions loads a list from the backend's resources, keeping the last good answer. */
function useOptions(ds: DataSource, kind: string, params: Record<string, string | undefined>, enabled: boolean) {
  const [opts, setOpts] = useState<Array<SelectableValue<string>>>([]);
  const key = JSON.stringify(params);
  useEffect(() => {
    if (!enabled) {
      return;
    }
    let live = true;
    ds.fetchOptions(kind, JSON.parse(key))
      .then((o) => live && setOpts(toSelectable(o)))
      .catch(() => live && setOpts([]));
    return () => {
      live = false;
    };
  }, [ds, kind, key, enabled]);
  return opts;
}

const parseIntOrUndefined = (s: string): number | undefined => {
  const n = parseInt(s, 10);
  return Number.isFinite(n) ? n : undefined;
};

/**
 * QueryEditor picks the query type, then shows only the fields that type
 * uses: run, metrics, rank, pass and options. Every field accepts template
 * variables ($run, $metric, …).
 */
export function QueryEditor({ query, onChange, onRunQuery, datasource }: Props) {
  const type = query.queryType || 'series';
  const info = QUERY_TYPES.find((t) => t.value === type);
  const usesRun = Boolean(info?.needsRun) || type === 'gpus' || type === 'annotations';
  const runs = useOptions(datasource, 'runs', { project: query.project }, usesRun || type === 'compare' || type === 'ledger');
  const userMetrics = useOptions(datasource, 'metrics', { run: query.runId }, type === 'series');

  const metricOptions = useMemo(() => {
    const base = type === 'gpus' ? GPU_METRICS.map((m) => ({ value: m, label: m })) : userMetrics;
    const fallback = type === 'gpus' ? [] : STEP_METRICS.map((m) => ({ value: m, label: m }));
    return withCurrent(base.length ? base : fallback, query.metrics || []);
  }, [type, userMetrics, query.metrics]);

  const update = (patch: Partial<DeepSeedQuery>, run = true) => {
    onChange({ ...query, ...patch });
    if (run) {
      onRunQuery();
    }
  };
  const text = (field: keyof DeepSeedQuery) => ({
    value: (query[field] as string | undefined) ?? '',
    onChange: (e: ChangeEvent<HTMLInputElement>) => onChange({ ...query, [field]: e.target.value || undefined }),
    onBlur: () => onRunQuery(),
  });
  const num = (field: keyof DeepSeedQuery) => ({
    type: 'number',
    value: (query[field] as number | undefined) ?? '',
    onChange: (e: ChangeEvent<HTMLInputElement>) => onChange({ ...query, [field]: parseIntOrUndefined(e.target.value) }),
    onBlur: () => onRunQuery(),
  });

  return (
    <>
      <InlineFieldRow>
        <InlineField label="Query type" labelWidth={LABEL} tooltip={info?.description}>
          <Select
            inputId="deepseed-query-type"
            aria-label="Query type"
            width={30}
            options={typeOptions}
            value={type}
            onChange={(v) => update({ queryType: v.value })}
          />
        </InlineField>
        {usesRun && (
          <InlineField label="Run" labelWidth={8} tooltip="A run id or a variable such as $run">
            <Select
              inputId="deepseed-run"
              aria-label="Run"
              width={36}
              allowCustomValue
              isClearable={!info?.needsRun}
              options={withCurrent(runs, [query.runId])}
              value={query.runId || null}
              onChange={(v) => update({ runId: v?.value || undefined })}
            />
          </InlineField>
        )}
      </InlineFieldRow>

      {(type === 'series' || type === 'gpus') && (
        <InlineFieldRow>
          <InlineField label="Metrics" labelWidth={LABEL} grow>
            <MultiSelect
              inputId="deepseed-metrics"
              aria-label="Metrics"
              allowCustomValue
              options={metricOptions}
              value={query.metrics || []}
              onChange={(vs) => update({ metrics: vs.map((v) => v.value as string) })}
            />
          </InlineField>
        </InlineFieldRow>
      )}

      {(type === 'series' || type === 'heatmap' || type === 'breakdown') && (
        <InlineFieldRow>
          <InlineField label="Rank" labelWidth={LABEL} tooltip={type === 'series' ? 'A rank, or "all" for one series per rank' : 'A rank; empty for the lowest'}>
            <Input aria-label="Rank" width={12} placeholder="0" {...text('rank')} />
          </InlineField>
          {(type === 'series' || type === 'breakdown' || type === 'heatmap') && (
            <>
              <InlineField label="From step" labelWidth={12}>
                <Input aria-label="From step" width={12} {...num('fromStep')} />
              </InlineField>
              <InlineField label="To step" labelWidth={10}>
                <Input aria-label="To step" width={12} {...num('toStep')} />
              </InlineField>
            </>
          )}
        </InlineFieldRow>
      )}

      {(type === 'series' || type === 'evals' || type === 'heatmap') && (
        <InlineFieldRow>
          <InlineField label="X axis" labelWidth={LABEL} tooltip="Time for time series panels, step for the trend panel and heatmaps">
            <RadioButtonGroup
              options={xAxisOptions}
              value={query.xAxis || (type === 'heatmap' ? 'step' : 'time')}
              onChange={(v) => update({ xAxis: v })}
            />
          </InlineField>
          {type === 'series' && (
            <InlineField label="Min/max" labelWidth={10} tooltip="Add each bucket's minimum and maximum as fields">
              <InlineSwitch aria-label="Min/max" value={Boolean(query.minMax)} onChange={(e) => update({ minMax: e.currentTarget.checked })} />
            </InlineField>
          )}
        </InlineFieldRow>
      )}

      {type === 'heatmap' && (
        <InlineFieldRow>
          <InlineField label="Pass" labelWidth={LABEL}>
            <RadioButtonGroup options={passOptions} value={query.pass || 'forward'} onChange={(v) => update({ pass: v })} />
          </InlineField>
          <InlineField label="Columns" labelWidth={10} tooltip="Step buckets; empty for the panel's width">
            <Input aria-label="Columns" width={12} {...num('maxSteps')} />
          </InlineField>
        </InlineFieldRow>
      )}

      {type === 'ranks' && (
        <InlineFieldRow>
          <InlineField label="Straggler %" labelWidth={LABEL} tooltip="Margin over the median step time past which a rank is flagged">
            <Input aria-label="Straggler %" width={12} placeholder="10" {...num('stragglerPct')} />
          </InlineField>
          <InlineField label="Rows" labelWidth={10} tooltip="One row per rank, or the ranks rolled up by host, the slowest first">
            <RadioButtonGroup
              options={partOptions}
              value={query.part || ''}
              onChange={(v) => update({ part: v === 'hosts' ? 'hosts' : undefined })}
            />
          </InlineField>
        </InlineFieldRow>
      )}

      {type === 'compare' && (
        <>
          <InlineFieldRow>
            <InlineField label="Runs" labelWidth={LABEL} grow tooltip="Runs to compare; or leave empty and name a sweep or project">
              <MultiSelect
                inputId="deepseed-runs"
                aria-label="Runs"
                allowCustomValue
                options={withCurrent(runs, query.runIds || [])}
                value={query.runIds || []}
                onChange={(vs) => update({ runIds: vs.map((v) => v.value as string) })}
              />
            </InlineField>
          </InlineFieldRow>
          <InlineFieldRow>
            <InlineField label="Sweep" labelWidth={LABEL}>
              <Input aria-label="Sweep" width={20} {...text('sweep')} />
            </InlineField>
            <InlineField label="Project" labelWidth={10}>
              <Input aria-label="Project" width={20} {...text('project')} />
            </InlineField>
            <InlineField label="Baseline" labelWidth={10} tooltip="A run id: adds each figure's change against it">
              <Input aria-label="Baseline" width={24} {...text('baseline')} />
            </InlineField>
          </InlineFieldRow>
        </>
      )}

      {type === 'ledger' && (
        <InlineFieldRow>
          <InlineField label="Runs" labelWidth={LABEL} grow tooltip="A column per run; or leave empty for a project's runs, a column per day">
            <MultiSelect
              inputId="deepseed-ledger-runs"
              aria-label="Runs"
              allowCustomValue
              options={withCurrent(runs, query.runIds || [])}
              value={query.runIds || []}
              onChange={(vs) => update({ runIds: vs.length ? vs.map((v) => v.value as string) : undefined })}
            />
          </InlineField>
          <InlineField label="Project" labelWidth={10} tooltip="Without runs: a project, or * or empty for all">
            <Input aria-label="Project" width={20} {...text('project')} />
          </InlineField>
        </InlineFieldRow>
      )}

      {type === 'regression' && (
        <InlineFieldRow>
          <InlineField
            label="Baseline"
            labelWidth={LABEL}
            tooltip="Run ids to compare with, comma-separated; empty: the newest comparable runs of the project"
          >
            <Input aria-label="Baseline" width={40} {...text('baseline')} />
          </InlineField>
        </InlineFieldRow>
      )}

      {type === 'runs' && (
        <InlineFieldRow>
          <InlineField label="Project" labelWidth={LABEL}>
            <Input aria-label="Project" width={20} {...text('project')} />
          </InlineField>
          <InlineField label="Sweep" labelWidth={8}>
            <Input aria-label="Sweep" width={20} {...text('sweep')} />
          </InlineField>
          <InlineField label="Tag" labelWidth={6}>
            <Input aria-label="Tag" width={16} {...text('tag')} />
          </InlineField>
          <InlineField label="Status" labelWidth={8}>
            <Input aria-label="Status" width={14} placeholder="running" {...text('status')} />
          </InlineField>
        </InlineFieldRow>
      )}

      {type === 'annotations' && (
        <InlineFieldRow>
          <InlineField label="Event types" labelWidth={LABEL} grow tooltip="Only these events; empty for all of them">
            <MultiSelect
              inputId="deepseed-event-types"
              aria-label="Event types"
              allowCustomValue
              placeholder="all"
              options={withCurrent(EVENT_TYPES, query.eventTypes || [])}
              value={query.eventTypes || []}
              onChange={(vs) => update({ eventTypes: vs.length ? vs.map((v) => v.value as string) : undefined })}
            />
          </InlineField>
        </InlineFieldRow>
      )}

      {(type === 'jobs' || type === 'job_counts' || type === 'quotas' || type === 'sweep_trials') && (
        <InlineFieldRow>
          <InlineField label="Project" labelWidth={LABEL} tooltip="A project, or * or empty for all">
            <Input aria-label="Project" width={20} {...text('project')} />
          </InlineField>
          {type !== 'quotas' && (
            <InlineField label="Sweep" labelWidth={8} tooltip={type === 'sweep_trials' ? 'A sweep id; * or empty for the newest' : 'A sweep id, or * or empty for all'}>
              <Input aria-label="Sweep" width={20} {...text('sweep')} />
            </InlineField>
          )}
          {(type === 'jobs' || type === 'job_counts') && (
            <InlineField label="State" labelWidth={8}>
              <Select
                inputId="deepseed-job-state"
                aria-label="State"
                width={16}
                allowCustomValue
                isClearable
                placeholder="all"
                options={withCurrent(
                  JOB_STATES.map((s) => ({ value: s, label: s })),
                  [query.state]
                )}
                value={query.state || null}
                onChange={(v) => update({ state: v?.value || undefined })}
              />
            </InlineField>
          )}
          {type === 'sweep_trials' && (
            <>
              <InlineField label="Metric" labelWidth={8} tooltip="val_accuracy, val_loss, …; empty for the sweep's own">
                <Input aria-label="Metric" width={18} {...text('metric')} />
              </InlineField>
              <InlineField label="Goal" labelWidth={6}>
                <RadioButtonGroup
                  options={goalOptions}
                  value={query.goal || ''}
                  onChange={(v) => update({ goal: v || undefined })}
                />
              </InlineField>
            </>
          )}
        </InlineFieldRow>
      )}

      {type === 'gpus' && (
        <InlineFieldRow>
          <InlineField label="Host" labelWidth={LABEL}>
            <Input aria-label="Host" width={24} {...text('host')} />
          </InlineField>
          <InlineField label="GPU" labelWidth={6} tooltip="A GPU index; empty for all">
            <Input aria-label="GPU" width={10} {...text('gpu')} />
          </InlineField>
        </InlineFieldRow>
      )}
    </>
  );
}
