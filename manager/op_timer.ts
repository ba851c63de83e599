/**
 * Per-phase timing of one operation, reported to the metrics and the debug log.
 *
 * @module
 */
import type { Phase, PhaseRecorder } from "../lib/metrics.ts";
import type { Logger } from "../lib/log.ts";
import { ApiError } from "../api/schema.ts";

/**
 * The phases of one operation: durations summed per phase (a phase may run more
 * than once, e.g. two state writes), reported to the metrics and the debug log.
 */
export class OpTimer {
  readonly started = performance.now();
  readonly phases: Partial<Record<Phase, number>> = {};

  add(phase: Phase, ms: number): void {
    this.phases[phase] = (this.phases[phase] ?? 0) + ms;
  }

  /** Times an async step. */
  async time<T>(phase: Phase, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.add(phase, performance.now() - t0);
    }
  }

  /** Times a synchronous step (the SQLite writes). */
  sync<T>(phase: Phase, fn: () => T): T {
    const t0 = performance.now();
    try {
      return fn();
    } finally {
      this.add(phase, performance.now() - t0);
    }
  }

  /** Marks the end of a lock wait that began at `since`. */
  waited(since: number): void {
    this.add("queue_wait", performance.now() - since);
  }
}

const round2 = (ms: number) => Math.round(ms * 100) / 100;

/** Runs one timed operation: reports its phases and result to `metrics` and the debug log. */
export async function timed<T>(
  o: { metrics: PhaseRecorder | undefined; log: Logger },
  op: string,
  key: string,
  fn: (t: OpTimer) => Promise<T>,
): Promise<T> {
  const t = new OpTimer();
  let result = "ok";
  try {
    return await fn(t);
  } catch (err) {
    result = err instanceof ApiError ? err.code : "internal";
    throw err;
  } finally {
    const total = performance.now() - t.started;
    if (o.metrics) {
      for (const [phase, ms] of Object.entries(t.phases)) {
        o.metrics.phase(op, phase as Phase, ms);
      }
      o.metrics.operation(op, result, total);
    }
    const phases: Record<string, number> = {};
    for (const [phase, ms] of Object.entries(t.phases)) phases[phase] = round2(ms);
    o.log.debug(`${op.toUpperCase()} phases (ms)`, {
      key,
      result,
      totalMs: round2(total),
      ...phases,
    });
  }
}
