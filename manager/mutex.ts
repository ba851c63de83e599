/**
 * A keyed async mutex: callers holding different keys run in parallel, callers
 * of one key run one at a time in arrival order. Nothing is held across keys,
 * so a slow call under one key never blocks another.
 *
 * @module
 */

/** Whether the work under a {@linkcode KeyedMutex} moves: what the agent's liveness reads. */
export interface LockProgress {
  /** Keys held or waited for now. */
  busy: number;
  /** When a key was last taken or released (`performance.now()` ms; its creation before any). */
  movedAt: number;
}

/** A keyed async mutex. */
export class KeyedMutex {
  readonly #tails = new Map<string, Promise<void>>();
  readonly #now: () => number;
  #movedAt: number;

  /** `now`: the monotonic clock progress is read on (tests move it). */
  constructor(now: () => number = () => performance.now()) {
    this.#now = now;
    this.#movedAt = now();
  }

  /** Runs `fn` holding `key`; releases it when `fn` settles. */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = prev.then(() => mine);
    this.#tails.set(key, tail);
    await prev;
    this.#movedAt = this.#now();
    try {
      return await fn();
    } finally {
      this.#movedAt = this.#now();
      release();
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    }
  }

  /**
   * Whether the work moves: how many keys are held or waited for, and when one was last
   * taken or released. Keys held with none moving for long is a wedge (a lock never
   * released, a call that never settles), whatever each operation's own deadlines say.
   */
  progress(): LockProgress {
    return { busy: this.#tails.size, movedAt: this.#movedAt };
  }

  /** Runs `fn` holding every key of `keys` (taken in sorted order, so never a deadlock). */
  runAll<T>(keys: string[], fn: () => Promise<T>): Promise<T> {
    const sorted = [...new Set(keys)].sort();
    const go = (i: number): Promise<T> =>
      i === sorted.length ? fn() : this.run(sorted[i], () => go(i + 1));
    return go(0);
  }

  /** Whether anyone holds or waits for `key`. */
  busy(key: string): boolean {
    return this.#tails.has(key);
  }

  /** How many keys are held. */
  get size(): number {
    return this.#tails.size;
  }
}
