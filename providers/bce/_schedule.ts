/**
 * When the BCE provider's pool pass runs: every `baseMs` while something
 * changes, doubling up to `idleMs` while nothing does, each period jittered,
 * never two passes closer than `minGapMs` (even when asked for one sooner).
 *
 * Each pass lists ENIs once, so this is what bounds the API calls a node makes
 * at steady state: one list per `idleMs` (5 min by default, ±20 %).
 *
 * @module
 */

/** Options of {@linkcode PassScheduler}. */
export interface PassSchedulerOptions {
  /** The period while something changes. */
  baseMs: number;
  /** The longest period, reached by doubling while nothing changes. */
  idleMs: number;
  /** The shortest gap between the starts of two passes. */
  minGapMs: number;
  /** Each period is multiplied by a random factor in [1 - jitter, 1 + jitter]. */
  jitter: number;
  random?: () => number;
  /** One pass; resolves to whether anything changed. */
  run(): Promise<boolean>;
  /** Called when a pass throws (the pass counts as "nothing changed": back off). */
  onError(err: unknown): void;
}

/** Runs the pool pass on its schedule. */
export class PassScheduler {
  #o: PassSchedulerOptions;
  #random: () => number;
  #interval: number;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #dueAt = 0;
  #running: Promise<void> | null = null;
  /** Set from the first line of a pass (before `#running` is assigned). */
  #busy = false;
  #kicked = false;
  #lastStart = -Infinity;
  #stopped = false;
  #passes = 0;

  constructor(opts: PassSchedulerOptions) {
    this.#o = opts;
    this.#random = opts.random ?? Math.random;
    this.#interval = opts.baseMs;
  }

  /** Passes started so far. */
  get passes(): number {
    return this.#passes;
  }

  /** The current (unjittered) period. */
  get intervalMs(): number {
    return this.#interval;
  }

  /** Milliseconds until the next pass, null while one runs or when stopped. */
  get nextInMs(): number | null {
    return this.#timer === null ? null : Math.max(0, this.#dueAt - Date.now());
  }

  /** Starts: the first pass right away. */
  start(): void {
    if (this.#stopped || this.#timer !== null || this.#busy) return;
    this.#at(0);
  }

  /** Asks for a pass soon (an allocation emptied the pool): at once, or when the gap allows. */
  kick(): void {
    if (this.#stopped) return;
    this.#interval = this.#o.baseMs;
    if (this.#busy) {
      this.#kicked = true;
      return;
    }
    const wait = Math.max(0, this.#lastStart + this.#o.minGapMs - Date.now());
    if (this.#timer === null || this.#dueAt > Date.now() + wait) this.#at(wait);
  }

  /** Stops and waits for a running pass. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#running;
  }

  #jittered(ms: number): number {
    const j = this.#o.jitter;
    return ms * (1 - j + 2 * j * this.#random());
  }

  #at(ms: number): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#dueAt = Date.now() + ms;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#running = this.#fire().finally(() => {
        this.#running = null;
      });
    }, ms);
  }

  async #fire(): Promise<void> {
    this.#busy = true;
    this.#lastStart = Date.now();
    this.#passes++;
    let changed = false;
    try {
      changed = await this.#o.run();
    } catch (err) {
      this.#o.onError(err);
    } finally {
      this.#busy = false;
    }
    if (this.#stopped) return;
    if (this.#kicked) {
      this.#kicked = false;
      this.#interval = this.#o.baseMs;
      this.#at(Math.max(0, this.#lastStart + this.#o.minGapMs - Date.now()));
      return;
    }
    this.#interval = changed ? this.#o.baseMs : Math.min(this.#o.idleMs, this.#interval * 2);
    this.#at(this.#jittered(this.#interval));
  }
}
