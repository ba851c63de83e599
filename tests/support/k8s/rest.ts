/**
 * A small REST client of the real kube-apiserver for tests (the agent's own client is
 * kube/client.ts; this one writes too): HTTPS with the cluster's CA, a client
 * certificate or a bearer token; create, server-side apply (`application/apply-patch+yaml`,
 * strict field validation, as `kubectl apply --server-side` sends it), strategic-merge and
 * merge patches, delete, and discovery (which resource a kind is). Every answer is parsed
 * through a zod schema; an error answer throws {@linkcode KubeStatusError} with the
 * server's `metav1.Status`.
 *
 * @module
 */
import { z } from "zod";

/** `metav1.Status`, the body of every error. */
export const StatusSchema = z.looseObject({
  kind: z.optional(z.string()),
  status: z.optional(z.string()),
  message: z.optional(z.string()),
  reason: z.optional(z.string()),
  code: z.optional(z.number()),
  details: z.optional(z.unknown()),
});

/** `metav1.ObjectMeta`, the parts tests read. */
export const MetaSchema = z.looseObject({
  name: z.string(),
  namespace: z.optional(z.string()),
  uid: z.string(),
  resourceVersion: z.string(),
  generation: z.optional(z.number()),
  labels: z.optional(z.record(z.string(), z.string())),
  annotations: z.optional(z.record(z.string(), z.string())),
  creationTimestamp: z.optional(z.string()),
  deletionTimestamp: z.optional(z.string()),
  finalizers: z.optional(z.array(z.string())),
});

/** Any stored object: its kind, apiVersion and metadata; the rest as the server sent it. */
export const StoredSchema = z.looseObject({
  apiVersion: z.string(),
  kind: z.string(),
  metadata: MetaSchema,
});
/** A stored object. */
export type Stored = z.infer<typeof StoredSchema>;

/** A list of any kind. */
export const StoredListSchema = z.looseObject({
  apiVersion: z.string(),
  kind: z.string(),
  metadata: z.looseObject({
    resourceVersion: z.string(),
    continue: z.optional(z.string()),
  }),
  items: z.nullable(z.array(z.looseObject({ metadata: MetaSchema }))),
});

/** One event of a watch. */
export const WatchEventSchema = z.object({
  type: z.enum(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]),
  object: z.looseObject({
    metadata: z.looseObject({ name: z.optional(z.string()), resourceVersion: z.string() }),
  }),
});
/** One event of a watch. */
export type WatchEvent = z.infer<typeof WatchEventSchema>;

/** The API server said no: its HTTP status and its Status. */
export class KubeStatusError extends Error {
  readonly status: number;
  readonly reason: string | undefined;
  readonly body: z.infer<typeof StatusSchema> | null;
  constructor(method: string, path: string, status: number, body: unknown, text: string) {
    const s = StatusSchema.safeParse(body);
    const parsed = s.success ? s.data : null;
    super(
      `${method} ${path} answered ${status}${parsed?.reason ? ` ${parsed.reason}` : ""}: ${
        parsed?.message ?? text.slice(0, 500)
      }`,
    );
    this.name = "KubeStatusError";
    this.status = status;
    this.reason = parsed?.reason;
    this.body = parsed;
  }
}

/** Who the client is. */
export type Credentials =
  | { cert: string; key: string }
  | { token: string };

/** Query parameters; undefined ones are left out. */
export type Query = Record<string, string | number | boolean | undefined>;

const APIResourceListSchema = z.object({
  groupVersion: z.string(),
  resources: z.array(z.looseObject({
    name: z.string(),
    kind: z.string(),
    namespaced: z.boolean(),
    verbs: z.optional(z.array(z.string())),
  })),
});

/** Where a kind lives: its resource's plural and whether it is namespaced. */
export interface ResourceInfo {
  apiVersion: string;
  kind: string;
  resource: string;
  namespaced: boolean;
}

/** A REST client of one API server as one user. */
export class KubeRest {
  readonly server: string;
  readonly #http: Deno.HttpClient;
  readonly #token: string | undefined;
  readonly #discovery = new Map<string, z.infer<typeof APIResourceListSchema>>();

  /** A client of `server` (`https://127.0.0.1:<port>`) trusting `caCert` (PEM). */
  constructor(server: string, caCert: string, creds: Credentials) {
    this.server = server;
    if ("token" in creds) {
      this.#token = creds.token;
      this.#http = Deno.createHttpClient({ caCerts: [caCert] });
    } else {
      this.#http = Deno.createHttpClient({ caCerts: [caCert], cert: creds.cert, key: creds.key });
    }
  }

  /** A client with a client certificate read from files. */
  static async withCert(server: string, caFile: string, certFile: string, keyFile: string) {
    const [ca, cert, key] = await Promise.all(
      [caFile, certFile, keyFile].map((f) => Deno.readTextFile(f)),
    );
    return new KubeRest(server, ca, { cert, key });
  }

  /** One request; the body parsed as JSON (or the text when it is not JSON). */
  async raw(
    method: string,
    path: string,
    o: { query?: Query; body?: string; contentType?: string; signal?: AbortSignal } = {},
  ): Promise<{ status: number; body: unknown; text: string }> {
    const url = new URL(this.server + path);
    for (const [k, v] of Object.entries(o.query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = { Accept: "application/json" };
    if (this.#token) headers.Authorization = `Bearer ${this.#token}`;
    if (o.contentType) headers["Content-Type"] = o.contentType;
    const res = await fetch(url, {
      method,
      headers,
      body: o.body,
      client: this.#http,
      signal: o.signal ?? AbortSignal.timeout(60_000),
    });
    const text = await res.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch { /* not JSON: the text */ }
    return { status: res.status, body, text };
  }

  /** A request whose answer must be 2xx; the body parsed by `schema`. */
  async request<S extends z.ZodType>(
    method: string,
    path: string,
    schema: S,
    o: { query?: Query; body?: string; contentType?: string } = {},
  ): Promise<z.infer<S>> {
    const r = await this.raw(method, path, o);
    if (r.status < 200 || r.status > 299) {
      throw new KubeStatusError(method, path, r.status, r.body, r.text);
    }
    const parsed = schema.safeParse(r.body);
    if (!parsed.success) {
      throw new Error(
        `${method} ${path}: the answer is not what was expected: ${
          z.prettifyError(parsed.error)
        }\n${r.text.slice(0, 1000)}`,
      );
    }
    return parsed.data;
  }

  /** GET, parsed by `schema`. */
  get<S extends z.ZodType>(path: string, schema: S, query?: Query): Promise<z.infer<S>> {
    return this.request("GET", path, schema, { query });
  }

  /** GET of an object, or null when it is not there (404). */
  async find<S extends z.ZodType>(path: string, schema: S): Promise<z.infer<S> | null> {
    try {
      return await this.get(path, schema);
    } catch (err) {
      if (err instanceof KubeStatusError && err.status === 404) return null;
      throw err;
    }
  }

  /** POST a new object to its collection `path`. */
  create<S extends z.ZodType>(path: string, obj: unknown, schema: S, query?: Query) {
    return this.request("POST", path, schema, {
      body: JSON.stringify(obj),
      contentType: "application/json",
      query,
    });
  }

  /**
   * Server-side apply of `doc` (YAML or JSON text, or an object) at the object's own
   * `path`, as `fieldManager`, forcing conflicts, with strict field validation.
   */
  apply<S extends z.ZodType>(path: string, doc: string | unknown, schema: S, fieldManager: string) {
    return this.request("PATCH", path, schema, {
      body: typeof doc === "string" ? doc : JSON.stringify(doc),
      contentType: "application/apply-patch+yaml",
      query: { fieldManager, force: true, fieldValidation: "Strict" },
    });
  }

  /** A patch: `strategic` (kubelet's and kubectl's), `merge` (RFC 7386) or `json` (RFC 6902). */
  patch<S extends z.ZodType>(
    path: string,
    patch: unknown,
    schema: S,
    type: "strategic" | "merge" | "json" = "strategic",
    query?: Query,
  ) {
    const contentType = {
      strategic: "application/strategic-merge-patch+json",
      merge: "application/merge-patch+json",
      json: "application/json-patch+json",
    }[type];
    return this.request("PATCH", path, schema, {
      body: JSON.stringify(patch),
      contentType,
      query,
    });
  }

  /** DELETE with `options` (a `DeleteOptions` body); a 404 is fine when `missingOk`. */
  async delete(
    path: string,
    options: Record<string, unknown> = {},
    missingOk = true,
  ): Promise<void> {
    const r = await this.raw("DELETE", path, {
      body: JSON.stringify({ kind: "DeleteOptions", apiVersion: "v1", ...options }),
      contentType: "application/json",
    });
    if (r.status === 404 && missingOk) return;
    if (r.status < 200 || r.status > 299) {
      throw new KubeStatusError("DELETE", path, r.status, r.body, r.text);
    }
  }

  /**
   * Watches `path` (a collection) from `resourceVersion` until an event satisfies
   * `match`, and returns it; `started` runs once the watch is open (the action whose event
   * the caller waits for). Every event is parsed through {@linkcode WatchEventSchema}.
   */
  async watchFor(
    path: string,
    o: {
      resourceVersion: string;
      fieldSelector?: string;
      /** Ask for BOOKMARK events (`allowWatchBookmarks=true`). */
      bookmarks?: boolean;
      match: (e: WatchEvent) => boolean;
      started?: () => Promise<void>;
      timeoutMs?: number;
    },
  ): Promise<WatchEvent> {
    const url = new URL(this.server + path);
    url.searchParams.set("watch", "1");
    url.searchParams.set("resourceVersion", o.resourceVersion);
    if (o.fieldSelector) url.searchParams.set("fieldSelector", o.fieldSelector);
    if (o.bookmarks) url.searchParams.set("allowWatchBookmarks", "true");
    const headers: Record<string, string> = { Accept: "application/json" };
    if (this.#token) headers.Authorization = `Bearer ${this.#token}`;
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), o.timeoutMs ?? 60_000);
    try {
      const res = await fetch(url, { headers, client: this.#http, signal: ac.signal });
      if (!res.ok || !res.body) {
        const text = await res.text();
        throw new KubeStatusError("GET", path, res.status, null, text);
      }
      const started = o.started?.();
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      let found: WatchEvent | null = null;
      try {
        while (found === null) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let nl: number;
          while (found === null && (nl = buf.indexOf("\n")) >= 0) {
            const line = buf.slice(0, nl).trim();
            buf = buf.slice(nl + 1);
            if (!line) continue;
            const e = WatchEventSchema.parse(JSON.parse(line));
            if (o.match(e)) found = e;
          }
        }
      } finally {
        await reader.cancel().catch(() => {});
      }
      await started;
      if (found === null) throw new Error(`The watch of ${path} ended before the event awaited`);
      return found;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Where `kind` of `apiVersion` is served (discovery, as kubectl finds it). */
  async resourceOf(apiVersion: string, kind: string): Promise<ResourceInfo> {
    let list = this.#discovery.get(apiVersion);
    if (!list) {
      const path = apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
      list = await this.get(path, APIResourceListSchema);
      this.#discovery.set(apiVersion, list);
    }
    const r = list.resources.find((x) => x.kind === kind && !x.name.includes("/"));
    if (!r) throw new Error(`The API server serves no kind "${kind}" in "${apiVersion}"`);
    return { apiVersion, kind, resource: r.name, namespaced: r.namespaced };
  }

  /** The path of an object (or, without `name`, of its collection). */
  async pathOf(
    apiVersion: string,
    kind: string,
    namespace: string | undefined,
    name?: string,
  ): Promise<string> {
    const r = await this.resourceOf(apiVersion, kind);
    const base = apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
    const ns = r.namespaced ? `/namespaces/${encodeURIComponent(namespace ?? "default")}` : "";
    return `${base}${ns}/${r.resource}${name ? `/${encodeURIComponent(name)}` : ""}`;
  }

  /** Closes the connections. */
  close(): void {
    this.#http.close();
  }
}
