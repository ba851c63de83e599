/**
 * NetworkPolicy at cluster scale, with the real agent (a check to run by hand, as root; not
 * a test): the test API server (tests/support/kube_apiserver.ts) holds 30,000 full pods in
 * 300 namespaces, 3,000 NetworkPolicies and the namespaces; a simulated node's agent (the
 * shipped bundle, the production permission set, reading the server through the test
 * bridge) enforces them for 50 local enim pods (real ENIs, host links, nftables). It prints:
 *
 * - the first sync: from the agent's start to its status saying `synced`, and its VmHWM;
 * - the ADD of the 50 local pods with policy on (each waits for its pod's node chains);
 * - watch events: pod label changes elsewhere in the cluster, namespace label changes,
 *   policy changes in the local pods' namespaces, one at a time, each timed from the
 *   write to the agent's status showing it enforced (polled every 5 ms: an upper bound
 *   that includes the watch's delivery), and the agent's own histogram
 *   (`enim_policy_enforcement_seconds`: arrival to enforcement);
 * - CPU per event: a burst of events, the agent's CPU time over it divided by their number;
 * - ADD p50 with policy on (pods the policies select, whose tables hold sets of thousands
 *   of members; and pods no policy selects) and off (the agent restarted with
 *   `networkPolicy.enabled: false`), CNI ADD as a runtime calls it, DEL between, with the
 *   ADD's phases (means, from the agent's metrics); back to back (each ADD shares the
 *   CPUs with what the DEL before it left running: the device's way home and, with
 *   policy, the other pods' set edits), and settled (each ADD 300 ms after that DEL). In
 *   `--rounds` rounds whose halves alternate (on, off; off, on; …): the machine's drift
 *   over the minutes lands on both sides. On minus off is given pooled and per round;
 * - the agent's VmHWM and RSS after the first round's ADDs with policy on (its peak).
 *
 *     deno run -A --config tests/deno.json bench/policy_agent.ts [--pods N] [--policies N]
 *       [--namespaces N] [--locals N] [--events N] [--adds N] [--rounds N] [--page-size N]
 *
 * @module
 */
import { parseArgs } from "node:util";
import { makeTestPki } from "../tests/support/kube_pki.ts";
import { KubeApiServer, type Obj } from "../tests/support/kube_apiserver.ts";
import { KubeBridge, kubeconfigFor } from "../tests/support/kube_bridge.ts";
import { makeNamespace, makePod } from "../tests/support/kube_objects.ts";
import { SimulatedNode } from "../tests/support/node.ts";
import type { NetnsHandle } from "../tests/support/vpc.ts";
import { procCpu, procStatus } from "./_proc.ts";
import { stats } from "./_stats.ts";
import { parsePhases, phaseDelta } from "./_metrics.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    pods: { type: "string", default: "30000" },
    policies: { type: "string", default: "3000" },
    namespaces: { type: "string", default: "300" },
    nodes: { type: "string", default: "500" },
    locals: { type: "string", default: "50" },
    events: { type: "string", default: "200" },
    adds: { type: "string", default: "20" },
    rounds: { type: "string", default: "2" },
    "page-size": { type: "string", default: "100" },
  },
});
const N = {
  pods: Number(values.pods),
  policies: Number(values.policies),
  namespaces: Number(values.namespaces),
  nodes: Number(values.nodes),
  locals: Number(values.locals),
  events: Number(values.events),
  adds: Number(values.adds),
  rounds: Number(values.rounds),
  pageSize: Number(values["page-size"]),
};
const SERVICE_CIDRS = ["172.30.0.0/16", "fd00:30::/108"];
const APPS = 50;
/** How long a settled ADD waits for the node to finish what came before it. */
const SETTLE_MS = 300;

const nsName = (i: number) => `team-${i % N.namespaces}`;
const nsLabels = (i: number) => ({ team: `t${i % 7}`, env: i % 3 === 0 ? "prod" : "dev" });

function clusterPod(i: number): Obj {
  return makePod({
    namespace: nsName(i),
    name: `app-${Math.floor(i / N.namespaces)}-${(i * 2654435761 >>> 0).toString(36).slice(0, 5)}`,
    labels: { app: `app-${i % APPS}`, "pod-template-hash": (i % 997).toString(16) },
    nodeName: `node-${i % N.nodes}`,
    ip: `10.${64 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`,
    ports: [{ name: "http", containerPort: 8080 }, { name: "metrics", containerPort: 9100 }],
  });
}

/**
 * Policy `i` of a namespace: each selects one app; peers of several kinds, so that the
 * node holds small sets (an app of its namespace), large ones (every pod of the
 * namespaces of one team: ~1/7 of the cluster), named ports and ipBlocks.
 */
function policy(i: number): Obj {
  const ns = nsName(i);
  const app = `app-${Math.floor(i / N.namespaces) % APPS}`;
  const kind = Math.floor(i / N.namespaces) % 4;
  const from = kind === 0
    ? [{ podSelector: { matchLabels: { app: `app-${(i + 1) % APPS}` } } }]
    : kind === 1
    ? [{ namespaceSelector: { matchLabels: { team: `t${i % 7}` } } }]
    : kind === 2
    ? [{
      namespaceSelector: { matchLabels: { env: "prod" } },
      podSelector: { matchLabels: { app } },
    }]
    : [{ ipBlock: { cidr: "10.64.0.0/10", except: [`10.${64 + (i % 8)}.0.0/16`] } }];
  return {
    metadata: { namespace: ns, name: `allow-${i}`, generation: 1 },
    spec: {
      podSelector: { matchLabels: { app } },
      ingress: [{ from, ports: [{ port: kind === 2 ? "http" : 8000 + (i % 100) }] }],
      egress: kind === 3
        ? [{ to: [{ podSelector: {} }], ports: [{ port: "metrics" }] }]
        : undefined,
      policyTypes: kind === 3 ? ["Ingress", "Egress"] : ["Ingress"],
    },
  };
}

const mb = (kb: number) => Math.round(kb / 1024 * 10) / 10;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const pki = await makeTestPki();
const server = KubeApiServer.start({ pki });
const bridge = KubeBridge.start(server);
let node: SimulatedNode | null = null;
const report: Record<string, unknown> = { settings: N };
try {
  const t0 = performance.now();
  server.load(
    "namespaces",
    Array.from({ length: N.namespaces }, (_, i) => makeNamespace(nsName(i), nsLabels(i))),
  );
  server.load(
    "pods",
    (function* () {
      for (let i = 0; i < N.pods; i++) yield clusterPod(i);
    })(),
  );
  server.load("networkpolicies", Array.from({ length: N.policies }, (_, i) => policy(i)));
  console.error(`server loaded in ${Math.round(performance.now() - t0)} ms`);
  // The local pods: one per namespace team-0…, each app selected by that namespace's policies.
  const locals = Array.from({ length: N.locals }, (_, k) => ({
    namespace: nsName(k),
    name: `local-${k}`,
    labels: { app: `app-${k % 10}` },
  }));
  for (const l of locals) {
    server.put(
      "pods",
      makePod({ ...l, nodeName: "node-bench", ports: [{ name: "http", containerPort: 8080 }] }),
    );
  }

  node = await SimulatedNode.start({
    startAgent: false,
    nodeNic: true,
    mock: { enis: N.locals + N.adds + 4 },
    extra: {
      kubernetes: {
        kubeconfig: "/run/enim/kubeconfig",
        nodeName: "node-bench",
        pageSize: N.pageSize,
      },
    },
  });
  const n = node;
  const port = await bridge.into(n.vpc.node.name);
  await Deno.writeTextFile(n.sandbox.host("kubeconfig"), kubeconfigFor(server, port));
  const conf = n.netconf("1.1.0", { serviceCidrs: SERVICE_CIDRS });
  const status = () => n.client.status();

  // 1. First sync.
  const started = performance.now();
  await n.startAgent();
  for (;;) {
    if ((await status()).policy?.synced) break;
    await sleep(50);
  }
  const syncMs = performance.now() - started;
  const pid = n.agentPid!;
  const afterSync = await procStatus(pid);
  report.firstSync = {
    ms: Math.round(syncMs),
    vmHwmMB: mb(afterSync.VmHWM),
    rssMB: mb(afterSync.VmRSS),
  };
  console.error(`synced in ${Math.round(syncMs)} ms, VmHWM ${mb(afterSync.VmHWM)} MB`);

  // 2. The local pods' ADDs (policy on).
  const nets: NetnsHandle[] = [];
  const addMs: number[] = [];
  for (const l of locals) {
    const ns = await n.vpc.pod(`b-${l.name}`);
    nets.push(ns);
    const a0 = performance.now();
    const r = await n.cni(
      "ADD",
      n.podCall(ns, {
        containerId: `c-${l.name}`,
        args: `K8S_POD_NAMESPACE=${l.namespace};K8S_POD_NAME=${l.name};IgnoreUnknown=1`,
        config: conf,
      }),
    );
    addMs.push(performance.now() - a0);
    if (r.code !== 0) throw new Error(`ADD of ${l.name}: ${r.stdout}`);
  }
  report.localAdds = stats(addMs);
  const mem = async () => {
    const m = await procStatus(pid);
    const metricsText = await n.client.metrics();
    const heap = (kind: string) =>
      Number(
        new RegExp(`^enim_agent_memory_bytes\\{kind="${kind}"\\} (\\d+)`, "m").exec(metricsText)
          ?.[1] ?? 0,
      );
    return {
      vmHwmMB: mb(m.VmHWM),
      rssMB: mb(m.VmRSS),
      heapUsedMB: mb(heap("heap_used") / 1024),
      heapTotalMB: mb(heap("heap_total") / 1024),
      externalMB: mb(heap("external") / 1024),
    };
  };
  report.memory = { afterLocalAdds: await mem() };

  // 3. Watch events, one at a time: write, then poll until enforced.
  const rvOf = (o: Obj) => Number(o.metadata.resourceVersion);
  const enforced = async (resource: string, rv: number) => {
    for (;;) {
      const s = await status();
      const c = s.policy?.caches.find((x) => x.resource === resource);
      if (c && Number(c.enforcedResourceVersion ?? 0) >= rv && s.policy!.pendingEvents === 0) {
        return;
      }
      await sleep(5);
    }
  };
  const event = (k: number): [string, Obj] => {
    const which = k % 4;
    if (which === 0 || which === 1) {
      // A pod elsewhere changes its app label (it enters and leaves pod sets).
      const i = (k * 7919) % N.pods;
      const p = clusterPod(i);
      p.metadata.labels.app = `app-${(i + k) % APPS}`;
      return ["pods", server.put("pods", p)];
    }
    if (which === 2) {
      const i = k % N.namespaces;
      return ["namespaces", server.put("namespaces", makeNamespace(nsName(i), nsLabels(i + k)))];
    }
    // A policy of a local pod's namespace changes its port (its pods render again).
    const p = policy((k % N.locals) + N.namespaces * (k % 10));
    p.spec.ingress[0].ports = [{ port: 7000 + (k % 1000) }];
    return ["networkpolicies", server.put("networkpolicies", p)];
  };
  const byKind = new Map<string, number[]>();
  const all: number[] = [];
  for (let k = 0; k < N.events; k++) {
    const w0 = performance.now();
    const [resource, stored] = event(k);
    await enforced(resource, rvOf(stored));
    const ms = performance.now() - w0;
    all.push(ms);
    byKind.set(resource, [...(byKind.get(resource) ?? []), ms]);
  }
  (report.memory as Record<string, unknown>).afterEvents = await mem();
  report.eventToEnforcement = {
    all: stats(all),
    ...Object.fromEntries([...byKind].map(([k, v]) => [k, stats(v)])),
  };
  const metrics = await n.client.metrics();
  const hist = [
    ...metrics.matchAll(/^enim_policy_enforcement_seconds_bucket\{le="([^"]+)"\} (\d+)$/gm),
  ]
    .map((m) => [m[1], Number(m[2])] as const);
  const count = Number(/^enim_policy_enforcement_seconds_count (\d+)/m.exec(metrics)?.[1] ?? 0);
  const p99Bucket = hist.find(([, c]) => c >= 0.99 * count)?.[0];
  report.agentHistogram = { count, p99AtMostSeconds: p99Bucket, buckets: Object.fromEntries(hist) };

  // 4. CPU per event: a burst, then wait until all are in place.
  const cpu0 = await procCpu(pid);
  const lastRv = new Map<string, number>();
  const burst = N.events;
  for (let k = 0; k < burst; k++) {
    const [resource, stored] = event(N.events + k);
    lastRv.set(resource, rvOf(stored));
  }
  for (const [resource, rv] of lastRv) await enforced(resource, rv);
  const cpu1 = await procCpu(pid);
  report.cpuPerEventMs = Math.round((cpu1.own - cpu0.own) / burst * 100) / 100;
  (report.memory as Record<string, unknown>).afterBurst = await mem();

  // 5. ADD p50, policy on then off (the same pods re-created).
  // Pods the policies select (apps app-0…app-9), and pods no policy selects.
  const cyclePods = (kind: string, app: (k: number) => string) =>
    Array.from({ length: N.adds }, (_, k) => ({
      namespace: nsName(k),
      name: `${kind}-${k}`,
      labels: { app: app(k) },
    }));
  const selected = cyclePods("selected", (k) => `app-${k % 10}`);
  const plain = cyclePods("plain", (k) => `plain-${k}`);
  for (const l of [...selected, ...plain]) {
    server.put("pods", makePod({ ...l, nodeName: "node-bench" }));
  }
  await enforced("pods", Number(server.resourceVersion));
  /** The agent's CPU time (its own and its children's) per ADD and DEL, by cycle kind. */
  const cpu = new Map<string, { agentMs: number; childrenMs: number; n: number }>();
  /** The ADD phases' sums and counts, by cycle kind. */
  const phaseSums = new Map<string, Map<string, { sum: number; count: number }>>();
  /**
   * ADD then DEL of each pod, timed from the plugin's spawn to its exit; `settleMs` > 0
   * waits that long before each ADD, so that the node has finished the work an earlier
   * DEL and ADD left running (the device's way home, other pods' set edits).
   */
  const cycle = async (
    kind: string,
    round: number,
    pods: typeof selected,
    settleMs = 0,
  ): Promise<number[]> => {
    const tag = `${kind}-${round}`;
    const out: number[] = [];
    const before = parsePhases(await n.client.metrics());
    const c0 = await procCpu(n.agentPid!);
    for (let k = 0; k < N.adds; k++) {
      const l = pods[k];
      const ns = await n.vpc.pod(`${tag}-${k}`);
      const call = n.podCall(ns, {
        containerId: `c-${tag}-${k}`,
        args: `K8S_POD_NAMESPACE=${l.namespace};K8S_POD_NAME=${l.name};IgnoreUnknown=1`,
        config: conf,
      });
      if (settleMs > 0) await sleep(settleMs);
      const a0 = performance.now();
      const r = await n.cni("ADD", call);
      out.push(performance.now() - a0);
      if (r.code !== 0) throw new Error(`ADD ${tag}-${k}: ${r.stdout}`);
      const d = await n.cni("DEL", call);
      if (d.code !== 0) throw new Error(`DEL ${tag}-${k}: ${d.stdout}`);
      await n.vpc.deletePod(ns);
    }
    const c1 = await procCpu(n.agentPid!);
    const c = cpu.get(kind) ?? { agentMs: 0, childrenMs: 0, n: 0 };
    c.agentMs += c1.own - c0.own;
    c.childrenMs += c1.children - c0.children;
    c.n += N.adds;
    cpu.set(kind, c);
    const sums = phaseSums.get(kind) ?? new Map();
    for (
      const [k, f] of Object.entries(phaseDelta(before, parsePhases(await n.client.metrics())))
    ) {
      if (!k.startsWith("add/")) continue;
      const e = sums.get(k) ?? { sum: 0, count: 0 };
      e.sum += f.meanMs * f.count;
      e.count += f.count;
      sums.set(k, e);
    }
    phaseSums.set(kind, sums);
    return out;
  };
  /** Restarts the agent with policy on or off; with it on, waits for its first sync. */
  const restart = async (on: boolean) => {
    await n.stopAgent();
    await n.editConfig((c) => {
      if (on) delete c.networkPolicy;
      else c.networkPolicy = { enabled: false };
    });
    await n.startAgent();
    if (!on) return;
    for (;;) {
      const p = (await status()).policy;
      if (p?.synced && p.pendingEvents === 0) break;
      await sleep(50);
    }
    await sleep(2_000);
  };
  // Rounds alternate which half comes first (on, off; off, on; …), the agent restarted
  // between the halves: the machine's drift over the minutes lands on both sides.
  const samples = new Map<string, number[]>();
  const rounds: Record<string, number>[] = [];
  const half = async (on: boolean, round: number) => {
    const runs: [string, typeof selected, number][] = on
      ? [
        ["on", selected, 0],
        ["on-plain", plain, 0],
        ["on-settled", selected, SETTLE_MS],
        ["on-plain-settled", plain, SETTLE_MS],
      ]
      : [["off", selected, 0], ["off-settled", selected, SETTLE_MS]];
    for (const [kind, pods, settle] of runs) {
      const xs = await cycle(kind, round, pods, settle);
      samples.set(kind, [...(samples.get(kind) ?? []), ...xs]);
      rounds[round][kind] = stats(xs).p50;
    }
  };
  let policyOn = true;
  for (let r = 0; r < N.rounds; r++) {
    rounds.push({});
    for (const on of r % 2 === 0 ? [true, false] : [false, true]) {
      if (on !== policyOn) {
        await restart(on);
        policyOn = on;
      }
      await half(on, r);
      if (on && !report.end) {
        const end = await procStatus(n.agentPid!);
        report.end = { vmHwmMB: mb(end.VmHWM), rssMB: mb(end.VmRSS) };
      }
    }
  }
  const pooled = (kind: string) => stats(samples.get(kind)!);
  const round1 = (v: number) => Math.round(v * 10) / 10;
  /** Per round, policy on's p50 minus off's, for one kind of ADD. */
  const deltas = (on: string, off: string) => rounds.map((r) => round1(r[on] - r[off]));
  const mean = (xs: number[]) => round1(xs.reduce((a, b) => a + b, 0) / xs.length);
  const phasesOf = (kind: string) =>
    Object.fromEntries(
      [...phaseSums.get(kind)!].map(([k, v]) => [k, Math.round(v.sum / v.count * 100) / 100]),
    );
  const deltaOf = (on: string, off: string) => {
    const d = deltas(on, off);
    return { pooled: round1(pooled(on).p50 - pooled(off).p50), perRound: d, meanOfRounds: mean(d) };
  };
  report.add = {
    rounds: N.rounds,
    perRoundP50: rounds,
    policyOn: pooled("on"),
    policyOnNotSelected: pooled("on-plain"),
    policyOff: pooled("off"),
    /** The same, each ADD after the node settled (see `cycle`). */
    settled: {
      policyOn: pooled("on-settled"),
      policyOnNotSelected: pooled("on-plain-settled"),
      policyOff: pooled("off-settled"),
    },
    /** Policy on's ADD p50 minus off's: pooled over the rounds, and per round. */
    onMinusOff: {
      selected: deltaOf("on", "off"),
      notSelected: deltaOf("on-plain", "off"),
      settled: {
        selected: deltaOf("on-settled", "off-settled"),
        notSelected: deltaOf("on-plain-settled", "off-settled"),
      },
    },
    cpuPerAddAndDel: Object.fromEntries(
      [...cpu].map(([k, v]) => [k, {
        agentMs: round1(v.agentMs / v.n),
        childrenMs: round1(v.childrenMs / v.n),
      }]),
    ),
    phasesMeanMs: {
      policyOn: phasesOf("on"),
      policyOnNotSelected: phasesOf("on-plain"),
      policyOff: phasesOf("off"),
      settled: {
        policyOn: phasesOf("on-settled"),
        policyOnNotSelected: phasesOf("on-plain-settled"),
        policyOff: phasesOf("off-settled"),
      },
    },
  };
  console.log(JSON.stringify(report, null, 2));
} finally {
  await node?.close().catch((err) => console.error(err));
  await bridge.close();
  await server.close();
  await Deno.remove(pki.dir, { recursive: true });
}
