/**
 * The test API server (tests/support/kube_apiserver.ts) seen from a simulated node: the
 * server listens on 127.0.0.1 of the test's own namespace, which a node's namespace
 * cannot reach; a unix socket can (it is a file). This bridge listens on a unix socket
 * and copies each connection to the server's port (its relay, so `down()`, `up()` and
 * `cut()` act on the node's connections too), and a {@linkcode LoopbackRelay} inside each
 * node's namespace listens on 127.0.0.1 there. {@linkcode kubeconfigFor} writes the
 * kubeconfig an agent on that node reads: the server at that port, the test CA, the
 * bearer token. No address or route is added to any namespace.
 *
 * @module
 */
import { stringify } from "yaml";
import { splice } from "./splice.ts";
import { LoopbackRelay } from "./loopback_relay.ts";
import type { KubeApiServer } from "./kube_apiserver.ts";

/** What the bridge forwards to: an API server at `https://127.0.0.1:<port>`. */
export type BridgeTarget = Pick<KubeApiServer, "url">;

/** A unix-socket front of the test API server, and relays into nodes' namespaces. */
export class KubeBridge implements AsyncDisposable {
  /** The unix socket. */
  readonly path: string;
  readonly #server: BridgeTarget;
  readonly #listener: Deno.UnixListener;
  readonly #conns = new Set<Deno.Conn>();
  readonly #pipes = new Set<Promise<void>>();
  readonly #relays: LoopbackRelay[] = [];
  readonly #accepting: Promise<void>;

  private constructor(server: BridgeTarget, path: string) {
    this.#server = server;
    this.path = path;
    const listener = Deno.listen({ transport: "unix", path });
    this.#listener = listener;
    this.#accepting = (async () => {
      try {
        for await (const conn of listener) this.#pipe(conn);
      } catch { /* closed */ }
    })();
  }

  /** Listens on a new unix socket in front of `server` (the test API server, or a real one). */
  static start(server: BridgeTarget): KubeBridge {
    return new KubeBridge(server, `/tmp/enim-kube-${crypto.randomUUID().slice(0, 8)}.sock`);
  }

  #pipe(conn: Deno.Conn): void {
    const port = Number(new URL(this.#server.url).port);
    const p = splice(conn, async () => {
      const up = await Deno.connect({ hostname: "127.0.0.1", port });
      up.setNoDelay(true);
      return up;
    }, this.#conns);
    this.#pipes.add(p);
    p.finally(() => this.#pipes.delete(p));
  }

  /**
   * A relay in the node namespace `netns` (a name); returns its port at `hostname` there
   * (default 127.0.0.1).
   */
  async into(netns: string, hostname?: string): Promise<number> {
    const relay = await LoopbackRelay.start(netns, this.path, hostname);
    this.#relays.push(relay);
    return relay.port;
  }

  /** Stops the relays and the bridge. */
  async close(): Promise<void> {
    for (const r of this.#relays.splice(0)) await r.close().catch(() => {});
    try {
      this.#listener.close();
    } catch { /* closed */ }
    await this.#accepting;
    for (const c of [...this.#conns]) {
      try {
        c.close();
      } catch { /* closed */ }
    }
    await Promise.all([...this.#pipes]);
    await Deno.remove(this.path).catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/**
 * A kubeconfig for the test API server at `https://127.0.0.1:<port>`, in YAML as kubeadm,
 * kubectl and managed clusters write it (the shipped agent once died on YAML while every
 * end-to-end test gave it JSON: issue 41).
 */
export function kubeconfigFor(server: KubeApiServer, port: number, token = "test-token"): string {
  const ca = btoa(server.pki.caCert);
  return stringify(
    {
      apiVersion: "v1",
      kind: "Config",
      clusters: [{
        name: "test",
        cluster: { server: `https://127.0.0.1:${port}`, "certificate-authority-data": ca },
      }],
      users: [{ name: "enim", user: { token } }],
      contexts: [{ name: "test", context: { cluster: "test", user: "enim" } }],
      "current-context": "test",
    },
  );
}
