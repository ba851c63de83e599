/**
 * What one agent costs the Kubernetes API server, measured on the test API server
 * (tests/support/kube_apiserver.ts, which answers lists as kube-apiserver does: from its
 * watch cache or from etcd, and records each answer's bytes), and scaled on paper to a
 * cluster of many nodes, each running one agent. A check to run by hand, not a test:
 *
 *     deno run -A --config tests/deno.json bench/kube_api_cost.ts [--pods N] [--namespaces N]
 *       [--policies N] [--watch-cache true|false]
 *
 * One agent's caches (kube/: pods, namespaces, NetworkPolicies) run in this process
 * against the server holding full pods (~3.5 KB of JSON each, the shape of
 * bench/kube_cache.ts); it prints:
 *
 * - the start: list requests per kind, where they were served from, their bytes;
 * - a pod's life as its watch carries it to every agent: the created, scheduled,
 *   address, ready, deleting and deleted writes, the bytes of each event;
 * - a bookmark's bytes, and the watch requests and bookmarks per hour (watches end
 *   after a random 1–2 × `watchTimeoutSeconds`, 450 s on average; one bookmark a minute);
 * - the same scaled to 500 and 5,000 nodes with `--pods-per-node` pods each (default 6:
 *   5,000 nodes × 30,000 pods, issue 42).
 *
 * @module
 */
import { parseArgs } from "node:util";
import { makeTestPki } from "../tests/support/kube_pki.ts";
import { KubeApiServer, type Obj } from "../tests/support/kube_apiserver.ts";
import { makeNamespace, makeNetworkPolicy, makePod } from "../tests/support/kube_objects.ts";
import { Kube } from "../kube/mod.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    pods: { type: "string", default: "3000" },
    namespaces: { type: "string", default: "300" },
    policies: { type: "string", default: "300" },
    "pods-per-node": { type: "string", default: "6" },
    "watch-cache": { type: "string", default: "true" },
  },
});
const N = {
  pods: Number(values.pods),
  namespaces: Number(values.namespaces),
  policies: Number(values.policies),
  podsPerNode: Number(values["pods-per-node"]),
};
const nsOf = (i: number) => `team-${i % N.namespaces}`;

function pod(i: number, o: { node?: boolean; ip?: boolean; phase?: string } = {}): Obj {
  return makePod({
    namespace: nsOf(i),
    name: `app-${i}`,
    labels: { app: `app-${i % 50}`, "pod-template-hash": (i % 997).toString(16) },
    nodeName: o.node === false ? undefined : `node-${i % 500}`,
    ip: o.ip === false ? undefined : `10.${64 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`,
    phase: o.phase,
  });
}

/** `n` with its unit (B, KB, MB, GB, TB), decimal. */
function size(n: number): string {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let u = 0;
  while (n >= 1000 && u < units.length - 1) {
    n /= 1000;
    u++;
  }
  return `${n >= 100 ? Math.round(n) : Math.round(n * 10) / 10} ${units[u]}`;
}

const pki = await makeTestPki();
const server = KubeApiServer.start({ pki, watchCache: values["watch-cache"] !== "false" });
const kube = new Kube(
  { server: server.url, caCerts: [pki.caCert], token: { value: "test-token" }, source: "bench" },
  "node-1",
);
try {
  server.load("namespaces", Array.from({ length: N.namespaces }, (_, i) => makeNamespace(nsOf(i))));
  server.load("pods", Array.from({ length: N.pods }, (_, i) => pod(i)));
  server.load(
    "networkpolicies",
    Array.from({ length: N.policies }, (_, i) =>
      makeNetworkPolicy(nsOf(i), `allow-${i}`, {
        to: { app: `app-${i % 50}` },
        fromApp: `app-${(i + 1) % 50}`,
        port: 8000 + (i % 100),
      })),
  );
  const synced = await Promise.all(
    [kube.pods, kube.namespaces, kube.networkPolicies].map((c) => c.waitSynced(300_000)),
  );
  if (!synced.every(Boolean)) throw new Error("The caches did not sync");
  const start: Record<string, { requests: number; source: string[]; bytes: number }> = {};
  for (const r of server.requests.filter((r) => !r.watch)) {
    const kind = r.path.split("/").at(-1)!;
    const s = start[kind] ??= { requests: 0, source: [], bytes: 0 };
    s.requests++;
    if (r.source && !s.source.includes(r.source)) s.source.push(r.source);
    s.bytes += r.bytes;
  }
  const deadline = Date.now() + 30_000;
  while (server.watchCount() < 3 && Date.now() < deadline) {
    await new Promise((ok) => setTimeout(ok, 20));
  }
  const podWatch = () =>
    server.requests.filter((r) => r.watch && r.path === "/api/v1/pods").at(-1)!;
  /** The bytes the pods watch carried for `write` (waits until the cache has it). */
  const eventBytes = async (write: () => void, seen: () => boolean): Promise<number> => {
    const w = podWatch();
    const before = w.bytes;
    write();
    const until = Date.now() + 10_000;
    while (!seen() && Date.now() < until) await new Promise((ok) => setTimeout(ok, 5));
    return w.bytes - before;
  };
  const i = N.pods + 1;
  const key = `${nsOf(i)}/app-${i}`;
  const deleting = (): Obj => {
    const p = pod(i);
    p.metadata.deletionTimestamp = "2026-01-01T00:10:00Z";
    p.metadata.deletionGracePeriodSeconds = 30;
    return p;
  };
  const rvOf = () => kube.pods.get(key)?.metadata.resourceVersion;
  const step = async (write: () => Obj | void) => {
    const before = rvOf();
    return await eventBytes(() => write(), () => rvOf() !== before);
  };
  const life = {
    created: await step(() =>
      server.put("pods", pod(i, { node: false, ip: false, phase: "Pending" }))
    ),
    scheduled: await step(() => server.put("pods", pod(i, { ip: false, phase: "Pending" }))),
    address: await step(() => server.put("pods", pod(i, { phase: "Pending" }))),
    ready: await step(() => server.put("pods", pod(i))),
    deleting: await step(() => server.put("pods", deleting())),
    deleted: await eventBytes(
      () => server.remove("pods", nsOf(i), `app-${i}`),
      () => kube.pods.get(key) === undefined,
    ),
  };
  const lifeBytes = Object.values(life).reduce((a, b) => a + b, 0);
  const w = podWatch();
  const before = w.bytes;
  server.bookmark();
  const bookmarkDeadline = Date.now() + 10_000;
  while (kube.pods.stats().bookmarks < 1 && Date.now() < bookmarkDeadline) {
    await new Promise((ok) => setTimeout(ok, 5));
  }
  const bookmarkBytes = w.bytes - before;
  const perHour = { watchRequests: 3 * 3600 / 450, bookmarks: 3 * 60 };
  const listBytes = Object.values(start).reduce((a, s) => a + s.bytes, 0);
  const scaled = [500, 5000].map((nodes) => {
    const pods = nodes * N.podsPerNode;
    // The lists grow with the cluster's pods; every agent lists once at its start.
    const podList = start.pods.bytes / N.pods * pods;
    const agentList = listBytes - start.pods.bytes + podList;
    // Paged from etcd, the pods' list grows by a page per 500 pods; from the cache it is one.
    const fromEtcd = (k: string) => start[k].source.includes("etcd");
    const podRequests = fromEtcd("pods") ? Math.ceil(pods / 500) : start.pods.requests;
    const others = Object.entries(start).filter(([k]) => k !== "pods");
    const otherRequests = others.reduce((n, [, s]) => n + s.requests, 0);
    const otherEtcd = others.reduce((n, [k, s]) => n + (fromEtcd(k) ? s.requests : 0), 0);
    return {
      nodes,
      pods,
      "every agent's start (a DaemonSet rollout)": {
        listRequests: nodes * (podRequests + otherRequests),
        etcdReads: nodes * ((fromEtcd("pods") ? podRequests : 0) + otherEtcd),
        bytes: size(nodes * agentList),
      },
      "one pod's life (every agent hears each event)": size(nodes * lifeBytes),
      "one pod event": size(nodes * life.ready),
      "watch requests per second": Math.round(nodes * perHour.watchRequests / 3600 * 10) / 10,
      "bookmarks per second": Math.round(nodes * perHour.bookmarks / 3600),
      "bookmark bytes per second": size(nodes * perHour.bookmarks / 3600 * bookmarkBytes),
    };
  });
  console.log(JSON.stringify(
    {
      server: { ...N, watchCache: values["watch-cache"] !== "false" },
      agentStart: Object.fromEntries(
        Object.entries(start).map(([k, s]) => [k, { ...s, bytes: size(s.bytes) }]),
      ),
      podBytes: Math.round(start.pods.bytes / N.pods),
      podLifeEventBytes: life,
      bookmarkBytes,
      perAgentPerHour: perHour,
      scaled,
    },
    null,
    2,
  ));
} finally {
  await kube.close();
  await server.close();
  await Deno.remove(pki.dir, { recursive: true });
}
