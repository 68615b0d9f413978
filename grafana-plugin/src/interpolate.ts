import { ScopedVars } from '@grafana/data';

import { DeepSeedQuery } from './types';

export type Replace = (value: string, scopedVars: ScopedVars, format?: string) => string;

/**
 * Fields Grafana owns: they name the query and its data source, never a
 * value a user picks, so they are left as written.
 */
const OWN_FIELDS = new Set(['refId', 'datasource', 'key', 'queryType', 'hide']);

/**
 * interpolateQuery replaces template variables in every string field of a
 * query, whatever its name, so a field added to the query model is
 * interpolated without a change here. A list of strings (runIds, metrics,
 * eventTypes, …) expands a multi-value variable into one entry per value;
 * nested objects are walked the same way. Numbers and booleans are kept.
 */
export function interpolateQuery(query: DeepSeedQuery, scopedVars: ScopedVars, replace: Replace): DeepSeedQuery {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(query)) {
    out[key] = OWN_FIELDS.has(key) ? value : interpolateValue(value, scopedVars, replace);
  }
  return out as unknown as DeepSeedQuery;
}

function interpolateValue(value: unknown, scopedVars: ScopedVars, replace: Replace): unknown {
  if (typeof value === 'string') {
    return replace(value, scopedVars);
  }
  if (Array.isArray(value)) {
    return value.flatMap((v) => {
      if (typeof v !== 'string') {
        return [interpolateValue(v, scopedVars, replace)];
      }
      return replace(v, scopedVars, 'csv')
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s !== '');
    });
  }
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      out[k] = interpolateValue(v, scopedVars, replace);
    }
    return out;
  }
  return value;
}

/** unresolvedVariables lists the $name, ${name} and [[name]] references left in any string of a query. */
export function unresolvedVariables(query: unknown): string[] {
  const found: string[] = [];
  const walk = (v: unknown) => {
    if (typeof v === 'string') {
      for (const m of v.matchAll(/\$\{?\w+|\[\[\w+/g)) {
        found.push(m[0]);
      }
    } else if (Array.isArray(v)) {
      v.forEach(walk);
    } else if (v !== null && typeof v === 'object') {
      Object.values(v).forEach(walk);
    }
  };
  walk(query);
  return found;
}
