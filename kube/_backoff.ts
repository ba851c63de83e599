/**
 * Exponential backoff with jitter for the list and watch loop, as client-go's
 * reflector does it: the first wait is `initialMs`, each failure doubles it up to
 * `maxMs`, each wait is stretched by up to `jitter` of itself at random (so the
 * agents of a whole cluster do not come back at the same instant after an API
 * server restart), and a stretch of `resetMs` without a failure starts again from
 * `initialMs`.
 *
 * @module
 */

/** How {@linkcode Backoff} grows. */
export interface BackoffOptions {
  /** The first wait (default 800 ms). */
  initialMs?: number;
  /** The longest wait before jitter (default 30 s). */
  maxMs?: number;
  /** A failure this long after the previous one starts from `initialMs` again (default 2 min). */
  resetMs?: number;
  /** Each wait is `d * (1 + jitter * random())` (default 1). */
  jitter?: number;
  /** A source of [0, 1) (default `Math.random`). */
  random?: () => number;
  /** The clock in ms (default `Date.now`). */
  now?: () => number;
}

/** The wait before the next try, growing with each failure. */
export class Backoff {
  readonly #initial: number;
  readonly #max: number;
  readonly #reset: number;
  readonly #jitter: number;
  readonly #random: () => number;
  readonly #now: () => number;
  #current = 0;
  #last = -Infinity;

  constructor(o: BackoffOptions = {}) {
    this.#initial = o.initialMs ?? 800;
    this.#max = o.maxMs ?? 30_000;
    this.#reset = o.resetMs ?? 120_000;
    this.#jitter = o.jitter ?? 1;
    this.#random = o.random ?? Math.random;
    this.#now = o.now ?? Date.now;
  }

  /** The wait after one more failure, in ms. */
  next(): number {
    const now = this.#now();
    if (this.#current === 0 || now - this.#last >= this.#reset) this.#current = this.#initial;
    else this.#current = Math.min(this.#current * 2, this.#max);
    this.#last = now;
    return Math.round(this.#current * (1 + this.#jitter * this.#random()));
  }

  /** Forgets the failures so far (after a success). */
  reset(): void {
    this.#current = 0;
  }
}
