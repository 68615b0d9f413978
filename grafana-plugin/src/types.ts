import { DataSourceJsonData } from '@grafana/data';
import { DataQuery } from '@grafana/schema';

/** Query types of the DeepSeed data source; the backend's api.PluginQuery. */
export type QueryType =
  | 'runs'
  | 'run_summary'
  | 'run_details'
  | 'run_code'
  | 'series'
  | 'heatmap'
  | 'evals'
  | 'breakdown'
  | 'memory'
  | 'compare'
  | 'ranks'
  | 'gpus'
  | 'annotations'
  | 'alerts'
  | 'jobs'
  | 'job_counts'
  | 'quotas'
  | 'sweep_trials'
  | 'hang_reports'
  | 'consistency'
  | 'regression'
  | 'ledger';

/** One panel query. Field names match api.PluginQuery in the Go backend. */
export interface DeepSeedQuery extends DataQuery {
  queryType?: QueryType;
  project?: string;
  runId?: string;
  runIds?: string[];
  sweep?: string;
  tag?: string;
  status?: string;
  /** compare: the run the others are compared against; regression: pinned baseline runs (comma-separated). */
  baseline?: string;
  metrics?: string[];
  rank?: string;
  xAxis?: 'time' | 'step';
  minMax?: boolean;
  /** series on time: add each point's step, shown in tooltips only. */
  withStep?: boolean;
  fromStep?: number;
  toStep?: number;
  pass?: 'forward' | 'backward';
  maxSteps?: number;
  host?: string;
  gpu?: string;
  stragglerPct?: number;
  /** ranks: hosts (the ranks rolled up by host, the slowest first), bars (the rows of a bar chart of metrics[0]); none: one row per rank. */
  part?: 'hosts' | 'bars';
  /** numeric (run_summary, ranks: one numeric-wide frame for alert rules) or table (gpus: a row per GPU). */
  format?: 'numeric' | 'table';
  /** annotations: only these event types (checkpoint, overflow, restart, eval, …); none: all. */
  eventTypes?: string[];
  /** alerts: only this kind (one of docs/alerts.md: non_finite, overflow_storm, loss_spike, idle_gpu, stalled, rank_stopped, data_stall, straggler, hang, regression, drift); none: all. */
  alertKind?: string;
  /** jobs, job_counts: queued, running, finished, failed, cancelled or lost; '*' or none: all. */
  state?: string;
  /** sweep_trials: the eval metric trials are ranked by (val_accuracy, val_loss, …). */
  metric?: string;
  /** sweep_trials: min or max; none: the sweep's own, or min for a loss. */
  goal?: string;
}

export const DEFAULT_QUERY: Partial<DeepSeedQuery> = {
  queryType: 'series',
  metrics: ['loss'],
  rank: '0',
  xAxis: 'time',
};

export interface QueryTypeInfo {
  value: QueryType;
  label: string;
  description: string;
  /** Whether the query needs one run. */
  needsRun: boolean;
}

export const QUERY_TYPES: QueryTypeInfo[] = [
  { value: 'series', label: 'Series', description: 'Step metrics over time or steps (time series, trend)', needsRun: true },
  { value: 'run_summary', label: 'Run summary', description: 'One row of summary figures (stat panels)', needsRun: true },
  { value: 'run_details', label: 'Run details', description: 'Config, hyper-parameters, command, commit, versions', needsRun: true },
  { value: 'run_code', label: 'Run code', description: 'Entry script and uncommitted git diff, one row per line', needsRun: true },
  { value: 'heatmap', label: 'Layer heatmap', description: 'Per-layer milliseconds, heatmap rows', needsRun: true },
  { value: 'evals', label: 'Evaluations', description: 'Evaluation points to overlay on the loss', needsRun: true },
  { value: 'breakdown', label: 'Compute breakdown', description: 'Steady-state step time by phase (pie)', needsRun: true },
  { value: 'memory', label: 'ZeRO memory', description: 'Memory by part and device beside the measured peak (bars)', needsRun: true },
  { value: 'ranks', label: 'Ranks', description: 'Per-rank step time and stragglers (table, bars)', needsRun: true },
  { value: 'compare', label: 'Compare runs', description: 'Configuration and figures of several runs (table)', needsRun: false },
  { value: 'runs', label: 'Runs', description: 'Runs of a project, sweep or tag (table)', needsRun: false },
  { value: 'gpus', label: 'GPU telemetry', description: 'Per host and GPU time series', needsRun: false },
  { value: 'annotations', label: 'Run events', description: 'Checkpoints, overflow skips, restarts, evaluations', needsRun: false },
  {
    value: 'hang_reports',
    label: 'Hang reports',
    description: "Each rank's newest hang report: step, last collective, stack, its GPUs (table)",
    needsRun: true,
  },
  {
    value: 'consistency',
    label: 'Consistency',
    description: "The invariants a run's numbers break, a sentence each (table)",
    needsRun: true,
  },
  {
    value: 'regression',
    label: 'What changed',
    description: 'The run against its comparable runs: a sentence, then figures, places and what differs (tables)',
    needsRun: true,
  },
  {
    value: 'ledger',
    label: 'Lost GPU-hours',
    description: "Lost GPU-hours by cause, each with how it was computed: a column per run, or per day of a project's runs (table)",
    needsRun: false,
  },
  { value: 'alerts', label: 'Alerts', description: "Open alerts of the server's detectors (table; numeric format for alert rules)", needsRun: false },
  { value: 'jobs', label: 'Jobs', description: 'Jobs of a project, sweep or state, newest first (table)', needsRun: false },
  { value: 'job_counts', label: 'Job counters', description: 'Total, active, done, failed, … (one row, for stat panels)', needsRun: false },
  { value: 'quotas', label: 'GPU quotas', description: 'GPU-hours used per project, the limit as max (bar gauge)', needsRun: false },
  {
    value: 'sweep_trials',
    label: 'Sweep trials',
    description: "A sweep's trials: params beside the final and best eval metric, best first (table)",
    needsRun: false,
  },
];

/** The states of a job; a filter's '*' is all of them. */
export const JOB_STATES = ['queued', 'running', 'finished', 'failed', 'cancelled', 'lost'];

/** Event types the training hook and the query service know; scripts may record others. */
export const EVENT_TYPES: Array<{ value: string; label: string; description: string }> = [
  { value: 'checkpoint', label: 'Checkpoints', description: 'A checkpoint was saved' },
  { value: 'overflow', label: 'Overflow skips', description: 'fp16 overflow: the step was skipped and the loss scale lowered' },
  { value: 'restart', label: 'Restarts', description: 'The run resumed, from a checkpoint or after a failure' },
  { value: 'eval', label: 'Evaluations', description: 'Evaluation points with their figures' },
];

/**
 * Step metrics the query service serves as series (the step table's, api.StepFields, and the
 * per-rank series); users add metrics.NAME. Written by
 * go test ./grafana-plugin/pkg/plugin -run TestTypesListStepMetrics -update
 */
export const STEP_METRICS = [
  'loss',
  'lr',
  'grad_norm',
  'loss_scale',
  'epoch',
  'samples',
  'tokens',
  'throughput_sps',
  'throughput_tps',
  'step_ms',
  'forward_ms',
  'backward_ms',
  'optimizer_ms',
  'comm_ms',
  'comm_exposed_ms',
  'data_ms',
  'gpu_util_pct',
  'gpu_mem_used_gb',
  'gpu_mem_peak_gb',
  'gpu_mem_reserved_gb',
  'cpu_util_pct',
  'tflops',
  'mfu',
  'sync_wait_ms',
  'input_wait_ms',
  'skipped',
  'lateness_ms',
  'straggler_score',
];

/**
 * GPU sample metrics of the gpus query: the metric table's (api.GPUMetrics), written by
 * go test ./grafana-plugin/pkg/plugin -run TestTypesListGPUMetrics -update
 */
export const GPU_METRICS = [
  'util_pct',
  'mem_util_pct',
  'mem_used_bytes',
  'mem_total_bytes',
  'mem_reserved_bytes',
  'power_w',
  'energy_j',
  'temp_c',
  'mem_temp_c',
  'sm_clock_mhz',
  'mem_clock_mhz',
  'pcie_tx_bytes_per_s',
  'pcie_rx_bytes_per_s',
  'pcie_replay_total',
  'nvlink_tx_bytes_per_s',
  'nvlink_rx_bytes_per_s',
  'xid_total',
  'ecc_corrected_total',
  'ecc_uncorrected_total',
  'remapped_rows_total',
  'sm_active_pct',
  'sm_occupancy_pct',
  'tensor_active_pct',
  'gr_engine_active_pct',
];

/** Settings stored in jsonData (visible to the browser). */
export interface DeepSeedOptions extends DataSourceJsonData {
  url?: string;
  timeoutSeconds?: number;
}

/** Settings stored in secureJsonData: only the backend ever reads them. */
export interface DeepSeedSecureOptions {
  token?: string;
}

/**
 * Lists served by the backend's resources, for template variables: the
 * resources of api.VariableQuery in the Go module (api.VariableResources).
 */
export type VariableResource =
  | 'projects'
  | 'runs'
  | 'sweeps'
  | 'metrics'
  | 'ranks'
  | 'hosts'
  | 'window'
  | 'job_projects'
  | 'job_sweeps'
  | 'job_states'
  | 'sweep_metrics'
  | 'sweep_goals';

export const VARIABLE_RESOURCES: VariableResource[] = [
  'projects',
  'runs',
  'sweeps',
  'metrics',
  'ranks',
  'hosts',
  'window',
  'job_projects',
  'job_sweeps',
  'job_states',
  'sweep_metrics',
  'sweep_goals',
];

/**
 * The query of a template variable. Field names match api.VariableQuery in
 * the Go backend, which the provisioned dashboards write.
 */
export interface VariableQuery extends DataQuery {
  resource: VariableResource;
  project?: string;
  sweep?: string;
  tag?: string;
  status?: string;
  run?: string;
  /** window: span, shift, from or to (api.WindowParts). */
  part?: string;
  /** sweep_goals: the metric the goal is for. */
  metric?: string;
  /** runs: offered as baselines, led by the first selected run. */
  baseline?: boolean;
}

export interface Option {
  text: string;
  value: string;
}
