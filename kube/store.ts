/**
 * The objects of one kind, by key (`namespace/name`, or `name` for a cluster-scoped
 * kind) and by secondary indexes (an index maps a value, such as a pod IP or a
 * namespace, to the keys of the objects that have it). One key per index value is
 * kept as a string, more as a Set: most values (a pod's IP) belong to one object, and
 * 30,000 one-element Sets would cost megabytes.
 *
 * @module
 */

/** Index name → the values an object is found under in that index. */
export type Indexers<T> = Record<string, (obj: T) => readonly string[]>;

/** One change: `[undefined, new]` added, `[old, new]` updated, `[old, undefined]` deleted. */
export type Change<T> = [T | undefined, T | undefined];

/** Objects by key, with secondary indexes. */
export class Store<T> {
  readonly #keyOf: (obj: T) => string;
  readonly #indexers: Indexers<T>;
  readonly #items = new Map<string, T>();
  readonly #indexes = new Map<string, Map<string, string | Set<string>>>();

  constructor(keyOf: (obj: T) => string, indexers: Indexers<T> = {}) {
    this.#keyOf = keyOf;
    this.#indexers = indexers;
    for (const name of Object.keys(indexers)) this.#indexes.set(name, new Map());
  }

  /** How many objects it holds. */
  get size(): number {
    return this.#items.size;
  }

  /** The key of `obj`. */
  keyOf(obj: T): string {
    return this.#keyOf(obj);
  }

  /** The object with `key`. */
  get(key: string): T | undefined {
    return this.#items.get(key);
  }

  /** Every object. */
  values(): IterableIterator<T> {
    return this.#items.values();
  }

  /** The objects found under `value` in the index `name` (unknown index: an error). */
  byIndex(name: string, value: string): T[] {
    const index = this.#indexes.get(name);
    if (index === undefined) throw new Error(`The store has no index "${name}"`);
    const keys = index.get(value);
    if (keys === undefined) return [];
    if (typeof keys === "string") return [this.#items.get(keys)!];
    return [...keys].map((k) => this.#items.get(k)!);
  }

  /** The values of the index `name` (every IP, every namespace, …). */
  indexValues(name: string): string[] {
    return [...(this.#indexes.get(name)?.keys() ?? [])];
  }

  /** Puts `obj` in (replacing the one with its key); returns the one it replaced. */
  upsert(obj: T): T | undefined {
    const key = this.#keyOf(obj);
    const old = this.#items.get(key);
    if (old !== undefined) this.#unindex(key, old);
    this.#items.set(key, obj);
    this.#index(key, obj);
    return old;
  }

  /** Takes the object with `key` out; returns it. */
  remove(key: string): T | undefined {
    const old = this.#items.get(key);
    if (old === undefined) return undefined;
    this.#unindex(key, old);
    this.#items.delete(key);
    return old;
  }

  /**
   * Makes the store hold exactly `objs` (a fresh list), and returns what changed: an
   * object whose key is new is added, one `changed(old, new)` says differs is updated
   * (the others are replaced silently), and one missing from `objs` is deleted.
   */
  replace(objs: Iterable<T>, changed: (old: T, cur: T) => boolean): Change<T>[] {
    const changes: Change<T>[] = [];
    const seen = new Set<string>();
    for (const obj of objs) {
      const key = this.#keyOf(obj);
      seen.add(key);
      const old = this.upsert(obj);
      if (old === undefined) changes.push([undefined, obj]);
      else if (changed(old, obj)) changes.push([old, obj]);
    }
    for (const [key, old] of [...this.#items]) {
      if (seen.has(key)) continue;
      this.remove(key);
      changes.push([old, undefined]);
    }
    return changes;
  }

  #index(key: string, obj: T): void {
    for (const [name, fn] of Object.entries(this.#indexers)) {
      const index = this.#indexes.get(name)!;
      for (const value of fn(obj)) {
        const cur = index.get(value);
        if (cur === undefined) index.set(value, key);
        else if (typeof cur === "string") {
          if (cur !== key) index.set(value, new Set([cur, key]));
        } else cur.add(key);
      }
    }
  }

  #unindex(key: string, obj: T): void {
    for (const [name, fn] of Object.entries(this.#indexers)) {
      const index = this.#indexes.get(name)!;
      for (const value of fn(obj)) {
        const cur = index.get(value);
        if (cur === undefined) continue;
        if (typeof cur === "string") {
          if (cur === key) index.delete(value);
        } else {
          cur.delete(key);
          if (cur.size === 1) index.set(value, [...cur][0]);
          else if (cur.size === 0) index.delete(value);
        }
      }
    }
  }
}
