/**
 * HTTPS to the Kubernetes API server: `fetch` over a `Deno.HttpClient` that trusts the
 * cluster's CA (`caCerts`) and presents the client certificate, if any (`cert`, `key`),
 * with the bearer token in each request.
 *
 * Why not @kubernetes/client-node, the official JavaScript client: it runs under Deno
 * (its list and its watch worked against tests/support/kube_apiserver.ts), but importing
 * it alone takes a process with the agent's V8 flags from 31 to 100 MB RSS (33 MB of
 * heap, ~255 ms) and brings 72 npm packages (54 MB) into the lockfile, while the
 * agent's whole budget is 150 MB with 30,000 pods cached; and it keeps whole objects.
 * What enim needs is three GETs (a list page, a watch stream, one object), which
 * `fetch` does natively. (Numbers and the command: the commit that added this file.)
 *
 * The token: a given one is used as is; a token file (the service account's projected
 * token, rotated about hourly, or a kubeconfig's `tokenFile`) is re-read when the copy
 * in memory is older than `tokenMaxAgeMs` (a minute, as client-go's cached token file
 * source does), and at once on a 401, after which the request is tried once more.
 * Nothing runs between requests: no timer.
 *
 * A connection can die without a word (a load balancer's failover, a NAT's timeout: no
 * FIN, no RST), and with HTTP/2 every later request queues on it and hangs. Whoever
 * finds a request unanswered ({@linkcode KubeClient.get} past its time, a list body
 * stalled, a watch silent past its limit) calls {@linkcode KubeClient.reconnect}: the
 * next requests open a new connection, and those still on the old one fail at once.
 *
 * @module
 */
import { type KubeAccess, KubeAccessError, type TokenSpec } from "./access.ts";
import { StatusSchema } from "./wire.ts";
import { ListBodyError, listItems } from "./_list_body.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import { VERSION } from "../lib/version.ts";

/** The API server answered with an error status. */
export class KubeApiError extends Error {
  /** The HTTP status (or the Status `code` of a watch's ERROR event). */
  readonly status: number;
  /** The Status `reason` (`Expired`, `Forbidden`, `NotFound`, …), when the server gave one. */
  readonly reason: string | undefined;
  constructor(status: number, reason: string | undefined, message: string) {
    super(message);
    this.name = "KubeApiError";
    this.status = status;
    this.reason = reason;
  }

  /** Whether the resourceVersion asked for is gone (HTTP 410): list again. */
  get gone(): boolean {
    return this.status === 410;
  }
}

/** A request that got no answer: no connection, TLS failure, or no answer in time. */
export class KubeRequestError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "KubeRequestError";
  }
}

/** Options for {@linkcode KubeClient}. */
export interface KubeClientOptions {
  /** How long a plain GET (a list page, one object) may take in all (default 30 s). */
  requestTimeoutMs?: number;
  /** How old the token file's copy may get before it is read again (default 60 s). */
  tokenMaxAgeMs?: number;
  log?: Logger;
  /** The clock in ms (default `Date.now`). */
  now?: () => number;
}

/** What a GET may carry. */
export interface GetOptions {
  /** Query parameters; undefined values are left out. */
  query?: Record<string, string | number | boolean | undefined>;
  /** Overrides the client's request timeout. */
  timeoutMs?: number;
  /** Aborts the request. */
  signal?: AbortSignal;
}

/** A list's body read item by item (kube/_list_body.ts). */
export interface ListStream {
  /** The list's items, each parsed as JSON, as they arrive. */
  items: AsyncGenerator<unknown>;
  /** The list's other members (`metadata`, …), complete once `items` is done. */
  rest: Record<string, unknown>;
}

/** The bearer token, re-read from its file as it rotates. */
class TokenSource {
  readonly #spec: TokenSpec;
  readonly #maxAgeMs: number;
  readonly #now: () => number;
  readonly #log: Logger;
  #value: string | undefined;
  #readAt = -Infinity;
  /** How many times the file was read (tests watch rotation with it). */
  reads = 0;

  constructor(spec: TokenSpec, maxAgeMs: number, now: () => number, log: Logger) {
    this.#spec = spec;
    this.#maxAgeMs = maxAgeMs;
    this.#now = now;
    this.#log = log;
    if ("value" in spec) this.#value = spec.value;
  }

  /** Whether a 401 may be cured by reading the token again. */
  get rotates(): boolean {
    return "file" in this.#spec;
  }

  /** The token; from the file again when `fresh` or when the copy is too old. */
  async get(fresh: boolean): Promise<string | undefined> {
    if (!("file" in this.#spec)) return this.#value;
    if (!fresh && this.#value !== undefined && this.#now() - this.#readAt < this.#maxAgeMs) {
      return this.#value;
    }
    const file = this.#spec.file;
    this.#readAt = this.#now();
    this.reads++;
    try {
      const text = (await Deno.readTextFile(file)).trim();
      if (text === "") throw new Error("the file is empty");
      if (text !== this.#value && this.#value !== undefined) {
        this.#log.info("The Kubernetes API token changed; using the new one", { file });
      }
      this.#value = text;
    } catch (err) {
      if (this.#value === undefined) {
        throw new KubeAccessError(
          `Cannot read the Kubernetes API token "${file}": ${errorText(err)}`,
          { cause: err },
        );
      }
      this.#log.warn("Cannot read the Kubernetes API token again; using the one read before", {
        file,
        error: err,
      });
    }
    return this.#value;
  }
}

/**
 * A client of one API server. `get` fetches one JSON document (a list page, an
 * object); `stream` opens a watch and hands its body to the caller. Errors are
 * {@linkcode KubeApiError} (the server said no) or {@linkcode KubeRequestError} (no
 * answer); Deno's permission errors pass through unchanged (they are not transient).
 *
 * @example
 * ```ts
 * const client = new KubeClient(await resolveAccess({}));
 * try {
 *   const ns = await client.get("/api/v1/namespaces/kube-system");
 * } finally {
 *   client.close();
 * }
 * ```
 */
export class KubeClient {
  /** The server's base URL. */
  readonly server: string;
  /** Where the access came from (a kubeconfig and context, or in-cluster). */
  readonly source: string;
  #http: Deno.HttpClient;
  readonly #httpOptions: Deno.CreateHttpClientOptions;
  readonly #token: TokenSource | undefined;
  readonly #timeoutMs: number;
  readonly #log: Logger;
  #generation = 0;
  #closed = false;

  constructor(access: KubeAccess, o: KubeClientOptions = {}) {
    this.server = access.server;
    this.source = access.source;
    this.#timeoutMs = o.requestTimeoutMs ?? 30_000;
    const log = o.log ?? nullLogger;
    this.#log = log;
    this.#token = access.token
      ? new TokenSource(access.token, o.tokenMaxAgeMs ?? 60_000, o.now ?? Date.now, log)
      : undefined;
    const tls = access.clientCert
      ? { cert: access.clientCert.cert, key: access.clientCert.key }
      : {};
    this.#httpOptions = { ...(access.caCerts ? { caCerts: access.caCerts } : {}), ...tls };
    this.#http = Deno.createHttpClient(this.#httpOptions);
  }

  /** Counts the connection sets: a request started at one generation belongs to it. */
  get generation(): number {
    return this.#generation;
  }

  /**
   * Drops the connections of `generation` (if still the current one): the next requests
   * open new ones; requests still on the old ones fail at once. Returns whether it did.
   * A later generation is left alone, so that callers who found the same dead connection
   * reconnect once between them.
   */
  reconnect(generation: number, why: string): boolean {
    if (this.#closed || generation !== this.#generation) return false;
    const old = this.#http;
    this.#http = Deno.createHttpClient(this.#httpOptions);
    this.#generation++;
    this.#log.warn(
      "Dropping the connection to the Kubernetes API server; the next request opens a new one",
      {
        server: this.server,
        why,
      },
    );
    old.close();
    return true;
  }

  /** How many times the token file was read (0 for a given token). */
  get tokenReads(): number {
    return this.#token?.reads ?? 0;
  }

  /** The URL of `path` with `query`. */
  url(path: string, query: GetOptions["query"] = {}): string {
    const u = new URL(this.server + path);
    for (const [k, v] of Object.entries(query)) {
      if (v !== undefined) u.searchParams.set(k, String(v));
    }
    return u.href;
  }

  /** GETs `path` and returns its JSON body; a non-2xx status throws {@linkcode KubeApiError}. */
  async get(path: string, o: GetOptions = {}): Promise<unknown> {
    const timeoutMs = o.timeoutMs ?? this.#timeoutMs;
    const generation = this.#generation;
    const ac = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ac.abort();
    }, timeoutMs);
    const onAbort = () => ac.abort();
    o.signal?.addEventListener("abort", onAbort, { once: true });
    if (o.signal?.aborted) ac.abort();
    try {
      const res = await this.#send(path, o.query, ac.signal);
      if (!res.ok) throw await apiError(res, path);
      return await res.json();
    } catch (err) {
      if (timedOut) {
        const msg =
          `GET ${path} on the Kubernetes API server ${this.server} got no answer in ${timeoutMs} ms`;
        this.reconnect(generation, msg);
        throw new KubeRequestError(msg, { cause: err });
      }
      throw err;
    } finally {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * GETs the list `path` and returns its body to read item by item (a list from the watch
   * cache is the whole collection at once: kube/_list_body.ts). The answer must start
   * within the request timeout (`timeoutMs`), and the body may not stall longer than that
   * between two chunks; either failure drops the connection ({@linkcode reconnect}) and
   * throws {@linkcode KubeRequestError}, as does a body that is not a list's JSON. A
   * non-2xx status throws {@linkcode KubeApiError}.
   */
  async list(path: string, o: GetOptions = {}): Promise<ListStream> {
    const timeoutMs = o.timeoutMs ?? this.#timeoutMs;
    const generation = this.#generation;
    const ac = new AbortController();
    let stalled = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        stalled = true;
        ac.abort();
      }, timeoutMs);
    };
    const onAbort = () => ac.abort();
    o.signal?.addEventListener("abort", onAbort, { once: true });
    if (o.signal?.aborted) ac.abort();
    const done = () => {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
    };
    const failure = (err: unknown, what: string): unknown => {
      if (stalled) {
        const msg =
          `GET ${path} on the Kubernetes API server ${this.server} ${what} ${timeoutMs} ms`;
        this.reconnect(generation, msg);
        return new KubeRequestError(msg, { cause: err });
      }
      if (err instanceof ListBodyError) {
        return new KubeRequestError(`GET ${path}: ${err.message}`, { cause: err });
      }
      if (err instanceof KubeApiError || err instanceof KubeRequestError || ac.signal.aborted) {
        return err;
      }
      if (err instanceof Deno.errors.NotCapable) return err;
      return new KubeRequestError(
        `GET ${path} on the Kubernetes API server ${this.server} broke: ${errorText(err)}`,
        { cause: err },
      );
    };
    arm();
    let res: Response;
    try {
      res = await this.#send(path, o.query, ac.signal);
      if (!res.ok) throw await apiError(res, path);
      if (res.body === null) throw new KubeRequestError(`GET ${path} answered with no body`);
    } catch (err) {
      done();
      throw failure(err, "got no answer in");
    }
    const rest: Record<string, unknown> = {};
    const body = res.body;
    async function* items(): AsyncGenerator<unknown> {
      try {
        // The Response stays referenced while its body is read (see stream()).
        void res;
        yield* listItems(body, rest, { signal: ac.signal, progress: arm });
      } catch (err) {
        throw failure(err, "stalled in its body for");
      } finally {
        done();
      }
    }
    return { items: items(), rest };
  }

  /**
   * GETs `path` (a watch) and returns the response, its body to be read as it comes;
   * `signal` aborts the request. Keep the response referenced while reading its body
   * (Deno 2.9.6 does not abort a body whose Response was collected; kube/_lines.ts
   * cancels the reader on abort as well). A non-2xx status throws {@linkcode KubeApiError}.
   */
  async stream(
    path: string,
    query: GetOptions["query"],
    signal: AbortSignal,
  ): Promise<Response & { body: ReadableStream<Uint8Array> }> {
    const res = await this.#send(path, query, signal);
    if (!res.ok) throw await apiError(res, path);
    if (res.body === null) throw new KubeRequestError(`GET ${path} answered with no body`);
    return res as Response & { body: ReadableStream<Uint8Array> };
  }

  /** Closes the connections. Requests in flight fail. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#http.close();
  }

  /** One GET with the token; a 401 with a rotating token reads it again and tries once more. */
  async #send(
    path: string,
    query: GetOptions["query"],
    signal: AbortSignal,
  ): Promise<Response> {
    const url = this.url(path, query);
    for (let attempt = 0;; attempt++) {
      const headers: Record<string, string> = {
        Accept: "application/json",
        "User-Agent": `enim/${VERSION}`,
      };
      const token = await this.#token?.get(attempt > 0);
      if (token !== undefined) headers.Authorization = `Bearer ${token}`;
      let res: Response;
      try {
        res = await fetch(url, { headers, client: this.#http, signal });
      } catch (err) {
        if (err instanceof Deno.errors.NotCapable) throw err;
        if (signal.aborted) throw err;
        throw new KubeRequestError(
          `GET ${path} on the Kubernetes API server ${this.server} failed: ${errorText(err)}`,
          { cause: err },
        );
      }
      if (res.status === 401 && attempt === 0 && this.#token?.rotates) {
        await res.body?.cancel();
        continue;
      }
      return res;
    }
  }
}

/** The error a non-2xx response stands for, from its `metav1.Status` body when it has one. */
async function apiError(res: Response, path: string): Promise<KubeApiError> {
  let text = "";
  try {
    text = await res.text();
  } catch { /* the body broke: the status alone */ }
  let reason: string | undefined;
  let message = text.slice(0, 300);
  try {
    const s = StatusSchema.safeParse(JSON.parse(text));
    if (s.success) {
      reason = s.data.reason;
      message = s.data.message ?? message;
    }
  } catch { /* not JSON: the text as is */ }
  return new KubeApiError(
    res.status,
    reason,
    `The Kubernetes API server answered GET ${path} with ${res.status}` +
      (reason ? ` ${reason}` : "") + (message ? `: ${message}` : ""),
  );
}

/** An error's message with its cause's (fetch hides the TLS or socket reason in `cause`). */
export function errorText(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : "";
  return msg + cause;
}
