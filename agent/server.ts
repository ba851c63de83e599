/**
 * The agent's HTTP+JSON API: a `Request → Response` handler over an
 * {@linkcode EniManager} (unit tests call it directly), and
 * {@linkcode serveUnix}, which serves a handler on a root-only unix socket.
 *
 * Paths are listed in `api/schema.ts`. Request bodies are parsed with the zod
 * schemas before the manager sees them; every error becomes an HTTP response in
 * one place ({@linkcode errorResponse}).
 *
 * Why one file: the route table, the method checks (405 with `Allow`, 501 for an
 * unknown method) and the error mapping are one contract with the socket's clients;
 * split, a route could answer outside it.
 *
 * @module
 */
import {
  AGENT_VERSION_HEADER,
  CNI_CALL_PATH,
  EXIT_HEADER,
  MAX_CALL_STDIN,
  PLUGIN_VERSION_HEADER,
  skewProblem,
  TIMEOUT_HEADER,
  UNLABELLED_PLUGIN_VERSION,
} from "../api/wire.ts";
import { VERSION } from "../lib/version.ts";
import { CNI_CODES, decodeStdin, errorObject, isPlainObject, LATEST_VERSION } from "../cni/spec.ts";
import * as z from "zod/mini";
import { dirname } from "node:path";
import {
  ApiError,
  type ApiErrorCode,
  CniCallSchema,
  type DevicePluginStatus,
  HTTP_STATUS,
  type IpvsStatus,
  type PodPolicyView,
  type PolicyStatus,
} from "../api/schema.ts";
import type { EniManager } from "../manager/types.ts";
import { LocalAgentClient, parseRequest } from "./local_client.ts";
import { serveCniCall } from "./cni_call.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import { serveHttp1 } from "../lib/http1_server.ts";
import { privateDir } from "../lib/private_fs.ts";
import { userMessage } from "../lib/message.ts";
import { clip, MESSAGE_CHARS } from "../lib/clip.ts";
import type { Health } from "./health.ts";

/** The default request body limit. */
export const DEFAULT_MAX_BODY_BYTES = 64 * 1024;
/** The largest request the socket reads: a raw CNI call with the largest stdin, JSON-escaped. */
const MAX_REQUEST_BYTES = 2 * MAX_CALL_STDIN + 256 * 1024;

/** Supplies `GET /metrics` in the Prometheus text exposition format. */
export type MetricsSource = () => string | Promise<string>;

/** Options for {@linkcode createHandler}. */
export interface HandlerOptions {
  manager: EniManager;
  log?: Logger;
  /** `GET /metrics` (the agent's {@linkcode Metrics}); 404 when absent. */
  metrics?: MetricsSource;
  /** Request bodies larger than this are refused with 413. */
  maxBodyBytes?: number;
  /** How long the API waits for one ADD before answering `busy` (the ADD goes on). */
  addTimeoutMs?: number;
  /** The device plugin's status, added to `GET /v1/status` when given. */
  devicePlugin?: () => DevicePluginStatus;
  /** NetworkPolicy enforcement, when it is on: its status and `GET /v1/policy`. */
  policy?: PolicySource;
  /** kube-proxy's IPVS mode as NetworkPolicy sees it (when policy is on), added to `GET /v1/status`. */
  ipvs?: () => IpvsStatus;
  /** `GET /v1/healthz`: whether the agent is wedged (`health.ts`); absent: always ok. */
  health?: () => Health;
}

/** The most `GET /v1/status` waits for the check of the policy tables. */
const STATUS_CHECK_MS = 2_000;

/** `p` settled, or `ms` passed (its result and error are dropped). */
function withTimeout(p: Promise<unknown>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout>;
  return Promise.race([
    p.then(() => {}, () => {}),
    new Promise<void>((r) => timer = setTimeout(r, ms)),
  ]).finally(() => clearTimeout(timer));
}

/** What the API reads of the NetworkPolicy enforcer (`agent/policy/`). */
export interface PolicySource {
  /** Added to `GET /v1/status`. */
  status(): PolicyStatus;
  /**
   * Checks every table against what was loaded before the status is read (a table found
   * missing is then `retrying`, never `enforced`); bounded by its caller.
   */
  checkTables?(o: { all: boolean }): Promise<number>;
  /** A local pod's effective policy (null: no attachment of it under policy here). */
  view(pod: string): PodPolicyView | null;
  /** Whether the enforcer has synced with the cluster. */
  readonly synced: boolean;
}

/** A pod as `GET /v1/policy?pod=` names it: `namespace/name`. */
const PodRefSchema = z.string().check(
  z.regex(
    /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\/[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?$/,
    "Expected a pod as <namespace>/<name>",
  ),
);

/** The plugin's `enim-cni-timeout-ms` header: whole ms, as its `timeoutSeconds` allows. */
const PluginTimeoutSchema = z.pipe(
  z.string().check(z.regex(/^[1-9][0-9]{0,6}$/)),
  z.transform(Number),
).check(z.maximum(600_000));

/** An API handler. */
export type Handler = (req: Request) => Promise<Response>;

/** An {@linkcode ApiError} sent with an HTTP status other than its code's (404, 405, 413). */
class HttpError extends ApiError {
  readonly status: number;
  readonly headers: Record<string, string>;
  constructor(
    status: number,
    code: ApiErrorCode,
    message: string,
    headers: Record<string, string> = {},
  ) {
    super(code, message);
    this.status = status;
    this.headers = headers;
  }
}

const JSON_HEADERS = { "content-type": "application/json" };

function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), { status, headers: JSON_HEADERS });
}

/**
 * The one place errors become HTTP: an {@linkcode ApiError} is sent with
 * `HTTP_STATUS[code]` and `{error: {code, message, details}}`; anything else is
 * a 500 `internal`, logged with its stack.
 */
export function errorResponse(err: unknown, log: Logger = nullLogger, what = "request"): Response {
  if (err instanceof ApiError) {
    const status = err instanceof HttpError ? err.status : HTTP_STATUS[err.code];
    // The last guard: a message echoing a huge value still arrives short, its reason first.
    const body = {
      error: {
        code: err.code,
        message: clip(err.message, MESSAGE_CHARS),
        ...(err.details !== undefined ? { details: clip(err.details, MESSAGE_CHARS) } : {}),
      },
    };
    if (status >= 500) log.error(`${what} failed`, { code: err.code, error: err });
    else log.debug(`${what} refused`, { code: err.code, message: err.message });
    return new Response(JSON.stringify(body), {
      status,
      headers: { ...JSON_HEADERS, ...(err instanceof HttpError ? err.headers : {}) },
    });
  }
  log.error(`${what} failed with an unexpected error`, {
    error: err,
    stack: err instanceof Error ? err.stack : undefined,
  });
  return json({ error: { code: "internal", message: `Internal error: ${userMessage(err)}` } }, 500);
}

/** Reads a request body up to `max` bytes (413 beyond). */
async function readBody(req: Request, max: number): Promise<string> {
  const declared = Number(req.headers.get("content-length") ?? "NaN");
  if (declared > max) {
    await req.body?.cancel();
    throw new HttpError(413, "bad_request", `Request body of ${declared} bytes exceeds ${max}`);
  }
  if (!req.body) return "";
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.length;
    if (total > max) {
      await reader.cancel();
      throw new HttpError(413, "bad_request", `Request body exceeds ${max} bytes`);
    }
    chunks.push(value);
  }
  const all = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return new TextDecoder().decode(all);
}

/** Reads a JSON body (413 beyond `max` bytes, 400 when it is not JSON). */
async function readJson(req: Request, max: number): Promise<unknown> {
  const text = await readBody(req, max);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new ApiError(
      "bad_request",
      `Malformed JSON in the request body: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
}

type Route = (req: Request) => Promise<Response>;

/** The methods HTTP defines (RFC 9110 §9 and PATCH): others are answered 501. */
export const KNOWN_METHODS = [
  "GET",
  "HEAD",
  "POST",
  "PUT",
  "DELETE",
  "CONNECT",
  "OPTIONS",
  "TRACE",
  "PATCH",
] as const;

/** Every API path and the methods it serves. */
export const API_ROUTES: Readonly<Record<string, readonly string[]>> = {
  [CNI_CALL_PATH]: ["POST"],
  "/v1/add": ["POST"],
  "/v1/del": ["POST"],
  "/v1/check": ["POST"],
  "/v1/gc": ["POST"],
  "/v1/status": ["GET"],
  "/v1/attachments": ["GET"],
  "/v1/enis": ["GET"],
  "/v1/policy": ["GET"],
  "/v1/healthz": ["GET"],
  "/metrics": ["GET"],
};

/**
 * Whether `method` on `path` is served: null when it is, else the error to answer with
 * (501 for a method HTTP does not define, 404 for an unknown path, 405 with `Allow` for
 * a method the path does not serve). One rule for the handler and for the socket's
 * early answer (which also covers methods a `Request` cannot carry: TRACE, CONNECT).
 */
export function routeError(method: string, path: string): ApiError | null {
  if (!(KNOWN_METHODS as readonly string[]).includes(method)) {
    return new HttpError(
      501,
      "bad_request",
      `Method ${JSON.stringify(method.slice(0, 32))} is not implemented by the enim agent ` +
        `(it serves ${[...new Set(Object.values(API_ROUTES).flat())].join(", ")})`,
    );
  }
  const allowed = API_ROUTES[path];
  if (!allowed) {
    return new HttpError(
      404,
      "not_found",
      `No such API path ${JSON.stringify(path.slice(0, 200))}`,
    );
  }
  if (!allowed.includes(method)) {
    const allow = allowed.join(", ");
    return new HttpError(
      405,
      "bad_request",
      `Method ${method} is not allowed on "${path}" (allowed: ${allow})`,
      { allow },
    );
  }
  return null;
}

/** Builds the API handler over `manager`. */
export function createHandler(opts: HandlerOptions): Handler {
  const m = opts.manager;
  const log = opts.log ?? nullLogger;
  const max = opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const metrics = opts.metrics;

  const api = new LocalAgentClient(m, { addTimeoutMs: opts.addTimeoutMs });

  const routes: Record<keyof typeof API_ROUTES, Record<string, Route>> = {
    [CNI_CALL_PATH]: {
      POST: async (req) => {
        const call = parseRequest(CniCallSchema, await readJson(req, MAX_REQUEST_BYTES));
        // How long the plugin waits (a header an older plugin does not send: then addSeconds).
        const waits = z.safeParse(PluginTimeoutSchema, req.headers.get(TIMEOUT_HEADER) ?? "");
        const answer = (exit: number, stdout: string) =>
          new Response(stdout, {
            status: 200,
            headers: {
              ...JSON_HEADERS,
              [EXIT_HEADER]: String(exit),
              [AGENT_VERSION_HEADER]: VERSION,
            },
          });
        // A plugin of another version (0.1.0's sends none) is served within the skew.
        const plugin = req.headers.get(PLUGIN_VERSION_HEADER) ?? UNLABELLED_PLUGIN_VERSION;
        const skew = skewProblem(plugin, VERSION);
        if (skew) {
          const decoded = decodeStdin(call.stdin);
          const asked = decoded.ok && isPlainObject(decoded.value)
            ? decoded.value.cniVersion
            : undefined;
          const v = typeof asked === "string" ? asked : LATEST_VERSION;
          log.warn("refused a plugin of another version", { plugin, agent: VERSION });
          return answer(1, JSON.stringify(errorObject(v, CNI_CODES.VERSION_SKEW, skew)));
        }
        const { exit, stdout } = await serveCniCall(call, api, waits.data);
        return answer(exit, stdout);
      },
    },
    "/v1/add": { POST: async (req) => json(await api.add(await readJson(req, max))) },
    "/v1/del": {
      POST: async (req) => {
        await api.del(await readJson(req, max));
        return json({});
      },
    },
    "/v1/check": {
      POST: async (req) => {
        await api.check(await readJson(req, max));
        return json({});
      },
    },
    "/v1/gc": { POST: async (req) => json(await api.gc(await readJson(req, max))) },
    "/v1/status": {
      GET: async () => {
        const s = await api.status();
        // A table taken away since the last periodic check is not reported enforced.
        if (opts.policy?.checkTables) {
          await withTimeout(opts.policy.checkTables({ all: true }), STATUS_CHECK_MS);
        }
        return json({
          ...s,
          ...(opts.devicePlugin ? { devicePlugin: opts.devicePlugin() } : {}),
          ...(opts.policy ? { policy: opts.policy.status() } : {}),
          ...(opts.ipvs ? { ipvs: opts.ipvs() } : {}),
        });
      },
    },
    "/v1/policy": {
      GET: (req) => {
        const raw = new URL(req.url).searchParams.get("pod") ?? "";
        const pod = z.safeParse(PodRefSchema, raw);
        if (!pod.success) {
          throw new ApiError(
            "bad_request",
            `Invalid pod ${JSON.stringify(raw.slice(0, 300))}: expected ?pod=<namespace>/<name>`,
          );
        }
        const policy = opts.policy;
        if (!policy) {
          throw new ApiError(
            "not_found",
            "NetworkPolicy enforcement is off on this node (networkPolicy.enabled)",
          );
        }
        if (!policy.synced) {
          throw new ApiError(
            "policy_unavailable",
            "NetworkPolicy: the agent has not synced with the Kubernetes API server yet",
          );
        }
        const view = policy.view(pod.data);
        if (!view) {
          throw new ApiError(
            "not_found",
            `The pod "${pod.data}" has no ENI with a host link on this node, so no NetworkPolicy of enim's`,
          );
        }
        return Promise.resolve(json(view));
      },
    },
    "/v1/attachments": { GET: async () => json({ attachments: await api.attachments() }) },
    "/v1/enis": { GET: async () => json({ enis: await api.enis() }) },
    "/v1/healthz": { GET: () => Promise.resolve(healthResponse(opts.health?.() ?? { ok: true })) },
    "/metrics": {
      GET: async () => {
        if (!metrics) throw new ApiError("not_found", "This agent serves no metrics");
        return new Response(await metrics(), {
          headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
        });
      },
    },
  };

  // One table of paths and methods for the routing rule (also used on the socket): the
  // handlers must serve exactly what it lists.
  for (const path of new Set([...Object.keys(API_ROUTES), ...Object.keys(routes)])) {
    const served = Object.keys(routes[path] ?? {}).sort().join(", ");
    if (served !== [...(API_ROUTES[path] ?? [])].sort().join(", ")) {
      throw new Error(
        `API_ROUTES and the handlers disagree on "${path}": handlers serve ${served}`,
      );
    }
  }

  return async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    const what = `${req.method} ${url.pathname}`;
    const started = performance.now();
    let res: Response;
    try {
      const refused = routeError(req.method, url.pathname);
      if (refused) throw refused;
      res = await routes[url.pathname][req.method](req);
    } catch (err) {
      res = errorResponse(err, log, what);
    }
    if (log.enabled("debug")) {
      log.debug("api request", {
        method: req.method,
        path: url.pathname,
        status: res.status,
        ms: Math.round((performance.now() - started) * 100) / 100,
      });
    }
    return res;
  };
}

/** A liveness answer: 200 `{ok: true}`, or 503 `{ok: false, reason}` when the agent is wedged. */
export function healthResponse(h: Health): Response {
  return json(h, h.ok ? 200 : 503);
}

/** Another agent already answers on the socket. */
export class SocketInUseError extends Error {
  readonly socketPath: string;
  constructor(socketPath: string) {
    super(
      `Another enim agent is already serving "${socketPath}": stop it first ` +
        `(a stale socket from a dead agent would have been replaced)`,
    );
    this.name = "SocketInUseError";
    this.socketPath = socketPath;
  }
}

/** A running API server. */
export interface UnixServer {
  readonly path: string;
  /** Stops accepting, waits for in-flight requests, removes the socket file. Idempotent. */
  shutdown(): Promise<void>;
  /** Settles when the server has stopped. */
  readonly finished: Promise<void>;
  /** Connections open now. */
  readonly connections: number;
}

/**
 * Readies `socketPath` for listening: makes its directory 0700 (creating it),
 * replaces a stale socket (nobody answers a connect), refuses a live one with
 * {@linkcode SocketInUseError} and refuses a path that is not a socket.
 */
export async function prepareSocketPath(socketPath: string, log: Logger = nullLogger) {
  // Root only, whatever the umask or whoever made it (a hostPath directory is 0755).
  await privateDir(dirname(socketPath));

  let st: Deno.FileInfo;
  try {
    st = await Deno.lstat(socketPath);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return;
    throw err;
  }
  if (!st.isSocket) {
    throw new Error(`Cannot listen on "${socketPath}": it exists and is not a socket`);
  }
  try {
    const conn = await Deno.connect({ transport: "unix", path: socketPath });
    conn.close();
  } catch (err) {
    if (err instanceof Deno.errors.NotCapable || err instanceof Deno.errors.PermissionDenied) {
      throw err;
    }
    log.info("replacing a stale socket left by a dead agent", { socket: socketPath });
    await Deno.remove(socketPath);
    return;
  }
  throw new SocketInUseError(socketPath);
}

/** Options for {@linkcode serveUnix}. */
export interface ServeUnixOptions {
  log?: Logger;
  /** The most connections served at once (default 64); one more is answered 503. */
  maxConnections?: number;
  /** How long a client has to send its whole request (default 10 s); then 408. */
  requestTimeoutMs?: number;
}

/**
 * Serves `handler` on the unix socket `socketPath` (mode 0600, directory 0700).
 * A stale socket is replaced; a live one is refused with {@linkcode SocketInUseError}.
 *
 * HTTP is framed by `lib/http1_server.ts` (one request per connection, as every enim
 * client sends), which bounds what a client can hold: its whole request within
 * `requestTimeoutMs`, at most `maxConnections` at once.
 */
export async function serveUnix(
  socketPath: string,
  handler: Handler,
  opts: ServeUnixOptions = {},
): Promise<UnixServer> {
  const log = opts.log ?? nullLogger;
  await prepareSocketPath(socketPath, log);
  const listener = Deno.listen({ transport: "unix", path: socketPath });
  let inode: number | null = null;
  try {
    await Deno.chmod(socketPath, 0o600);
    inode = (await Deno.lstat(socketPath)).ino;
  } catch (err) {
    listener.close();
    throw err;
  }
  const server = serveHttp1(listener, async (req) => {
    try {
      return await handler(req);
    } catch (err) {
      return errorResponse(err, log, "request");
    }
  }, {
    precheck: (method, target) => {
      const refused = routeError(method, new URL(target, "http://enim").pathname);
      return refused && errorResponse(refused, log, `${method} ${target.slice(0, 200)}`);
    },
    maxConnections: opts.maxConnections ?? 64,
    requestTimeoutMs: opts.requestTimeoutMs ?? 10_000,
    maxBodyBytes: MAX_REQUEST_BYTES,
    onError: (err) => log.warn("an API connection failed", { error: err }),
  });
  log.info("serving the API", { socket: socketPath });
  let stopping: Promise<void> | undefined;
  const shutdown = () => {
    stopping ??= (async () => {
      await server.shutdown();
      try {
        // Remove the socket only if it is still ours (not a successor's).
        if ((await Deno.lstat(socketPath)).ino === inode) await Deno.remove(socketPath);
      } catch { /* already gone */ }
    })();
    return stopping;
  };
  return {
    path: socketPath,
    shutdown,
    finished: server.finished,
    get connections() {
      return server.connections;
    },
  };
}
