import {
  CoreApp,
  CustomVariableSupport,
  DataQueryRequest,
  DataQueryResponse,
  DataSourceInstanceSettings,
  ScopedVars,
} from '@grafana/data';
import { DataSourceWithBackend, getTemplateSrv } from '@grafana/runtime';
import { from, map, Observable } from 'rxjs';

import { VariableQueryEditor } from './components/VariableQueryEditor';
import { interpolateQuery } from './interpolate';
import { normalizeVariableQuery, StoredVariableQuery, variableParams } from './variables';
import { DEFAULT_QUERY, DeepSeedOptions, DeepSeedQuery, Option, QUERY_TYPES, VariableQuery } from './types';

/**
 * DataSource runs every query in the Go backend (QueryData); the browser
 * only interpolates template variables and fetches variable lists through
 * the backend's resources. The read token never reaches the browser.
 */
export class DataSource extends DataSourceWithBackend<DeepSeedQuery, DeepSeedOptions> {
  constructor(instanceSettings: DataSourceInstanceSettings<DeepSeedOptions>) {
    super(instanceSettings);
    this.variables = new DeepSeedVariableSupport(this);
    // An empty object turns on Grafana's standard annotation support: the
    // annotation editor is the query editor and the backend's frames with
    // time, title, text and tags become annotations.
    this.annotations = {
      prepareQuery: (anno) => ({ ...DEFAULT_QUERY, ...(anno.target as DeepSeedQuery), queryType: 'annotations' }),
    };
  }

  getDefaultQuery(_: CoreApp): Partial<DeepSeedQuery> {
    return DEFAULT_QUERY;
  }

  /** Skips hidden queries and those that miss what they need, so a fresh panel shows no error. */
  filterQuery(query: DeepSeedQuery): boolean {
    if (query.hide) {
      return false;
    }
    const info = QUERY_TYPES.find((t) => t.value === query.queryType);
    if (!info) {
      return false;
    }
    if (info.needsRun && !query.runId) {
      return false;
    }
    if (query.queryType === 'series' && !(query.metrics && query.metrics.length)) {
      return false;
    }
    return true;
  }

  /** Grafana calls this for each panel query before it goes to the backend. */
  applyTemplateVariables(query: DeepSeedQuery, scopedVars: ScopedVars): DeepSeedQuery {
    return interpolateQuery(query, scopedVars, (v, sv, fmt) => getTemplateSrv().replace(v, sv, fmt));
  }

  /** Grafana calls this when queries leave a dashboard: Explore, a copied panel, a mixed data source. */
  interpolateVariablesInQueries(queries: DeepSeedQuery[], scopedVars: ScopedVars): DeepSeedQuery[] {
    return queries.map((q) => ({ ...this.applyTemplateVariables(q, scopedVars), datasource: this.getRef() }));
  }

  /** Lists behind template variables and editor pickers. */
  async fetchOptions(kind: string, params: Record<string, string | undefined> = {}): Promise<Option[]> {
    const clean: Record<string, string> = {};
    for (const [k, v] of Object.entries(params)) {
      if (v) {
        clean[k] = getTemplateSrv().replace(v);
      }
    }
    const res = await this.getResource<Option[]>(kind, clean);
    return Array.isArray(res) ? res : [];
  }
}

/**
 * Template variables: projects, runs (by project, sweep, tag, status),
 * sweeps (by project), metrics, ranks, hosts; each the backend resource of
 * the same name.
 */
export class DeepSeedVariableSupport extends CustomVariableSupport<DataSource, VariableQuery> {
  editor = VariableQueryEditor;

  constructor(private readonly datasource: DataSource) {
    super();
  }

  query(request: DataQueryRequest<VariableQuery>): Observable<DataQueryResponse> {
    // Variables saved by the first release name the list `kind`.
    const q = normalizeVariableQuery(request.targets[0] as StoredVariableQuery);
    const params = variableParams(q);
    if (q.resource === 'hosts' || q.resource === 'window') {
      params.from = request.range.from.toISOString();
      params.to = request.range.to.toISOString();
    }
    return from(this.datasource.fetchOptions(q.resource, params)).pipe(map((data) => ({ data })));
  }
}
