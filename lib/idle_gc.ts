/**
 * Major garbage collections at quiet moments, for the agent.
 *
 * Every `ip` spawn leaves native buffers (the child's pipes) behind a small JS
 * wrapper; V8 sees only the wrapper, so with the agent's small, steady heap a
 * major GC comes rarely and the process's RSS climbs by ~100 KB per spawn in
 * between (measured: +0.5 MB per ADD/DEL cycle, 160 → 350 MB over 1000 cycles).
 * A full GC frees all of it. With `--v8-flags=--expose-gc` (set by the enim
 * permission-set runs and the compiled binary), this runs one after `idleMs`
 * without requests (a request arriving first cancels it), and, so a node that is
 * never idle does not grow either, `quietMs` after the response that completes
 * every `everyOps`th request (a request arriving meanwhile waits for it: a few ms
 * on the agent's small heap, once per `everyOps` requests).
 * Without the flag it does nothing.
 *
 * @module
 */

/** Options for {@linkcode IdleGc}. */
export interface IdleGcOptions {
  /** The collector (default `globalThis.gc`, present with `--expose-gc`). */
  gc?: (() => void) | undefined;
  /** Collect after this long without requests (ms, default 2000). */
  idleMs?: number;
  /** Collect at the next quiet moment once this many requests finished (default 50). */
  everyOps?: number;
  /**
   * A quiet moment lasts at least this long (ms, default 50): enough for the last
   * response to be written before the collection pauses the event loop.
   */
  quietMs?: number;
  /** Told how long each collection took (ms). */
  onCollect?: (ms: number) => void;
}

/** Runs a major GC when the agent is idle; see the module doc. */
export class IdleGc {
  readonly #gc: (() => void) | undefined;
  readonly #idleMs: number;
  readonly #everyOps: number;
  readonly #quietMs: number;
  readonly #onCollect: ((ms: number) => void) | undefined;
  #inflight = 0;
  #sinceGc = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #stopped = false;
  #forced = false;
  /** How many collections ran. */
  collections = 0;
  /** How long the last one took (ms). */
  lastMs = 0;

  constructor(opts: IdleGcOptions = {}) {
    this.#gc = "gc" in opts ? opts.gc : (globalThis as { gc?: () => void }).gc;
    this.#idleMs = opts.idleMs ?? 2000;
    this.#everyOps = opts.everyOps ?? 50;
    this.#quietMs = opts.quietMs ?? 50;
    this.#onCollect = opts.onCollect;
  }

  /** Whether a collector is available. */
  get enabled(): boolean {
    return this.#gc !== undefined;
  }

  /**
   * Wraps a request handler so its requests are counted. The wrapper declares its
   * one parameter: `Deno.serve` passes no Request to a handler whose `length` is 0.
   */
  wrap<T, R>(handler: (req: T) => Promise<R>): (req: T) => Promise<R> {
    if (!this.#gc) return handler;
    return async (req: T) => {
      this.#inflight++;
      if (!this.#forced) {
        clearTimeout(this.#timer);
        this.#timer = undefined;
      }
      try {
        return await handler(req);
      } finally {
        this.#inflight--;
        this.#sinceGc++;
        this.#schedule();
      }
    };
  }

  #schedule(): void {
    if (this.#stopped || this.#sinceGc === 0 || this.#forced) return;
    if (this.#sinceGc >= this.#everyOps) {
      // Due: collect shortly after this response, even if requests keep coming
      // (a node that is never idle must not grow without bound).
      clearTimeout(this.#timer);
      this.#forced = true;
      this.#timer = setTimeout(() => this.#collect(), this.#quietMs);
      return;
    }
    if (this.#inflight > 0) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      if (this.#inflight === 0) this.#collect();
    }, this.#idleMs);
  }

  #collect(): void {
    this.#timer = undefined;
    this.#forced = false;
    if (this.#stopped) return;
    this.#sinceGc = 0;
    const t0 = performance.now();
    this.#gc!();
    this.collections++;
    this.lastMs = performance.now() - t0;
    this.#onCollect?.(this.lastMs);
  }

  /** Cancels a pending collection (at shutdown). */
  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }
}
