/**
 * A list-and-watch cache of one kind of object, the way client-go's reflector and
 * informer work (kubernetes/kubernetes `staging/src/k8s.io/client-go/tools/cache`, and
 * the "API Concepts" page for the wire format).
 *
 * Why one file: the loop, the list, the watch and the application of one event are one
 * state machine sharing the store, the resourceVersion, the backoff and the counters;
 * split, each part would reach into the others' state.
 *
 * The steps:
 *
 * 1. **List**; the list's `resourceVersion` is the point the whole list is consistent
 *    at. The store becomes exactly the list: handlers hear an add for a new object, an
 *    update for one whose resourceVersion changed, a delete for one that is gone; an
 *    object that did not change is not announced. Which list, as the reflector's
 *    `relistResourceVersion` chooses:
 *    - the **first** asks `resourceVersion=0` (any state, served from the API server's
 *      watch cache: no etcd read; the cache ignores `limit` and answers with the whole
 *      collection, which is read item by item, kube/_list_body.ts). A server without a
 *      watch cache pages it from etcd (`limit`, `continue`, the later pages without
 *      `resourceVersion`); later lists then page too;
 *    - after a watch's **410 Gone** it asks the last resourceVersion seen, without
 *      `limit`: "not older than" that, from the watch cache, never back in time (paged,
 *      on a server without a watch cache, it asks `resourceVersion=""` at once: an exact
 *      read of a compacted version would be Gone too);
 *    - after a list's own 410 (an expired `continue` token, a version compacted away) or
 *      a "too large resource version", `resourceVersion=""` in pages: the latest, a
 *      consistent (quorum) read.
 * 2. **Watch** from that resourceVersion (`watch=1`, `allowWatchBookmarks=true`, a
 *    server-side `timeoutSeconds` chosen at random in [w, 2w) to spread the agents'
 *    re-watches); each event moves the resourceVersion on, and so does a bookmark. When
 *    the server ends the watch (its timeout) the cache watches again from the last
 *    resourceVersion at once; a watch that ends **within a second with no event** is a
 *    failure (client-go: "very short watch"), retried after a backoff (4.), not in a loop.
 * 3. **A silent watch** is taken for dead. The API server sends each watch a BOOKMARK
 *    about every minute (`defaultBookmarkFrequency` in the apiserver's cacher, whether
 *    or not there were events; and 2 s before the watch's timeout), so a watch that
 *    hears nothing for two bookmark periods (`bookmarkSeconds`, default 60) is on a dead
 *    connection (a load balancer's failover, a NAT's timeout: no FIN, no RST): the cache
 *    drops the connection (with HTTP/2 every request would queue on it) and watches
 *    again. A server that sends no bookmarks (no watch cache; an older or another
 *    server) is found out when a second watch in a row, on a fresh connection, hears
 *    nothing for two periods either: from then on a watch is taken for dead only when
 *    silent past its own timeout plus `watchGraceMs` (330–630 s by default; lower
 *    `watchTimeoutSeconds` there), until a bookmark arrives.
 * 4. **410 Gone** (an HTTP 410 when the watch starts, an `ERROR` event with a Status of
 *    code 410 in the stream, or an expired `continue` token) means the resourceVersion
 *    is older than the server keeps: list again (step 1, which announces only the
 *    differences).
 * 5. **Any other failure** (no connection, a 5xx, a cut stream, a silent one, a very
 *    short one) waits with exponential backoff and jitter, then watches again from the
 *    last resourceVersion. Never a poll: between events nothing runs but the open stream
 *    and its silence timer.
 *
 * Every list item and watch event is parsed through a schema; a malformed one is
 * logged (the first ten, then every thousandth), counted and skipped. (A NetworkPolicy
 * is never skipped for its spec: its schema keeps one it cannot read, failing closed;
 * see kube/objects.ts. Skipping it would leave the pods it selects open.) A Deno
 * permission error stops the cache (it would fail the same way forever) with the
 * reason in its stats.
 *
 * Handlers run synchronously, in event order, after the store has changed; one that
 * throws is logged and the others still run.
 *
 * @module
 */
import { Backoff, type BackoffOptions } from "./_backoff.ts";
import { lines } from "./_lines.ts";
import { type Change, Store } from "./store.ts";
import { type KubeObject, objectKey, type ResourceKind } from "./kind.ts";
import { KubeApiError, type KubeClient, KubeRequestError } from "./client.ts";
import { BookmarkSchema, ListSchema, StatusSchema, WatchEventSchema } from "./wire.ts";
import { sleep } from "../lib/async.ts";
import { type Logger, nullLogger } from "../lib/log.ts";

export type { KubeObject, ResourceKind };

/** Hears each change: `(undefined, new)` an add, `(old, new)` an update, `(old, undefined)` a delete. */
export type Handler<T> = (old: T | undefined, cur: T | undefined) => void;

/** A cache's counters, for metrics and status. */
export interface InformerStats {
  resource: string;
  /** The first full list is done. */
  synced: boolean;
  /** Objects held. */
  objects: number;
  /** Lists done in all (pages not counted). */
  lists: number;
  /** Lists after the first (a 410, an expired continue token). */
  relists: number;
  /** Watches started in all. */
  watches: number;
  /** Watches started other than right after a list (a timeout, a failure). */
  watchRestarts: number;
  /** Object events applied (ADDED, MODIFIED, DELETED). */
  events: number;
  /** Bookmarks received. */
  bookmarks: number;
  /**
   * Whether the server sends watch bookmarks: `unknown` until one arrives (`seen`) or a
   * second watch in a row heard nothing for two bookmark periods (`none`: a silent
   * watch is then noticed only past its timeout).
   */
  bookmarkSupport: BookmarkSupport;
  /** Watches taken for dead because they were silent too long (each one reconnects). */
  silentWatches: number;
  /** Watches that ended within a second with no event (each one a failure). */
  shortWatches: number;
  /** List items and watch lines skipped as malformed. */
  malformed: number;
  /** Failed lists and watches (each followed by a backoff), 410s not counted. */
  errors: number;
  /** When the last watch line was parsed (ms since the epoch), null before any. */
  lastEventAt: number | null;
  /** The resourceVersion the next watch starts from. */
  resourceVersion: string | null;
  /** The last failure, null after a success. */
  lastError: string | null;
  /** Whether it stopped for good (a permission error), rather than retrying. */
  stopped: boolean;
}

/** Whether the server sends watch bookmarks, as far as the cache has seen. */
export type BookmarkSupport = "unknown" | "seen" | "none";

/** How an {@linkcode Informer} lists and watches. */
export interface InformerOptions {
  /** Objects per list page (`limit`, default 500), when the server pages. */
  pageSize?: number;
  /** The watch's server-side timeout is random in [w, 2w) seconds (default 300, client-go's). */
  watchTimeoutSeconds?: number;
  /**
   * How often the server sends each watch a bookmark (default 60 s, kube-apiserver's); a
   * watch silent for twice this is taken for dead.
   */
  bookmarkSeconds?: number;
  /**
   * On a server that sends no bookmarks, a watch silent this long past its timeout is
   * taken for dead (default 30 s).
   */
  watchGraceMs?: number;
  /** A `labelSelector` for list and watch. */
  labelSelector?: string;
  /** A `fieldSelector` for list and watch (`spec.nodeName=n1`). */
  fieldSelector?: string;
  backoff?: BackoffOptions;
  log?: Logger;
  /** A source of [0, 1) for the watch timeout (default `Math.random`). */
  random?: () => number;
  /** The clock in ms (default `Date.now`). */
  now?: () => number;
}

/** Whether `err` says the resourceVersion is no longer served: list again. */
function isGone(err: unknown): boolean {
  if (!(err instanceof KubeApiError)) return false;
  // A server restored from an older backup (or a watch cache behind the version asked)
  // answers a too-new one with 504 (client-go lists again).
  return err.status === 410 ||
    (err.status === 504 && /too large resource version/i.test(err.message));
}

/** A watch that ends sooner than this with no event is a failure (client-go's rule). */
const SHORT_WATCH_MS = 1_000;

/** A watch that ended with nothing, at once: the caller backs off before the next. */
class ShortWatchError extends KubeRequestError {}

/** Where the next list reads from, and how. */
interface ListPlan {
  /** `resourceVersion`: "0" (any, the watch cache), "" (the latest, a quorum read), or one. */
  rv: string;
  /** Whether it asks `limit` (and follows `continue`). */
  paged: boolean;
}

/**
 * The shared cache of one kind. `start()` it once; read it with `get`, `byIndex`,
 * `values`; `subscribe` for changes; `waitSynced` before trusting it; `close()` ends it.
 *
 * @example
 * ```ts
 * const pods = new Informer(client, PODS, { log });
 * pods.start();
 * const stop = pods.subscribe((old, cur) => console.log(old?.metadata.name, cur?.metadata.name));
 * if (!(await pods.waitSynced(30_000))) console.warn("pods not synced yet");
 * console.log(pods.byIndex("ip", "10.0.0.5"));
 * stop();
 * await pods.close();
 * ```
 */
export class Informer<T extends KubeObject> {
  readonly kind: ResourceKind<T>;
  readonly #client: KubeClient;
  readonly #store: Store<T>;
  readonly #handlers = new Set<Handler<T>>();
  readonly #stop = new AbortController();
  readonly #backoff: Backoff;
  readonly #log: Logger;
  readonly #pageSize: number;
  readonly #watchTimeout: number;
  readonly #quietMs: number;
  readonly #graceMs: number;
  readonly #selectors: Record<string, string | undefined>;
  readonly #random: () => number;
  readonly #now: () => number;
  readonly #syncWaiters = new Set<(synced: boolean) => void>();
  #run: Promise<void> | null = null;
  #stats: InformerStats;
  /** The last list with a resourceVersion was Gone or too new: the next asks the latest. */
  #rvUnavailable = false;
  /** The server paged a `resourceVersion=0` list: it has no watch cache; lists page. */
  #paginated = false;
  /** `relistLatest` asked for a list: the watch running ends, the next list is a quorum read. */
  #relistAsked = false;
  /** The watch running, to end it for `relistLatest`. */
  #watchAc: AbortController | null = null;
  /** Told of every list that completes, with its number (`#listsStarted` when it began). */
  readonly #listWaiters = new Set<(n: number) => void>();
  #listsStarted = 0;
  /** Watches in a row that heard nothing for two bookmark periods before any bookmark. */
  #quietBeforeBookmark = 0;

  constructor(client: KubeClient, kind: ResourceKind<T>, o: InformerOptions = {}) {
    this.kind = kind;
    this.#client = client;
    this.#store = new Store<T>(objectKey, kind.indexers ?? {});
    this.#log = (o.log ?? nullLogger).child({ resource: kind.resource });
    this.#backoff = new Backoff(o.backoff);
    this.#pageSize = o.pageSize ?? 500;
    this.#watchTimeout = o.watchTimeoutSeconds ?? 300;
    this.#quietMs = 2 * (o.bookmarkSeconds ?? 60) * 1000;
    this.#graceMs = o.watchGraceMs ?? 30_000;
    this.#selectors = { labelSelector: o.labelSelector, fieldSelector: o.fieldSelector };
    this.#random = o.random ?? Math.random;
    this.#now = o.now ?? Date.now;
    this.#stats = {
      resource: kind.resource,
      synced: false,
      objects: 0,
      lists: 0,
      relists: 0,
      watches: 0,
      watchRestarts: 0,
      events: 0,
      bookmarks: 0,
      bookmarkSupport: "unknown",
      silentWatches: 0,
      shortWatches: 0,
      malformed: 0,
      errors: 0,
      lastEventAt: null,
      resourceVersion: null,
      lastError: null,
      stopped: false,
    };
  }

  /** Starts listing and watching (once; later calls do nothing). */
  start(): void {
    if (this.#run !== null || this.#stop.signal.aborted) return;
    this.#run = this.#loop();
  }

  /** Whether the first full list is in. */
  get synced(): boolean {
    return this.#stats.synced;
  }

  /**
   * Resolves true once the first full list is in, or false after `timeoutMs` (or when
   * the cache closes or stops) without it.
   */
  waitSynced(timeoutMs: number): Promise<boolean> {
    if (this.#stats.synced) return Promise.resolve(true);
    if (this.#stop.signal.aborted || this.#stats.stopped) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = (synced: boolean) => {
        clearTimeout(timer);
        this.#syncWaiters.delete(done);
        resolve(synced);
      };
      const timer = setTimeout(() => done(false), timeoutMs);
      this.#syncWaiters.add(done);
    });
  }

  /** How many objects it holds. */
  get size(): number {
    return this.#store.size;
  }

  /** The object `namespace/name` (or `name` for a cluster-scoped kind). */
  get(key: string): T | undefined {
    return this.#store.get(key);
  }

  /** Every object. */
  values(): IterableIterator<T> {
    return this.#store.values();
  }

  /** The objects under `value` in the index `name` (the kind's `indexers`). */
  byIndex(name: string, value: string): T[] {
    return this.#store.byIndex(name, value);
  }

  /**
   * Calls `handler` for every change from now on, after first replaying the objects
   * already held as adds (unless `replay` is false). Returns the unsubscribe function.
   */
  subscribe(handler: Handler<T>, o: { replay?: boolean } = {}): () => void {
    if (o.replay ?? true) {
      for (const obj of [...this.#store.values()]) this.#call(handler, undefined, obj);
    }
    this.#handlers.add(handler);
    return () => this.#handlers.delete(handler);
  }

  /** A copy of the counters. */
  stats(): InformerStats {
    return { ...this.#stats, objects: this.#store.size };
  }

  /**
   * Lists again now, from the latest state (`resourceVersion=""`, a quorum read), ending
   * the watch running; resolves once that list is in (or the cache stops). What a
   * take-over asks when its first list (`resourceVersion=0`, served from a watch cache
   * that may lag: kubernetes/kubernetes#59848) answered an older state than the one an
   * earlier agent put in place (`agent/policy/_memory.ts`).
   */
  relistLatest(): Promise<void> {
    if (this.#stop.signal.aborted || this.#stats.stopped) return Promise.resolve();
    this.#relistAsked = true;
    this.#rvUnavailable = true;
    const after = this.#listsStarted;
    const done = new Promise<void>((resolve) => {
      const end = () => {
        this.#listWaiters.delete(w);
        this.#stop.signal.removeEventListener("abort", end);
        resolve();
      };
      // A list begun before the request (an older state, perhaps) does not count.
      const w = (n: number) => {
        if (n > after) end();
      };
      this.#listWaiters.add(w);
      this.#stop.signal.addEventListener("abort", end, { once: true });
    });
    this.#watchAc?.abort();
    return done;
  }

  /** Stops listing and watching, and waits until nothing of it runs. */
  async close(): Promise<void> {
    this.#stop.abort();
    for (const w of [...this.#syncWaiters]) w(false);
    await this.#run;
  }

  async #loop(): Promise<void> {
    const signal = this.#stop.signal;
    let needList = true;
    let gonesInARow = 0;
    let afterList = false;
    while (!signal.aborted) {
      let listing = false;
      try {
        if (needList || this.#relistAsked) {
          this.#relistAsked = false;
          listing = true;
          await this.#list(signal);
          listing = false;
          needList = false;
          afterList = true;
        }
        const progressed = await this.#watch(signal, afterList);
        afterList = false;
        if (progressed) gonesInARow = 0;
      } catch (err) {
        if (signal.aborted) break;
        afterList = false;
        // `relistLatest` ended the watch: list at once.
        if (this.#relistAsked) continue;
        if (err instanceof Deno.errors.NotCapable) {
          this.#stats.stopped = true;
          this.#stats.lastError = err.message;
          this.#log.error(
            "The Kubernetes cache stops: enim's permission set does not allow it to reach the API server",
            { server: this.#client.server, error: err },
          );
          for (const w of [...this.#syncWaiters]) w(false);
          return;
        }
        this.#stats.lastError = err instanceof Error ? err.message : String(err);
        if (isGone(err)) {
          needList = true;
          gonesInARow++;
          // A list's own version gone (or too new): the next asks the latest, a quorum
          // read. A watch's: the next asks "not older than" the last one seen.
          if (listing) this.#rvUnavailable = true;
          this.#log.info("The watched resourceVersion is gone; listing again", {
            resourceVersion: this.#stats.resourceVersion,
            error: err,
          });
          // A list whose own resourceVersion is gone at once again: do not spin.
          if (gonesInARow > 1) await sleep(this.#backoff.next(), signal);
          continue;
        }
        this.#stats.errors++;
        const waitMs = this.#backoff.next();
        this.#log.warn("Kubernetes list or watch failed; trying again after a backoff", {
          error: err,
          waitMs,
        });
        await sleep(waitMs, signal);
      }
    }
  }

  /** What the next list asks (the module doc, step 1). */
  #listPlan(): ListPlan {
    if (this.#rvUnavailable) return { rv: "", paged: true };
    const last = this.#stats.resourceVersion;
    if (last === null) return { rv: "0", paged: true };
    if (this.#paginated) return { rv: "", paged: true };
    return { rv: last, paged: false };
  }

  /** Lists every page, then makes the store exactly that list and announces the differences. */
  async #list(signal: AbortSignal): Promise<void> {
    const plan = this.#listPlan();
    const number = ++this.#listsStarted;
    const fresh: T[] = [];
    let cont: string | undefined;
    let rv: string | undefined;
    do {
      // A continued page carries its token alone: the server refuses a resourceVersion
      // with it (client-go's pager clears it too).
      const query = cont !== undefined
        ? { limit: this.#pageSize, continue: cont, ...this.#selectors }
        : {
          resourceVersion: plan.rv || undefined,
          limit: plan.paged ? this.#pageSize : undefined,
          ...this.#selectors,
        };
      const page = await this.#client.list(this.kind.path, { query, signal });
      for await (const item of page.items) {
        const obj = this.kind.schema.safeParse(item);
        if (obj.success) fresh.push(obj.data);
        else this.#malformed("list item", issueText(obj.error.issues));
      }
      const meta = ListSchema.safeParse(page.rest);
      if (!meta.success) {
        throw new KubeRequestError(
          `The list of ${this.kind.resource} is malformed: ${issueText(meta.error.issues)}`,
        );
      }
      rv ??= meta.data.metadata.resourceVersion;
      const next = meta.data.metadata.continue || undefined;
      if (next !== undefined && cont === undefined && plan.rv === "0") this.#paginated = true;
      cont = next;
    } while (cont !== undefined);
    if (!rv) throw new KubeRequestError(`The list of ${this.kind.resource} has no resourceVersion`);
    const changes = this.#store.replace(
      fresh,
      (old, cur) => old.metadata.resourceVersion !== cur.metadata.resourceVersion,
    );
    fresh.length = 0;
    if (this.#stats.lists > 0) this.#stats.relists++;
    this.#stats.lists++;
    this.#stats.resourceVersion = rv;
    this.#stats.lastError = null;
    this.#rvUnavailable = false;
    this.#backoff.reset();
    this.#dispatch(changes);
    for (const w of [...this.#listWaiters]) w(number);
    if (!this.#stats.synced) {
      this.#stats.synced = true;
      this.#log.info("The Kubernetes cache is synced", { objects: this.#store.size });
      for (const w of [...this.#syncWaiters]) w(true);
    }
  }

  /**
   * One watch from the current resourceVersion until the server ends it; returns whether
   * it delivered anything. Throws on a failure (a silent watch, a very short one), and a
   * {@linkcode KubeApiError} for an `ERROR` event (410: list again).
   */
  async #watch(signal: AbortSignal, afterList: boolean): Promise<boolean> {
    const timeoutSeconds = Math.floor(this.#watchTimeout * (1 + this.#random()));
    const ac = new AbortController();
    this.#watchAc = ac;
    if (this.#relistAsked) ac.abort();
    const onStop = () => ac.abort();
    signal.addEventListener("abort", onStop, { once: true });
    if (signal.aborted) ac.abort();
    // Taken before the request: a proxy may hold the headers until the first event.
    const started = this.#now();
    const generation = this.#client.generation;
    // The silence a watch may keep: two bookmark periods, or on a server that sends no
    // bookmarks its own timeout and a grace.
    const fallbackMs = timeoutSeconds * 1000 + this.#graceMs;
    let silentFor = 0;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const onQuiet = () => {
      if (this.#stats.bookmarkSupport === "unknown" && ++this.#quietBeforeBookmark >= 2) {
        // A second watch, on a fresh connection, without a bookmark in two periods:
        // this server sends none. Keep this one, to the fallback limit.
        this.#noBookmarks("a second watch heard nothing for two bookmark periods", fallbackMs);
        timer = setTimeout(onQuiet, Math.max(0, fallbackMs - this.#quietMs));
        return;
      }
      silentFor = this.#stats.bookmarkSupport === "none" ? fallbackMs : this.#quietMs;
      ac.abort();
    };
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(
        onQuiet,
        this.#stats.bookmarkSupport === "none" ? fallbackMs : this.#quietMs,
      );
    };
    arm();
    let progressed = false;
    try {
      this.#stats.watches++;
      if (!afterList) this.#stats.watchRestarts++;
      const res = await this.#client.stream(this.kind.path, {
        watch: 1,
        resourceVersion: this.#stats.resourceVersion ?? undefined,
        allowWatchBookmarks: true,
        timeoutSeconds,
        ...this.#selectors,
      }, ac.signal);
      for await (const line of lines(res.body, ac.signal)) {
        if (this.#apply(line) && !progressed) {
          // A watch that delivers works: the next failure waits from the first step.
          progressed = true;
          this.#backoff.reset();
        }
        // Events still coming two periods into the watch, and no bookmark among them:
        // the connection lives and the server sends none.
        if (this.#stats.bookmarkSupport === "unknown" && this.#now() - started > this.#quietMs) {
          this.#noBookmarks("events came for two bookmark periods without one", fallbackMs);
        }
        // After the line: a bookmark in it changes the limit.
        arm();
      }
      if (!progressed && this.#now() - started < SHORT_WATCH_MS) {
        this.#stats.shortWatches++;
        throw new ShortWatchError(
          `The watch of ${this.kind.resource} ended within a second with no event`,
        );
      }
      this.#stats.lastError = null;
      return progressed;
    } catch (err) {
      if (silentFor > 0 && !signal.aborted) {
        const msg = this.#stats.bookmarkSupport === "none"
          ? `The watch of ${this.kind.resource} was silent for ${silentFor} ms (its timeout ` +
            `and a grace; the server sends no bookmarks)`
          : `The watch of ${this.kind.resource} heard nothing, not even a bookmark, for ` +
            `${silentFor} ms (two bookmark periods)`;
        this.#stats.silentWatches++;
        // The connection is dead: with HTTP/2 the next watch would queue on it.
        this.#client.reconnect(generation, msg);
        throw new KubeRequestError(msg, { cause: err });
      }
      if (err instanceof KubeApiError || err instanceof KubeRequestError || signal.aborted) {
        throw err;
      }
      if (err instanceof Deno.errors.NotCapable) throw err;
      throw new KubeRequestError(
        `The watch of ${this.kind.resource} broke: ${err instanceof Error ? err.message : err}`,
        { cause: err },
      );
    } finally {
      clearTimeout(timer);
      signal.removeEventListener("abort", onStop);
      if (this.#watchAc === ac) this.#watchAc = null;
    }
  }

  /** Marks the server as sending no bookmarks (until one comes), and says so once. */
  #noBookmarks(why: string, watchLimitMs: number): void {
    this.#stats.bookmarkSupport = "none";
    this.#log.warn(
      "The Kubernetes API server sends no watch bookmarks: a dead watch is noticed only once silent past its timeout",
      { why, bookmarkWaitMs: this.#quietMs, watchLimitMs },
    );
  }

  /** Applies one watch line; returns whether it was a well-formed event. Throws for ERROR. */
  #apply(line: string): boolean {
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      this.#malformed("watch line", "not JSON");
      return false;
    }
    const ev = WatchEventSchema.safeParse(raw);
    if (!ev.success) {
      this.#malformed("watch event", issueText(ev.error.issues));
      return false;
    }
    const { type, object } = ev.data;
    if (type === "ERROR") {
      const s = StatusSchema.safeParse(object);
      const code = s.success ? s.data.code ?? 500 : 500;
      const reason = s.success ? s.data.reason : undefined;
      const message = (s.success ? s.data.message : undefined) ?? "no message";
      throw new KubeApiError(
        code,
        reason,
        `The watch of ${this.kind.resource} ended with an error event: ${code}` +
          (reason ? ` ${reason}` : "") + `: ${message}`,
      );
    }
    if (type === "BOOKMARK") {
      const b = BookmarkSchema.safeParse(object);
      if (!b.success) {
        this.#malformed("bookmark", issueText(b.error.issues));
        return false;
      }
      this.#stats.resourceVersion = b.data.metadata.resourceVersion;
      this.#stats.bookmarks++;
      this.#stats.bookmarkSupport = "seen";
      this.#quietBeforeBookmark = 0;
      this.#stats.lastEventAt = this.#now();
      return true;
    }
    const parsed = this.kind.schema.safeParse(object);
    if (!parsed.success) {
      this.#malformed(`${type} event`, issueText(parsed.error.issues));
      return false;
    }
    const obj = parsed.data;
    if (type === "DELETED") {
      const old = this.#store.remove(objectKey(obj));
      if (old !== undefined) this.#dispatch([[obj, undefined]]);
    } else {
      const old = this.#store.upsert(obj);
      const same = old !== undefined &&
        old.metadata.resourceVersion === obj.metadata.resourceVersion;
      if (!same) this.#dispatch([[old, obj]]);
    }
    if (obj.metadata.resourceVersion) this.#stats.resourceVersion = obj.metadata.resourceVersion;
    this.#stats.events++;
    this.#stats.lastEventAt = this.#now();
    return true;
  }

  #malformed(what: string, why: string): void {
    const n = ++this.#stats.malformed;
    if (n <= 10 || n % 1000 === 0) {
      this.#log.warn("Skipped a malformed Kubernetes object", { what, why, malformed: n });
    }
  }

  #dispatch(changes: Change<T>[]): void {
    if (this.#handlers.size === 0) return;
    for (const [old, cur] of changes) {
      for (const h of [...this.#handlers]) this.#call(h, old, cur);
    }
  }

  #call(h: Handler<T>, old: T | undefined, cur: T | undefined): void {
    try {
      h(old, cur);
    } catch (err) {
      this.#log.error("A Kubernetes cache handler failed", { error: err });
    }
  }
}

/** The first issue of a failed parse, as `path: message`. */
function issueText(issues: readonly { path: readonly PropertyKey[]; message: string }[]): string {
  const i = issues[0];
  if (i === undefined) return "invalid";
  const path = i.path.map(String).join(".");
  return path ? `${path}: ${i.message}` : i.message;
}
