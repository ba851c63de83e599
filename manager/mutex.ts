/**
 * A keyed async mutex: callers holding different keys run in parallel, callers
 * of one key run one at a time in arrival order. Nothing is held across keys,
 * so a slow call under one key never blocks another.
 *
 * @module
 */

/** A keyed async mutex. */
export class KeyedMutex {
  readonly #tails = new Map<string, Promise<void>>();

  /** Runs `fn` holding `key`; releases it when `fn` settles. */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = prev.then(() => mine);
    this.#tails.set(key, tail);
    await prev;
    try {
      return await fn();
    } finally {
      release();
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    }
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
