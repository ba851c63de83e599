/**
 * A Kubernetes API server for tests, speaking the real wire format. It is built from
 * the published API, NOT from enim's code (it imports nothing of kube/): the
 * Kubernetes "API Concepts" page (resourceVersion semantics for list and watch,
 * "Efficient detection of changes", watch bookmarks, "410 Gone responses", "Retrieving
 * large results sets in chunks" with `limit` and `continue`), `metav1.Status` for
 * errors, and the OpenAPI shapes of `v1.Pod`, `v1.Namespace` and
 * `networking.k8s.io/v1.NetworkPolicy` (tests/support/kube_objects.ts makes them).
 *
 * - **HTTPS** with a test PKI (tests/support/kube_pki.ts), a **bearer token** (401
 *   Unauthorized without a valid one; the valid set can change, as a rotation does).
 * - **Resources**: `/api/v1/pods` (and `/api/v1/namespaces/{ns}/pods`,
 *   `/api/v1/namespaces/{ns}/pods/{name}`), `/api/v1/namespaces` (and
 *   `/api/v1/namespaces/{name}`), `/apis/networking.k8s.io/v1/networkpolicies` (and the
 *   namespaced forms). GET only; writes come from the test ({@linkcode KubeApiServer.put},
 *   {@linkcode KubeApiServer.remove}), each taking the next resourceVersion of one
 *   counter shared by every kind, as etcd's revision is.
 * - **List**: the items sorted by namespace/name, `metadata.resourceVersion` the
 *   revision the list is consistent at. As the API server answers, by `resourceVersion`
 *   ("Semantics for get and list" on the API Concepts page) and whether it has a watch
 *   cache (`watchCache`, default on, as kube-apiserver has for these resources):
 *   - absent or `""`: the latest state (a quorum read of etcd), paged by `limit`;
 *     `continue` (an opaque token, with no `resourceVersion` other than `"0"` beside it:
 *     400 otherwise) carries on from the same snapshot; a token older than the
 *     compaction point answers 410 Expired;
 *   - `"0"`: any state; from the watch cache the whole collection in one answer
 *     (`limit` ignored); without one, as `""`;
 *   - `N` without `limit`: not older than N: the latest (from the watch cache when on),
 *     or, when N is newer than the server's revision, 504 "Too large resource version";
 *   - `N` with `limit` (an exact read at N): 410 Expired when compacted, else 400 (not
 *     served here).
 *   Each list's record says where it was served from (`source`: `watchCache` or `etcd`).
 * - **Watch** (`watch=1`): events after `resourceVersion` (absent: from now; `"0"`:
 *   synthetic ADDED events for what exists, then changes), one JSON object per line
 *   over a chunked (HTTP/1.1) or streamed (HTTP/2) body; BOOKMARK events when the
 *   watch asked for them (`allowWatchBookmarks=true`) and the test calls
 *   {@linkcode KubeApiServer.bookmark} (or every `bookmarkEveryMs`); the stream ends
 *   after `timeoutSeconds` (capped by `maxWatchSeconds`). A resourceVersion older than
 *   the compaction point ({@linkcode KubeApiServer.compact}) is answered either with an
 *   HTTP 410 Status or, as the watch cache does, with 200 and a first ERROR event
 *   whose Status has code 410 (`watchGone`); {@linkcode KubeApiServer.expireWatches}
 *   sends that ERROR in the middle of open streams.
 * - **Selectors**: `labelSelector` and `fieldSelector` with `=`, `==` and `!=` terms
 *   (fields `metadata.name`, `metadata.namespace`, `spec.nodeName`); a watch with a
 *   selector sees an object that stops matching as DELETED and one that starts as ADDED.
 * - **Faults**: {@linkcode KubeApiServer.stall} holds requests unanswered; the server is reached through a TCP relay that can cut every
 *   connection ({@linkcode KubeApiServer.cut}), go down (refuse connections,
 *   {@linkcode KubeApiServer.down}) and come back on the same port
 *   ({@linkcode KubeApiServer.up}); {@linkcode KubeApiServer.inject} writes any line
 *   (a malformed event) into open watches; {@linkcode KubeApiServer.blackhole} leaves
 *   every open connection silent without closing it; every request is recorded, with
 *   the bytes of its answer (a watch's growing as it streams).
 *
 * @module
 */
import { TcpRelay as Relay } from "./tcp_relay.ts";
import type { TestPki } from "./kube_pki.ts";

/** The resources served. */
export type Resource = "pods" | "namespaces" | "networkpolicies";

/** A JSON object as the API carries it. */
// deno-lint-ignore no-explicit-any
export type Obj = Record<string, any>;

interface Route {
  resource: Resource;
  kind: string;
  apiVersion: string;
  namespaced: boolean;
}

const ROUTES: Record<Resource, Route> = {
  pods: { resource: "pods", kind: "Pod", apiVersion: "v1", namespaced: true },
  namespaces: { resource: "namespaces", kind: "Namespace", apiVersion: "v1", namespaced: false },
  networkpolicies: {
    resource: "networkpolicies",
    kind: "NetworkPolicy",
    apiVersion: "networking.k8s.io/v1",
    namespaced: true,
  },
};

/** What the request path asks for. */
interface Target {
  route: Route;
  /** The namespace a namespaced collection or object is in (undefined: all namespaces). */
  namespace?: string;
  /** One object's name (a GET of one object). */
  name?: string;
}

/** Parses a request path into its resource, namespace and name (null: not served). */
function target(path: string): Target | null {
  const p = path.replace(/\/+$/, "").split("/").slice(1).map(decodeURIComponent);
  let rest: string[];
  if (p[0] === "api" && p[1] === "v1") rest = p.slice(2);
  else if (p[0] === "apis" && p[1] === "networking.k8s.io" && p[2] === "v1") rest = p.slice(3);
  else return null;
  const core = p[0] === "api";
  const ok = (r: string) => (core ? r === "pods" : r === "networkpolicies");
  if (rest.length === 1 && ok(rest[0])) return { route: ROUTES[rest[0] as Resource] };
  if (core && rest.length === 1 && rest[0] === "namespaces") return { route: ROUTES.namespaces };
  if (core && rest.length === 2 && rest[0] === "namespaces") {
    return { route: ROUTES.namespaces, name: rest[1] };
  }
  if (rest.length >= 3 && rest[0] === "namespaces" && ok(rest[2]) && rest.length <= 4) {
    return { route: ROUTES[rest[2] as Resource], namespace: rest[1], name: rest[3] };
  }
  return null;
}

/** A `metav1.Status` failure. */
export function status(code: number, reason: string, message: string): Obj {
  return {
    kind: "Status",
    apiVersion: "v1",
    metadata: {},
    status: "Failure",
    message,
    reason,
    code,
  };
}

/** One stored change, kept for watches until compacted. */
interface Change {
  rv: number;
  type: "ADDED" | "MODIFIED" | "DELETED";
  key: string;
  obj: Obj;
  prev: Obj | undefined;
}

/** An open watch stream. */
interface Watcher {
  rec: RecordedRequest;
  resource: Resource;
  filter: (o: Obj) => boolean;
  bookmarks: boolean;
  controller: ReadableStreamDefaultController<Uint8Array>;
  closed: boolean;
  timer?: ReturnType<typeof setTimeout>;
}

/** One request as the server saw it. */
export interface RecordedRequest {
  method: string;
  path: string;
  query: Record<string, string>;
  status: number;
  token: string | null;
  watch: boolean;
  /** The answer's body bytes (a watch's so far). */
  bytes: number;
  /** Where a list was served from (undefined: not a list, or refused). */
  source?: "watchCache" | "etcd";
}

/** A list snapshot that `continue` tokens page through. */
interface Snapshot {
  rv: number;
  items: Obj[];
}

/** Options of {@linkcode KubeApiServer.start}. */
export interface KubeApiServerOptions {
  pki: TestPki;
  /** The bearer tokens accepted (default `["test-token"]`). */
  tokens?: string[];
  /** How a watch from a compacted resourceVersion is refused (default `"event"`). */
  watchGone?: "status" | "event";
  /** The longest a watch stays open, whatever it asked (default 1800 s). */
  maxWatchSeconds?: number;
  /** Send a bookmark to every watch that asked, this often (default: only on `bookmark()`). */
  bookmarkEveryMs?: number;
  /**
   * Whether lists may be served from a watch cache (default true): `resourceVersion=0`
   * is then answered whole, whatever `limit` says. Off: every list is paged from etcd.
   */
  watchCache?: boolean;
  /**
   * The loopback address clients reach it at (its relay listens there; default 127.0.0.1):
   * another one (127.0.0.2) stands for an API server at an address of its own. The test
   * PKI's server certificate names 127.0.0.1 to 127.0.0.3.
   */
  hostname?: string;
}

const encoder = new TextEncoder();

/** The test API server (see the module doc). */
export class KubeApiServer implements AsyncDisposable {
  /** `https://127.0.0.1:<port>` (or the address of `hostname`). */
  readonly url: string;
  /** The PKI it serves with (its CA verifies the server). */
  readonly pki: TestPki;
  /** Every request, in order. */
  readonly requests: RecordedRequest[] = [];
  /** The tokens accepted now. */
  tokens: Set<string>;
  /** Called with each request before it is answered (a test's hook). */
  beforeRequest: ((r: RecordedRequest) => void) | null = null;
  /** How a watch from a compacted resourceVersion is refused. */
  watchGone: "status" | "event";

  #rv = 1000;
  #compacted = 0;
  readonly #objects: Record<Resource, Map<string, Obj>> = {
    pods: new Map(),
    namespaces: new Map(),
    networkpolicies: new Map(),
  };
  readonly #history: Record<Resource, Change[]> = { pods: [], namespaces: [], networkpolicies: [] };
  readonly #watchers = new Set<Watcher>();
  readonly #snapshots = new Map<string, Snapshot>();
  /** The lists of a lagging watch cache (`lagCache`), by resource. */
  readonly #lagging = new Map<Resource, Snapshot>();
  readonly #maxWatchSeconds: number;
  readonly #watchCache: boolean;
  readonly #server: Deno.HttpServer;
  readonly #relay: Relay;
  readonly #bookmarkTimer: ReturnType<typeof setInterval> | undefined;
  #uid = 0;
  #stalled: (() => void)[] | null = null;

  private constructor(o: KubeApiServerOptions, server: Deno.HttpServer, relay: Relay) {
    this.pki = o.pki;
    this.tokens = new Set(o.tokens ?? ["test-token"]);
    this.watchGone = o.watchGone ?? "event";
    this.#maxWatchSeconds = o.maxWatchSeconds ?? 1800;
    this.#watchCache = o.watchCache ?? true;
    this.#server = server;
    this.#relay = relay;
    this.url = `https://${relay.hostname}:${relay.port}`;
    if (o.bookmarkEveryMs !== undefined) {
      this.#bookmarkTimer = setInterval(() => this.bookmark(), o.bookmarkEveryMs);
    }
  }

  /** Starts the server (TLS on an ephemeral port) and its relay. */
  static start(o: KubeApiServerOptions): KubeApiServer {
    const ref: { server?: KubeApiServer } = {};
    const server = Deno.serve(
      {
        hostname: "127.0.0.1",
        port: 0,
        cert: o.pki.serverCert,
        key: o.pki.serverKey,
        onListen() {},
      },
      (req) => ref.server!.#handle(req),
    );
    const relay = Relay.start(server.addr.port, o.hostname);
    ref.server = new KubeApiServer(o, server, relay);
    return ref.server;
  }

  /** The current resourceVersion (the last write's). */
  get resourceVersion(): string {
    return String(this.#rv);
  }

  /** The open watches (of `resource`, or all). */
  watchCount(resource?: Resource): number {
    return [...this.#watchers].filter((w) => !w.closed && (!resource || w.resource === resource))
      .length;
  }

  /** The requests for `resource`'s collection: lists (not watches) or watches. */
  count(resource: Resource, what: "list" | "watch"): number {
    return this.requests.filter((r) =>
      target(r.path)?.route.resource === resource && target(r.path)?.name === undefined &&
      r.watch === (what === "watch")
    ).length;
  }

  /** The object `key` (`ns/name` or `name`) of `resource` as stored. */
  get(resource: Resource, key: string): Obj | undefined {
    return this.#objects[resource].get(key);
  }

  /**
   * Creates or replaces an object (its `metadata.name`, and `namespace` for a namespaced
   * kind, say which): it gets the next resourceVersion (and a uid when new), and open
   * watches see ADDED or MODIFIED. Returns the stored object.
   */
  put(resource: Resource, obj: Obj): Obj {
    const route = ROUTES[resource];
    const key = this.#keyOf(route, obj);
    const prev = this.#objects[resource].get(key);
    const rv = ++this.#rv;
    const stored: Obj = {
      kind: route.kind,
      apiVersion: route.apiVersion,
      ...structuredClone(obj),
    };
    stored.metadata = {
      ...stored.metadata,
      uid: prev?.metadata.uid ?? stored.metadata.uid ?? this.#newUid(),
      resourceVersion: String(rv),
      creationTimestamp: prev?.metadata.creationTimestamp ?? new Date().toISOString(),
    };
    this.#objects[resource].set(key, stored);
    this.#record(resource, { rv, type: prev ? "MODIFIED" : "ADDED", key, obj: stored, prev });
    return stored;
  }

  /** Deletes an object (DELETED carries its last state with the delete's resourceVersion). */
  remove(resource: Resource, namespace: string | undefined, name: string): boolean {
    const key = namespace ? `${namespace}/${name}` : name;
    const prev = this.#objects[resource].get(key);
    if (prev === undefined) return false;
    this.#objects[resource].delete(key);
    const rv = ++this.#rv;
    const obj = { ...prev, metadata: { ...prev.metadata, resourceVersion: String(rv) } };
    this.#record(resource, { rv, type: "DELETED", key, obj, prev });
    return true;
  }

  /**
   * Puts many objects at once, without keeping their events (for a big cluster), and
   * compacts: a watch from before them is gone.
   */
  load(resource: Resource, objs: Iterable<Obj>): void {
    const route = ROUTES[resource];
    for (const obj of objs) {
      const rv = ++this.#rv;
      const stored: Obj = { kind: route.kind, apiVersion: route.apiVersion, ...obj };
      stored.metadata = {
        ...stored.metadata,
        uid: stored.metadata.uid ?? this.#newUid(),
        resourceVersion: String(rv),
        creationTimestamp: stored.metadata.creationTimestamp ?? new Date().toISOString(),
      };
      this.#objects[resource].set(this.#keyOf(route, stored), stored);
    }
    this.compact();
  }

  /**
   * A lagging watch cache (kubernetes/kubernetes#59848): from now on, a list of `resource`
   * asking `resourceVersion=0` is answered from this moment's state, until `catchUp()`;
   * a quorum read (`resourceVersion=""`) answers the latest.
   */
  lagCache(resource: Resource): void {
    this.#lagging.set(resource, {
      rv: this.#rv,
      items: [...this.#objects[resource].entries()]
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([, o]) => o),
    });
  }

  /** The watch cache caught up: every list answers the latest again. */
  catchUp(): void {
    this.#lagging.clear();
  }

  /** Forgets every change so far: a watch or a `continue` from before now answers 410. */
  compact(): void {
    this.#compacted = this.#rv;
    for (const r of Object.keys(this.#history) as Resource[]) this.#history[r] = [];
    for (const [id, s] of this.#snapshots) if (s.rv < this.#compacted) this.#snapshots.delete(id);
  }

  /** Sends a BOOKMARK at the current resourceVersion to every watch that asked for them. */
  bookmark(): void {
    for (const w of this.#watchers) {
      if (!w.bookmarks) continue;
      const route = ROUTES[w.resource];
      this.#send(w, {
        type: "BOOKMARK",
        object: {
          kind: route.kind,
          apiVersion: route.apiVersion,
          metadata: { resourceVersion: String(this.#rv) },
        },
      });
    }
  }

  /** Ends every open watch (of `resource`, or all) with an ERROR event: 410 Expired. */
  expireWatches(resource?: Resource): void {
    for (const w of [...this.#watchers]) {
      if (resource && w.resource !== resource) continue;
      this.#send(w, {
        type: "ERROR",
        object: status(410, "Expired", "The resourceVersion for the provided watch is too old."),
      });
      this.#end(w);
    }
  }

  /** Writes `line` (anything: a malformed event) into every open watch of `resource`. */
  inject(resource: Resource, line: string): void {
    for (const w of this.#watchers) if (w.resource === resource) this.#write(w, line);
  }

  /** Ends every open watch cleanly, as a server-side timeout does. */
  endWatches(): void {
    for (const w of [...this.#watchers]) this.#end(w);
  }

  /** Cuts every connection (open watches break mid-stream); new ones are accepted. */
  async cut(): Promise<void> {
    await this.#relay.cut();
  }

  /**
   * Blackholes every open connection: it stays open but carries nothing more, either way,
   * as a load balancer's failover or a NAT's timeout leaves a connection; new connections
   * work. Returns how many connections went silent.
   */
  blackhole(): number {
    return this.#relay.blackhole();
  }

  /** Goes down: connections are refused, open ones cut. */
  async down(): Promise<void> {
    await this.#relay.down();
  }

  /** Comes back on the same port. */
  up(): void {
    this.#relay.up();
  }

  /**
   * While on, requests get no answer (a hung server); turning it off answers the held
   * ones 503.
   */
  stall(on: boolean): void {
    if (on) {
      this.#stalled ??= [];
      return;
    }
    const held = this.#stalled ?? [];
    this.#stalled = null;
    for (const release of held) release();
  }

  /** Stops everything. */
  async close(): Promise<void> {
    this.stall(false);
    clearInterval(this.#bookmarkTimer);
    await this.#relay.down();
    for (const w of [...this.#watchers]) this.#end(w);
    await this.#server.shutdown();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #newUid(): string {
    const n = (++this.#uid).toString(16).padStart(12, "0");
    return `00000000-0000-4000-8000-${n}`;
  }

  #keyOf(route: Route, obj: Obj): string {
    const name = obj?.metadata?.name;
    if (typeof name !== "string" || name === "") throw new Error("The object has no metadata.name");
    if (!route.namespaced) return name;
    const ns = obj.metadata.namespace;
    if (typeof ns !== "string" || ns === "") {
      throw new Error(`The ${route.kind} "${name}" has no metadata.namespace`);
    }
    return `${ns}/${name}`;
  }

  #record(resource: Resource, c: Change): void {
    this.#history[resource].push(c);
    for (const w of [...this.#watchers]) if (w.resource === resource) this.#deliver(w, c);
  }

  /** Sends change `c` to `w` as its selector sees it (ADDED/MODIFIED/DELETED or nothing). */
  #deliver(w: Watcher, c: Change): void {
    const was = c.prev !== undefined && w.filter(c.prev);
    const is = c.type !== "DELETED" && w.filter(c.obj);
    let type: string;
    if (c.type === "DELETED") {
      if (!was) return;
      type = "DELETED";
    } else if (was && is) type = "MODIFIED";
    else if (is) type = "ADDED";
    else if (was) type = "DELETED";
    else return;
    this.#send(w, { type, object: c.obj });
  }

  #send(w: Watcher, event: Obj): void {
    this.#write(w, JSON.stringify(event));
  }

  #write(w: Watcher, line: string): void {
    if (w.closed) return;
    try {
      const bytes = encoder.encode(line + "\n");
      w.controller.enqueue(bytes);
      w.rec.bytes += bytes.length;
    } catch {
      this.#end(w);
    }
  }

  #end(w: Watcher): void {
    this.#watchers.delete(w);
    clearTimeout(w.timer);
    if (w.closed) return;
    w.closed = true;
    try {
      w.controller.close();
    } catch { /* cancelled by the client */ }
  }

  #json(code: number, body: Obj, rec?: RecordedRequest): Response {
    const bytes = encoder.encode(JSON.stringify(body));
    if (rec) rec.bytes = bytes.length;
    return new Response(bytes, { status: code, headers: { "content-type": "application/json" } });
  }

  #handle(req: Request): Response | Promise<Response> {
    const url = new URL(req.url);
    const query = Object.fromEntries(url.searchParams);
    const auth = req.headers.get("authorization");
    const token = auth?.startsWith("Bearer ") ? auth.slice(7) : null;
    const watch = query.watch === "1" || query.watch === "true";
    const rec: RecordedRequest = {
      method: req.method,
      path: url.pathname,
      query,
      status: 0,
      token,
      watch,
      bytes: 0,
    };
    this.requests.push(rec);
    this.beforeRequest?.(rec);
    if (this.#stalled !== null) {
      const held = this.#stalled;
      return new Promise((resolve) => {
        held.push(() => {
          rec.status = 503;
          resolve(
            this.#json(503, status(503, "ServiceUnavailable", "the server was stalled"), rec),
          );
        });
      });
    }
    const res = this.#route(req.method, url.pathname, query, token, watch, rec);
    rec.status = res.status;
    return res;
  }

  #route(
    method: string,
    path: string,
    query: Record<string, string>,
    token: string | null,
    watch: boolean,
    rec: RecordedRequest,
  ): Response {
    if (token === null || !this.tokens.has(token)) {
      return this.#json(401, status(401, "Unauthorized", "Unauthorized"), rec);
    }
    const t = target(path);
    if (t === null) {
      return this.#json(
        404,
        status(404, "NotFound", "the server could not find the requested resource"),
        rec,
      );
    }
    if (method !== "GET") {
      return this.#json(
        405,
        status(405, "MethodNotAllowed", `${method} is not supported here`),
        rec,
      );
    }
    if (t.name !== undefined) {
      const key = t.route.namespaced ? `${t.namespace}/${t.name}` : t.name;
      const obj = this.#objects[t.route.resource].get(key);
      if (obj === undefined) {
        return this.#json(
          404,
          status(404, "NotFound", `${t.route.resource} "${t.name}" not found`),
          rec,
        );
      }
      return this.#json(200, obj, rec);
    }
    let filter: (o: Obj) => boolean;
    try {
      filter = selectorFilter(query, t.namespace);
    } catch (err) {
      return this.#json(400, status(400, "BadRequest", (err as Error).message), rec);
    }
    return watch
      ? this.#watch(t.route, query, filter, rec)
      : this.#list(t.route, query, filter, rec);
  }

  #list(
    route: Route,
    query: Record<string, string>,
    filter: (o: Obj) => boolean,
    rec: RecordedRequest,
  ): Response {
    let snap: Snapshot;
    let offset = 0;
    let id: string;
    const rvText = query.resourceVersion ?? "";
    const asked = Number(rvText);
    if (rvText !== "" && (!Number.isInteger(asked) || asked < 0)) {
      return this.#json(
        400,
        status(400, "BadRequest", `invalid resource version "${rvText}"`),
        rec,
      );
    }
    const paged = Number(query.limit) > 0;
    // Whole from the watch cache: any state ("0"), or not older than N without a limit.
    const fromCache = this.#watchCache && !query.continue &&
      (rvText === "0" || (rvText !== "" && !paged));
    if (query.continue) {
      if (rvText !== "" && rvText !== "0") {
        return this.#json(
          400,
          status(
            400,
            "BadRequest",
            "specifying resource version is not allowed when using continue",
          ),
          rec,
        );
      }
      let tok: { id: string; offset: number; rv: number };
      try {
        tok = JSON.parse(atob(query.continue));
      } catch {
        return this.#json(400, status(400, "BadRequest", "continue key is not valid"), rec);
      }
      const s = this.#snapshots.get(tok.id);
      if (tok.rv < this.#compacted || s === undefined) {
        return this.#json(
          410,
          status(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. " +
              "You can start a new list without the continue parameter.",
          ),
          rec,
        );
      }
      snap = s;
      offset = tok.offset;
      id = tok.id;
    } else {
      if (rvText !== "" && rvText !== "0" && paged) {
        // An exact read at N (the legacy meaning of a resourceVersion with a limit).
        if (asked < this.#compacted) {
          return this.#json(
            410,
            status(410, "Expired", `too old resource version: ${asked} (${this.#compacted})`),
            rec,
          );
        }
        return this.#json(
          400,
          status(
            400,
            "BadRequest",
            "the test API server does not serve exact-resourceVersion lists",
          ),
          rec,
        );
      }
      if (rvText !== "" && rvText !== "0" && asked > this.#rv) {
        return this.#json(504, {
          ...status(504, "Timeout", `Too large resource version: ${asked}, current: ${this.#rv}`),
          details: {
            causes: [{ reason: "ResourceVersionTooLarge", message: "Too large resource version" }],
            retryAfterSeconds: 1,
          },
        }, rec);
      }
      const lag = rvText === "0" ? this.#lagging.get(route.resource) : undefined;
      const items = (lag ? lag.items : [...this.#objects[route.resource].entries()]
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([, o]) => o))
        .filter(filter);
      snap = { rv: lag ? lag.rv : this.#rv, items };
      id = crypto.randomUUID();
    }
    rec.source = fromCache ? "watchCache" : "etcd";
    const limit = paged && !fromCache ? Number(query.limit) : Infinity;
    const page = snap.items.slice(offset, offset + limit);
    const next = offset + page.length;
    const metadata: Obj = { resourceVersion: String(snap.rv) };
    if (next < snap.items.length) {
      this.#snapshots.set(id, snap);
      metadata.continue = btoa(JSON.stringify({ id, offset: next, rv: snap.rv }));
      metadata.remainingItemCount = snap.items.length - next;
    } else {
      this.#snapshots.delete(id);
    }
    // A list's items carry no kind and apiVersion: the list's kind says them.
    const items = page.map(({ kind: _k, apiVersion: _a, ...rest }) => rest);
    return this.#json(200, {
      kind: `${route.kind}List`,
      apiVersion: route.apiVersion,
      metadata,
      items,
    }, rec);
  }

  #watch(
    route: Route,
    query: Record<string, string>,
    filter: (o: Obj) => boolean,
    rec: RecordedRequest,
  ): Response {
    const rvText = query.resourceVersion ?? "";
    const from = rvText === "" ? this.#rv : Number(rvText);
    if (!Number.isInteger(from) || from < 0) {
      return this.#json(
        400,
        status(400, "BadRequest", `invalid resource version "${rvText}"`),
        rec,
      );
    }
    const gone = rvText !== "" && rvText !== "0" && from < this.#compacted;
    const goneStatus = status(
      410,
      "Expired",
      `too old resource version: ${from} (${this.#compacted})`,
    );
    if (gone && this.watchGone === "status") return this.#json(410, goneStatus, rec);
    const asked = Number(query.timeoutSeconds);
    const seconds = Math.min(asked > 0 ? asked : this.#maxWatchSeconds, this.#maxWatchSeconds);
    let w: Watcher | undefined;
    const body = new ReadableStream<Uint8Array>({
      start: (controller) => {
        w = {
          rec,
          resource: route.resource,
          filter,
          bookmarks: query.allowWatchBookmarks === "true" || query.allowWatchBookmarks === "1",
          controller,
          closed: false,
        };
        if (gone) {
          this.#send(w, { type: "ERROR", object: goneStatus });
          w.closed = true;
          controller.close();
          return;
        }
        if (rvText === "0") {
          for (const obj of this.#objects[route.resource].values()) {
            if (filter(obj)) this.#send(w, { type: "ADDED", object: obj });
          }
        } else {
          for (const c of this.#history[route.resource]) if (c.rv > from) this.#deliver(w, c);
        }
        this.#watchers.add(w);
        w.timer = setTimeout(() => this.#end(w!), seconds * 1000);
      },
      cancel: () => {
        if (w === undefined) return;
        w.closed = true;
        this.#end(w);
      },
    });
    return new Response(body, { status: 200, headers: { "content-type": "application/json" } });
  }
}

/** A filter from `labelSelector`, `fieldSelector` and the path's namespace. */
function selectorFilter(
  query: Record<string, string>,
  namespace: string | undefined,
): (o: Obj) => boolean {
  const terms: ((o: Obj) => boolean)[] = [];
  if (namespace !== undefined) terms.push((o) => o.metadata?.namespace === namespace);
  const parse = (sel: string, getter: (k: string) => (o: Obj) => string | undefined) => {
    for (const term of sel.split(",").map((s) => s.trim()).filter(Boolean)) {
      const m = /^([^!=]+)(==|=|!=)(.*)$/.exec(term);
      if (!m) throw new Error(`unable to parse requirement: "${term}"`);
      const [, k, op, v] = m;
      const get = getter(k.trim());
      const want = v.trim();
      terms.push(op === "!=" ? (o) => get(o) !== want : (o) => get(o) === want);
    }
  };
  if (query.labelSelector) parse(query.labelSelector, (k) => (o) => o.metadata?.labels?.[k]);
  if (query.fieldSelector) {
    const fields: Record<string, (o: Obj) => string | undefined> = {
      "metadata.name": (o) => o.metadata?.name,
      "metadata.namespace": (o) => o.metadata?.namespace,
      "spec.nodeName": (o) => o.spec?.nodeName ?? "",
    };
    parse(query.fieldSelector, (k) => {
      const f = fields[k];
      if (f === undefined) throw new Error(`field label not supported: ${k}`);
      return f;
    });
  }
  return (o) => terms.every((t) => t(o));
}
