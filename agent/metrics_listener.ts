/**
 * The agent's TCP listener (`metrics` in the agent config): `GET /metrics` for Prometheus
 * and `GET /healthz` for kubelet's liveness probe, on an address and port of the node.
 * Nothing else: the API that changes the node (ADD, DEL, GC) and the one that shows its
 * pods stay on the root-only unix socket. Framed by `lib/http1_server.ts` like the socket,
 * with its own small bounds (a scrape and a probe are one short request each).
 *
 * @module
 */
import { serveHttp1 } from "../lib/http1_server.ts";
import { type Logger, nullLogger } from "../lib/log.ts";
import type { Health } from "./health.ts";
import { healthResponse, type MetricsSource } from "./server.ts";

/** The paths the TCP listener serves, each for GET (and HEAD) only. */
export const TCP_PATHS = ["/metrics", "/healthz"] as const;

/** What the TCP listener serves. */
export interface TcpSources {
  metrics: MetricsSource;
  health: () => Health;
}

/** Options of {@linkcode serveMetricsTcp}. */
export interface MetricsListenerOptions {
  /** The address to bind (`metrics.address`). */
  address: string;
  /** The port (`metrics.port`). */
  port: number;
  log?: Logger;
  /** How long a client has to send its request (the API's `requestTimeoutSeconds`). */
  requestTimeoutMs?: number;
  /** The most connections at once (default 16); one more is answered 503. */
  maxConnections?: number;
}

/** A running TCP listener. */
export interface MetricsListener {
  /** The address and port it listens on. */
  readonly address: string;
  readonly port: number;
  /** Stops accepting and waits for the requests in flight. Idempotent. */
  shutdown(): Promise<void>;
}

const TEXT = { "content-type": "text/plain; charset=utf-8" };

/** The refusal of a request the TCP listener does not serve (404, 405), or null. */
export function tcpRefusal(method: string, path: string): Response | null {
  if (!(TCP_PATHS as readonly string[]).includes(path)) {
    return new Response(`No such path here: this port serves ${TCP_PATHS.join(" and ")}\n`, {
      status: 404,
      headers: TEXT,
    });
  }
  if (method !== "GET" && method !== "HEAD") {
    return new Response(`Method ${method.slice(0, 32)} is not allowed here (allowed: GET)\n`, {
      status: 405,
      headers: { ...TEXT, allow: "GET, HEAD" },
    });
  }
  return null;
}

/** The answer to one request on the TCP listener. */
export async function tcpHandler(req: Request, sources: TcpSources): Promise<Response> {
  const path = new URL(req.url).pathname;
  const refused = tcpRefusal(req.method, path);
  if (refused) return refused;
  if (path === "/healthz") return healthResponse(sources.health());
  return new Response(await sources.metrics(), {
    headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
  });
}

/**
 * Listens on `address:port` (TCP) and serves {@linkcode TCP_PATHS}. Throws when the
 * address cannot be bound (in use, not the node's), naming it.
 */
export function serveMetricsTcp(sources: TcpSources, o: MetricsListenerOptions): MetricsListener {
  const log = o.log ?? nullLogger;
  let listener: Deno.TcpListener;
  try {
    listener = Deno.listen({ transport: "tcp", hostname: o.address, port: o.port });
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw new Error(
      `Cannot listen on ${hostPort(o.address, o.port)} for metrics and health (metrics.address, ` +
        `metrics.port): ${why}`,
      { cause: err },
    );
  }
  const server = serveHttp1(listener, (req) => tcpHandler(req, sources), {
    // Refused before any body is read: a request this port does not serve.
    precheck: (method, target) => tcpRefusal(method, new URL(target, "http://enim").pathname),
    maxConnections: o.maxConnections ?? 16,
    requestTimeoutMs: o.requestTimeoutMs ?? 10_000,
    maxBodyBytes: 0,
    onError: (err) => log.debug("a metrics connection failed", { error: err }),
  });
  const port = listener.addr.port;
  log.info("serving metrics and health over TCP", {
    address: hostPort(o.address, port),
    paths: [...TCP_PATHS],
  });
  let stopping: Promise<void> | undefined;
  return {
    address: o.address,
    port,
    shutdown() {
      stopping ??= server.shutdown();
      return stopping;
    },
  };
}

/** `a.b.c.d:port`, or `[v6]:port`. */
function hostPort(address: string, port: number): string {
  return address.includes(":") ? `[${address}]:${port}` : `${address}:${port}`;
}
