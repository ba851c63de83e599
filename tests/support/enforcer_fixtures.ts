/**
 * What the unit tests of the NetworkPolicy enforcer and of the reuse wait share (no root):
 * the test API server over its own PKI, enim's Kube client of it with short backoffs, the
 * manager's description of a pod (`PolicyPod`), and a bounded wait for a condition. The
 * server side is `kube_apiserver.ts` (built from the Kubernetes API, not from enim's code);
 * only the client here is enim's.
 *
 * @module
 */
import { assert } from "../../lib/assert.ts";
import { poll } from "../../lib/async.ts";
import type { Logger } from "../../lib/log.ts";
import { Kube } from "../../kube/mod.ts";
import type { PolicyPod } from "../../manager/types.ts";
import { KubeApiServer } from "./kube_apiserver.ts";
import { makeTestPki } from "./kube_pki.ts";

/** Backoffs of a test's client: a relist after 20–100 ms; lists of 50 objects a page. */
export const FAST_KUBE = { backoff: { initialMs: 20, maxMs: 100 }, pageSize: 50 };

/** Runs `fn` with a new test API server (its PKI made for it); both go at the end. */
export async function withTestApiServer<T>(fn: (server: KubeApiServer) => Promise<T>): Promise<T> {
  const pki = await makeTestPki();
  const server = KubeApiServer.start({ pki });
  try {
    return await fn(server);
  } finally {
    await server.close();
    await Deno.remove(pki.dir, { recursive: true });
  }
}

/** enim's client of `server` as node `n1` (a bearer token), with {@linkcode FAST_KUBE}. */
export function testKube(
  server: KubeApiServer,
  opts: { log?: Logger; pageSize?: number } = {},
): Kube {
  return new Kube(
    {
      server: server.url,
      caCerts: [server.pki.caCert],
      token: { value: "test-token" },
      source: "t",
    },
    "n1",
    { ...FAST_KUBE, ...opts },
  );
}

/**
 * The manager's description of pod `pod` (`namespace/name`) at ADD: one IPv4 address,
 * its ENI as eth0, its node end `end` (and `c-<end>/eth0` as its attachment's key), the
 * node at 10.0.0.254.
 */
export const policyPod = (pod: string, ip: string, end: string): PolicyPod => ({
  pod,
  key: `c-${end}/eth0`,
  addresses: { ipv4: ip },
  eniIfName: "eth0",
  nodeIfName: end,
  nodeAddresses: ["10.0.0.254"],
});

/** Waits until `check` holds, polling every 10 ms for up to 10 s; fails naming `what`. */
export async function until(what: string, check: () => unknown): Promise<void> {
  const ok = await poll(() => Promise.resolve(check() ? true : null), {
    timeoutMs: 10_000,
    intervalMs: 10,
  });
  assert(ok, `Timed out waiting for ${what}`);
}
