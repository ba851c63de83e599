/**
 * The bench's figures: nearest-rank percentiles of millisecond samples and the one
 * line each series prints as.
 *
 * @module
 */

/** Percentile (nearest rank) of `xs` in ms. */
export function pct(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

/** A series summarised, rounded to 0.1. */
export interface Stats {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  min: number;
  max: number;
}

/** Summarises a series of samples. */
export function stats(xs: number[]): Stats {
  const r = (v: number) => Math.round(v * 10) / 10;
  return {
    n: xs.length,
    p50: r(pct(xs, 50)),
    p90: r(pct(xs, 90)),
    p99: r(pct(xs, 99)),
    min: r(Math.min(...xs)),
    max: r(Math.max(...xs)),
  };
}

/** One series as the report prints it. */
export const fmt = (s: Stats): string =>
  `p50 ${s.p50.toFixed(1).padStart(6)}  p90 ${s.p90.toFixed(1).padStart(6)}  p99 ${
    s.p99.toFixed(1).padStart(6)
  }  (n=${s.n}, min ${s.min.toFixed(1)}, max ${s.max.toFixed(1)}) ms`;

/** A goal's verdict as printed. */
export const verdict = (ok: boolean): string => (ok ? "met" : "MISSED");

/** kB as MB with one decimal. */
export const mb = (kb: number): string => (kb / 1024).toFixed(1);
