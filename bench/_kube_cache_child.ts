/**
 * The cache process of bench/kube_cache.ts. It prints one JSON line per phase and waits
 * for a line on stdin before the next, so the parent can read this process's
 * /proc/<pid>/status in between (a process with the enim permission set may not read its
 * own): `ready` (nothing started), `synced` (pods, namespaces and NetworkPolicies listed
 * from the server named in the arguments, URL and CA PEM), `gc` (after a full collection).
 *
 * @module
 */
import { Kube } from "../kube/mod.ts";

const stdin = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
async function phase(name: string, data: Record<string, unknown> = {}): Promise<void> {
  const m = Deno.memoryUsage();
  const mb = (n: number) => Math.round(n / 1048576 * 10) / 10;
  console.log(JSON.stringify({
    phase: name,
    heapUsedMB: mb(m.heapUsed),
    heapTotalMB: mb(m.heapTotal),
    externalMB: mb(m.external),
    ...data,
  }));
  await stdin.read();
}

const [url, ca, pageSize] = Deno.args;
await phase("ready");
const kube = new Kube(
  { server: url, caCerts: [ca], token: { value: "test-token" }, source: "bench" },
  "node-1",
  { pageSize: Number(pageSize ?? 500) },
);
const t0 = performance.now();
const synced = await Promise.all([
  kube.pods.waitSynced(600_000),
  kube.namespaces.waitSynced(600_000),
  kube.networkPolicies.waitSynced(600_000),
]);
await phase("synced", {
  synced: synced.every(Boolean),
  syncMs: Math.round(performance.now() - t0),
  cached: {
    pods: kube.pods.size,
    namespaces: kube.namespaces.size,
    networkPolicies: kube.networkPolicies.size,
  },
});
(globalThis as { gc?: () => void }).gc?.();
await phase("gc");
await kube.close();
