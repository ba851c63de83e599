/**
 * The Kubernetes cache at scale: 30,000 pods (full objects, ~3.5 KB of JSON each, in
 * 300 namespaces on 500 nodes), 3,000 NetworkPolicies and the 300 namespaces, listed from
 * the test API server (tests/support/kube_apiserver.ts) into kube/'s caches. A check to
 * run by hand, not a test: it prints the sync time and the cache process's memory.
 *
 *     deno run -A --config tests/deno.json bench/kube_cache.ts [--pods N] [--policies N]
 *       [--namespaces N] [--nodes N] [--page-size N]
 *
 * The server runs in this process; the caches run in a child process started as the
 * agent runs (the V8 flags of scripts/build.ts, MALLOC_ARENA_MAX=2 as the systemd unit
 * sets, exactly the `enim` permission set, plus `--expose-gc` for one reading after a
 * full collection), so its numbers are the cache's alone.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { V8_FLAGS } from "../scripts/build.ts";
import { permissionFlags } from "../scripts/_permissions.ts";
import { procStatus } from "./_proc.ts";
import { makeTestPki } from "../tests/support/kube_pki.ts";
import { KubeApiServer, type Obj } from "../tests/support/kube_apiserver.ts";
import { makeNamespace, makeNetworkPolicy, makePod } from "../tests/support/kube_objects.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    pods: { type: "string", default: "30000" },
    policies: { type: "string", default: "3000" },
    namespaces: { type: "string", default: "300" },
    nodes: { type: "string", default: "500" },
    "page-size": { type: "string", default: "500" },
  },
});
const pods = Number(values.pods);
const policies = Number(values.policies);
const namespaces = Number(values.namespaces);
const nodes = Number(values.nodes);

/** The namespace of the `i`th object. */
const nsOf = (i: number, namespaces: number) => `team-${i % namespaces}`;

/** `pods` full pods spread over the namespaces and nodes, each with its own IPv4 address. */
function* podObjects(pods: number, namespaces: number, nodes: number): Generator<Obj> {
  for (let i = 0; i < pods; i++) {
    yield makePod({
      namespace: nsOf(i, namespaces),
      name: `app-${Math.floor(i / namespaces)}-${(i * 2654435761 >>> 0).toString(36).slice(0, 5)}`,
      labels: {
        app: `app-${i % 50}`,
        "app.kubernetes.io/part-of": `svc-${i % 20}`,
        "pod-template-hash": (i % 997).toString(16),
      },
      nodeName: `node-${i % nodes}`,
      ip: `10.${64 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`,
    });
  }
}

/** VmRSS and VmHWM of process `pid`, in MB. */
async function memoryOf(pid: number): Promise<{ rssMB: number; hwmMB: number }> {
  const vm = await procStatus(pid);
  const mb = (kb: number) => Math.round(kb / 1024 * 10) / 10;
  return { rssMB: mb(vm.VmRSS), hwmMB: mb(vm.VmHWM) };
}

const pki = await makeTestPki();
const server = KubeApiServer.start({ pki });
try {
  const t0 = performance.now();
  server.load(
    "namespaces",
    Array.from(
      { length: namespaces },
      (_, i) => makeNamespace(nsOf(i, namespaces), { team: `t${i % 7}` }),
    ),
  );
  server.load("pods", podObjects(pods, namespaces, nodes));
  server.load(
    "networkpolicies",
    Array.from(
      { length: policies },
      (_, i) =>
        makeNetworkPolicy(nsOf(i, namespaces), `allow-${i}`, {
          to: { app: `app-${i % 50}` },
          fromApp: `app-${(i + 1) % 50}`,
          port: 8000 + (i % 100),
          cidr: "10.0.0.0/8",
        }),
    ),
  );
  console.error(
    `server: ${pods} pods, ${policies} policies, ${namespaces} namespaces loaded in ${
      Math.round(performance.now() - t0)
    } ms`,
  );

  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--no-prompt",
      "--config",
      new URL("../tests/deno.json", import.meta.url).pathname,
      `--v8-flags=${[...V8_FLAGS, "--expose-gc"].join(",")}`,
      ...permissionFlags(),
      new URL("./_kube_cache_child.ts", import.meta.url).pathname,
      server.url,
      pki.caCert,
      values["page-size"],
    ],
    env: { MALLOC_ARENA_MAX: "2" },
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const writer = child.stdin.getWriter();
  let buffer = "";
  const phases: Record<string, unknown> = {};
  while (Object.keys(phases).length < 3) {
    const nl = buffer.indexOf("\n");
    if (nl < 0) {
      const { value, done } = await lines.read();
      if (done) throw new Error("The cache process ended early");
      buffer += value;
      continue;
    }
    const p = JSON.parse(buffer.slice(0, nl));
    buffer = buffer.slice(nl + 1);
    phases[p.phase] = { ...p, ...await memoryOf(child.pid) };
    await writer.write(new TextEncoder().encode("\n"));
  }
  await writer.close();
  while (!(await lines.read()).done) { /* drain */ }
  await child.status;
  const lists = server.requests.filter((q) => !q.watch).length;
  console.log(
    JSON.stringify(
      {
        pods,
        policies,
        namespaces,
        pageSize: Number(values["page-size"]),
        listRequests: lists,
        ...phases,
      },
      null,
      2,
    ),
  );
} finally {
  await server.close();
  await Deno.remove(pki.dir, { recursive: true });
}
