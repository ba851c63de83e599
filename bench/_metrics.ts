/**
 * The agent's `/metrics` text as the bench reads it: the operations' sums and counts,
 * and the per-phase histograms, differenced between two scrapes.
 *
 * @module
 */

/** `enim_operation_duration_seconds` sum and count per op (all results). */
export function parseOps(text: string): Map<string, { sum: number; count: number }> {
  const out = new Map<string, { sum: number; count: number }>();
  for (const line of text.split("\n")) {
    const m = line.match(/^enim_operation_duration_seconds_(sum|count)\{op="(\w+)",[^}]*\} (\S+)$/);
    if (!m) continue;
    const e = out.get(m[2]) ?? { sum: 0, count: 0 };
    if (m[1] === "sum") e.sum += Number(m[3]);
    else e.count += Number(m[3]);
    out.set(m[2], e);
  }
  return out;
}

/** The phase histograms of one scrape, by `op/phase`. */
export type Hist = Map<string, { buckets: Map<number, number>; sum: number; count: number }>;

/** Parses the `enim_phase_duration_seconds` histograms into `op/phase` → buckets, sum, count. */
export function parsePhases(text: string): Hist {
  const h: Hist = new Map();
  const get = (op: string, phase: string) => {
    const k = `${op}/${phase}`;
    if (!h.has(k)) h.set(k, { buckets: new Map(), sum: 0, count: 0 });
    return h.get(k)!;
  };
  for (const line of text.split("\n")) {
    const m = line.match(/^enim_phase_duration_seconds_(bucket|sum|count)\{([^}]*)\} (\S+)$/);
    if (!m) continue;
    const labels = Object.fromEntries(
      [...m[2].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]),
    );
    const e = get(labels.op, labels.phase);
    const v = Number(m[3]);
    if (m[1] === "bucket") e.buckets.set(labels.le === "+Inf" ? Infinity : Number(labels.le), v);
    else if (m[1] === "sum") e.sum = v;
    else e.count = v;
  }
  return h;
}

/** One phase between two scrapes. */
export interface PhaseFigure {
  count: number;
  p50ms: number;
  meanMs: number;
}

/** Per phase: count, interpolated median (as histogram_quantile does) and mean, of after − before. */
export function phaseDelta(before: Hist, after: Hist): Record<string, PhaseFigure> {
  const out: Record<string, PhaseFigure> = {};
  for (const [k, a] of after) {
    const b = before.get(k);
    const count = a.count - (b?.count ?? 0);
    if (count <= 0) continue;
    const sum = a.sum - (b?.sum ?? 0);
    const les = [...a.buckets.keys()].sort((x, y) => x - y);
    const rank = count / 2;
    let prevLe = 0, prevCum = 0, p50 = NaN;
    for (const le of les) {
      const cum = a.buckets.get(le)! - (b?.buckets.get(le) ?? 0);
      if (cum >= rank) {
        p50 = le === Infinity
          ? prevLe
          : prevLe + (le - prevLe) * ((rank - prevCum) / (cum - prevCum));
        break;
      }
      prevLe = le;
      prevCum = cum;
    }
    out[k] = {
      count,
      p50ms: Math.round(p50 * 1e5) / 100,
      meanMs: Math.round((sum / count) * 1e5) / 100,
    };
  }
  return out;
}

/** Prints the phases, one line each, sorted, with names padded to `pad` after `indent`. */
export function printPhases(phases: Record<string, PhaseFigure>, indent: string, pad: number) {
  for (const [k, v] of Object.entries(phases).sort()) {
    console.log(
      `${indent}${k.padEnd(pad)} p50≈${v.p50ms.toFixed(2).padStart(7)}  mean ${
        v.meanMs.toFixed(2).padStart(7)
      }  (n=${v.count})`,
    );
  }
}
