/**
 * Time in one place: a sleep, a deadline on a promise, and a poll with backoff.
 * Every wait the agent makes (a device to appear, a provider call, an API
 * operation, the node lock) goes through these, with its numbers at the call.
 *
 * @module
 */

/** Waits `ms`, or less when `signal` aborts (then resolves, never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * Waits for `p`, rejecting with `onTimeout()` after `ms` (`p` itself goes on; its
 * outcome is then ignored). No timer outlives the race.
 */
export async function withDeadline<T>(
  p: Promise<T>,
  ms: number,
  onTimeout: () => Error,
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(onTimeout()), ms);
  });
  try {
    return await Promise.race([p, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** How {@linkcode poll} waits between tries. */
export interface PollOptions {
  /** Give up after this long (the last try starts before it). */
  timeoutMs: number;
  /** The first wait between tries. */
  intervalMs: number;
  /** The longest wait between tries (default: `intervalMs`, no backoff); waits double up to it. */
  maxIntervalMs?: number;
  /** Stops polling early (the result is then null). */
  signal?: AbortSignal;
}

/**
 * Runs `attempt` until it returns something other than null or undefined, and
 * returns that; null when `timeoutMs` passed (or `signal` aborted) first.
 */
export async function poll<T>(
  attempt: () => Promise<T | null | undefined>,
  o: PollOptions,
): Promise<T | null> {
  const until = Date.now() + o.timeoutMs;
  for (let wait = o.intervalMs;; wait = Math.min(wait * 2, o.maxIntervalMs ?? o.intervalMs)) {
    const v = await attempt();
    if (v !== null && v !== undefined) return v;
    const left = until - Date.now();
    if (left <= 0 || o.signal?.aborted) return null;
    await sleep(Math.min(wait, left), o.signal);
  }
}

/** At most `size` holders at once; the others wait, first come first served. */
export class Slots {
  #free: number;
  readonly #waiters: (() => void)[] = [];

  constructor(size: number) {
    this.#free = size;
  }

  /** Runs `fn` once a slot is free, and frees it after. */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#free > 0) this.#free--;
    else await new Promise<void>((r) => this.#waiters.push(r));
    try {
      return await fn();
    } finally {
      const next = this.#waiters.shift();
      if (next) next();
      else this.#free++;
    }
  }
}
