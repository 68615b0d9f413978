import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import {
  createTheme,
  DataFrameJSON,
  dataFrameFromJSON,
  FieldType,
  formattedValueToString,
  getDisplayProcessor,
} from '@grafana/data';

// The backend's per-layer heatmap frame for a 26-layer run, exactly as
// Grafana receives it (written by the Go test TestHeatmapFramesReadLikeTheSeed
// against a real server).
function gptHeatmap() {
  const text = readFileSync(join(__dirname, '../pkg/plugin/testdata/heatmap_gpt.golden.jsonc'), 'utf8');
  const json = text
    .split('\n')
    .filter((l) => !l.startsWith('//'))
    .join('\n');
  const resp = JSON.parse(json) as { frames: DataFrameJSON[] };
  return dataFrameFromJSON(resp.frames[0]);
}

// What Grafana's Heatmap panel shows in a cell's tooltip: it copies the
// first row field's config to every cell (rowsToCellsHeatmap), sets the
// panel's cellValues unit and decimals, and prints the cell's value with
// that field's display processor.
function tooltipText(config: object, value: number) {
  const field = {
    name: 'Mean time',
    type: FieldType.number,
    config: { ...config, unit: 'ms', decimals: 3 },
    values: [value],
  };
  const display = getDisplayProcessor({ field, theme: createTheme() });
  return formattedValueToString(display(value));
}

describe('per-layer heatmap frame', () => {
  const frame = gptHeatmap();
  const custom = frame.meta?.custom as { colour_min_ms: number; colour_max_ms: number };

  it('labels columns by step and rows by full layer name', () => {
    expect(frame.meta?.type).toBe('heatmap-rows');
    expect(frame.fields[0].name).toBe('step');
    expect(frame.fields[0].config.displayNameFromDS).toBe('Step');
    expect(frame.fields[0].values.slice(0, 3)).toEqual([1, 2, 3]);
    expect(frame.fields[1].name).toBe('transformer.wte');
    expect(frame.fields[2].name).toBe('transformer.h.0');
    expect(frame.fields[frame.fields.length - 1].name).toBe('transformer.ln_f');
  });

  it('shows every cell its absolute milliseconds, also those beyond the colour range', () => {
    const config = frame.fields[1].config;
    const mapped = (config.mappings?.[0]?.options ?? {}) as Record<string, unknown>;
    let beyond = 0;
    for (const field of frame.fields.slice(1)) {
      for (const v of field.values as number[]) {
        const text = tooltipText(config, v);
        // Cells beyond the range are given values just inside its ends.
        expect(v).toBeGreaterThanOrEqual(custom.colour_min_ms);
        expect(v).toBeLessThanOrEqual(custom.colour_max_ms);
        if (String(v) in mapped) {
          beyond++;
          // The embedding takes 14–16 ms, the final norm 0.05 ms.
          expect(text).toMatch(/^(1[456]\.000|0\.050) ms \((above|below) the colour range\)$/);
        } else {
          expect(text).toBe(`${v.toFixed(3)} ms`);
        }
      }
    }
    expect(beyond).toBe(2 * frame.length);
  });

  it('spreads the transformer blocks over the colour range', () => {
    const first = frame.fields[2].values[0] as number;
    const last = frame.fields[25].values[0] as number;
    expect((last - first) / (custom.colour_max_ms - custom.colour_min_ms)).toBeGreaterThan(0.5);
  });

  // The panel's colour legend prints the smallest and largest cell values
  // with the same display processor: two short labels with the unit.
  it('labels the colour legend with the range ends in ms, not a mapping text', () => {
    const config = frame.fields[1].config;
    const all = frame.fields.slice(1).flatMap((f) => f.values as number[]);
    const lo = tooltipText(config, Math.min(...all));
    const hi = tooltipText(config, Math.max(...all));
    expect(lo).toBe(`${custom.colour_min_ms.toFixed(3)} ms`);
    expect(hi).toBe(`${custom.colour_max_ms.toFixed(3)} ms`);
  });
});
