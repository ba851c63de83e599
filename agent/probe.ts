/**
 * The agent's own probe socket (`health.probeSocket`, `--probe-socket`): kubelet's
 * startup, liveness and readiness probes of this one agent process (`enim probe`), from
 * the moment it starts, also while it waits as a standby for another agent's lock.
 *
 * Why a socket of its own: the DaemonSet hands a node over with a surge (`maxSurge: 1`):
 * the new pod starts while the old agent still serves, installs its plugin and waits for
 * the lock; the old pod is deleted only once the new one is Ready. Both live in the node's
 * network namespace and share `/run/enim`, so a probe through the TCP port or the API
 * socket would be answered by whichever agent serves there, the old one (0.1.0 serves no
 * `/healthz` at all). The probe socket sits in the pod's own folder (an `emptyDir`), so a
 * probe always reaches its own container's agent.
 *
 * | phase | from | `GET /healthz` (startup, liveness) | `GET /readyz` (readiness) |
 * | --- | --- | --- | --- |
 * | `standby` | another agent holds the lock | 200 | 200: ready to take the node over |
 * | `starting` | the lock held: state, provider, reconcile | 200 | 503 |
 * | `serving` | the API answers | the agent's liveness (`health.ts`) | 200 while ready (what `enim status` says), else 503 |
 * | `stopping` | SIGTERM | 200 | 503 |
 *
 * @module
 */
import { dirname } from "node:path";
import { serveHttp1 } from "../lib/http1_server.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import type { Health } from "./health.ts";
import { prepareSocketPath } from "./server.ts";

/** Where the agent is in its life, as its probes see it (the table above). */
export type ProbePhase = "standby" | "starting" | "serving" | "stopping";

/** The paths the probe socket serves, GET (and HEAD) only. */
export const PROBE_PATHS = ["/healthz", "/readyz"] as const;

/** What the probe socket reads on each request. */
export interface ProbeSources {
  phase(): ProbePhase;
  /** The agent's liveness once serving (`health.ts`). */
  health?(): Health;
  /** Whether the serving agent is ready (its `GET /v1/status` `ready`). */
  ready?(): boolean;
}

/** What `GET /healthz` and `GET /readyz` answer on the probe socket. */
export interface ProbeAnswer {
  ok: boolean;
  phase: ProbePhase;
  reason?: string;
}

/** The answer to `path` in the agent's present phase (the table in the module doc). */
export function probeAnswer(path: (typeof PROBE_PATHS)[number], s: ProbeSources): ProbeAnswer {
  const phase = s.phase();
  if (path === "/healthz") {
    const h = phase === "serving" && s.health ? s.health() : { ok: true };
    return { ok: h.ok, phase, ...(h.reason ? { reason: h.reason } : {}) };
  }
  if (phase === "standby") return { ok: true, phase };
  if (phase === "serving" && (s.ready?.() ?? true)) return { ok: true, phase };
  const reason = phase === "serving"
    ? "The agent has not reconciled the node yet"
    : phase === "starting"
    ? "The agent holds the node's lock and is starting (state, provider, reconcile)"
    : "The agent is stopping";
  return { ok: false, phase, reason };
}

const JSON_TYPE = { "content-type": "application/json" };

/** The response to one request on the probe socket. */
export function probeResponse(method: string, target: string, s: ProbeSources): Response {
  const path = new URL(target, "http://enim").pathname;
  if (!(PROBE_PATHS as readonly string[]).includes(path)) {
    return new Response(
      JSON.stringify({ ok: false, reason: `No such path: this socket serves ${PROBE_PATHS}` }),
      { status: 404, headers: JSON_TYPE },
    );
  }
  if (method !== "GET" && method !== "HEAD") {
    return new Response(
      JSON.stringify({ ok: false, reason: `Method ${method.slice(0, 32)} is not allowed` }),
      { status: 405, headers: { ...JSON_TYPE, allow: "GET, HEAD" } },
    );
  }
  const a = probeAnswer(path as (typeof PROBE_PATHS)[number], s);
  return new Response(JSON.stringify(a), { status: a.ok ? 200 : 503, headers: JSON_TYPE });
}

/** A running probe socket. */
export interface ProbeServer {
  readonly path: string;
  /** Stops answering and removes the socket. Idempotent. */
  shutdown(): Promise<void>;
}

/**
 * Serves the probe paths on the unix socket `path` (mode 0600, its folder 0700; a stale
 * socket of this pod's previous container is replaced).
 */
export async function serveProbe(
  path: string,
  sources: ProbeSources,
  log: Logger = nullLogger,
): Promise<ProbeServer> {
  await prepareSocketPath(path, log);
  const listener = Deno.listen({ transport: "unix", path });
  try {
    await Deno.chmod(path, 0o600);
  } catch (err) {
    listener.close();
    throw err;
  }
  const server = serveHttp1(listener, (req) => {
    const url = new URL(req.url);
    return Promise.resolve(probeResponse(req.method, url.pathname, sources));
  }, {
    precheck: (method, target) => {
      const path = new URL(target, "http://enim").pathname;
      return (PROBE_PATHS as readonly string[]).includes(path) &&
          (method === "GET" || method === "HEAD")
        ? null
        : probeResponse(method, target, sources);
    },
    maxConnections: 8,
    requestTimeoutMs: 5_000,
    maxBodyBytes: 0,
    onError: (err) => log.debug("a probe connection failed", { error: err }),
  });
  log.info("serving the agent's probes", { socket: path, folder: dirname(path) });
  let stopping: Promise<void> | undefined;
  return {
    path,
    shutdown() {
      stopping ??= (async () => {
        await server.shutdown();
        await Deno.remove(path).catch(() => {});
      })();
      return stopping;
    },
  };
}
