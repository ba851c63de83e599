/**
 * `deno task bench` (root): enim's CNI ADD/DEL against the CNI reference plugins,
 * in one run, on a simulated node (tests/support/node.ts) with warm ENIs.
 *
 * Contenders, alternated per iteration (the order flips every iteration):
 * - enim: the launcher (scripts/launcher.ts, what `deno task install` puts at
 *   /opt/cni/bin/enim) exec'd as a runtime does (CNI_* env, config on stdin),
 *   running the shipped bundle; ADD then DEL of a pod, against the running agent
 *   on the mock provider (ENIs preattached and free, so no provider wait);
 * - reference: Debian's /usr/lib/cni/host-device + static IPAM, ADD then DEL of
 *   an equivalent veth (same kind of device, same two addresses, same two
 *   default routes) into a pod namespace.
 *
 * Fairness: both are spawned the same way, from this process through the same
 * `nsenter --mount=<sandbox> --net=<node netns>` wrapper (one exec), with a
 * clean environment, and timed from spawn to exit; both pod namespaces have
 * `net.ipv6.conf.default.accept_dad=0` (enim adds IPv6 with nodad anyway; the
 * reference would otherwise wait 10 s for DAD on a carrier-less veth).
 *
 * Also: the plugin's start-up alone (VERSION) against the floor of any Deno
 * process (an empty `deno run --no-config --no-lock`), all three in one
 * alternating loop; peak RSS and CPU time (user + sys) of each plugin process
 * (`/usr/bin/time`, separate runs so the wrapper does not skew the latencies);
 * the plugin-side overhead (plugin wall time minus the agent's own operation
 * time); what bandwidth shaping adds to enim's ADD and DEL (10M limits both ways,
 * as containerd passes a pod's annotations, against none, alternating); the agent's memory (VmHWM); a 16-way concurrency run (wall time per
 * round against the reference's); a soak with agent RSS and fd samples and a
 * leftover check; the agent's per-phase histograms (from GET /metrics); and,
 * unless `--no-cri`, RunPodSandbox and Stop+Remove through containerd's CRI for
 * enim and the reference (tests/support/cri/timing.ts). Everything also goes to
 * bench-results.json (or `--out FILE`).
 *
 * Flags: `--quick` (a short run), `--iterations N`, `--soak N` (0 skips it),
 * `--rounds N`, `--no-cri`, `--host-link on|off` (enim's pods get their host link to the
 * node, as Kubernetes pods do by default; off: the ENI alone), `--out FILE`.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { ensureApt, isRoot } from "./_deps.ts";
import { ROOT } from "./_paths.ts";
import { writeLauncher } from "./launcher.ts";
import type { Containerd as ContainerdType } from "../tests/support/cri/containerd.ts";
import { SimulatedNode } from "../tests/support/node.ts";
import type { NetnsHandle } from "../tests/support/vpc.ts";
import { vethNames } from "../netns/sim.ts";
import type { Eni } from "../providers/schema.ts";
import { runCommand } from "../tests/support/command.ts";

const { values: flags } = parseArgs({
  args: Deno.args,
  options: {
    quick: { type: "boolean", default: false },
    iterations: { type: "string" },
    warmup: { type: "string" },
    soak: { type: "string" },
    rounds: { type: "string" },
    out: { type: "string", default: `${ROOT}/bench-results.json` },
    "no-cri": { type: "boolean", default: false },
    "host-link": { type: "string", default: "on" },
  },
});
if (flags["host-link"] !== "on" && flags["host-link"] !== "off") {
  console.error(`--host-link takes "on" or "off", not "${flags["host-link"]}"`);
  Deno.exit(2);
}
const num = (v: string | undefined, dflt: number) => (v === undefined ? dflt : Number(v));
const ITER = num(flags.iterations, flags.quick ? 15 : 60);
const WARMUP = num(flags.warmup, flags.quick ? 3 : 8);
const ROUNDS = num(flags.rounds, flags.quick ? 2 : 5);
const SOAK = num(flags.soak, flags.quick ? 200 : 1000);
const PARALLEL = 16;
const RSS_RUNS = flags.quick ? 5 : 10;
const CRI_ROUNDS = flags["no-cri"] ? 0 : flags.quick ? 3 : 20;
const STARTUP_RUNS = flags.quick ? 10 : 30;

const HOST_DEVICE = "/usr/lib/cni/host-device";
const TIME = "/usr/bin/time";
const SYSCTL = "/usr/sbin/sysctl";
const IP = "/usr/sbin/ip";

if (!isRoot()) {
  console.error("The bench builds network namespaces and needs root: run it as root.");
  Deno.exit(2);
}
const unmet = await ensureApt([
  { pkg: "iproute2", file: IP },
  { pkg: "util-linux", file: "/usr/bin/nsenter" },
  { pkg: "procps", file: SYSCTL },
  { pkg: "containernetworking-plugins", file: HOST_DEVICE },
  { pkg: "time", file: TIME },
]);
const criUnmet = CRI_ROUNDS > 0
  ? await ensureApt([
    { pkg: "containerd", file: "/usr/bin/containerd" },
    { pkg: "runc", file: "/usr/sbin/runc" },
    { pkg: "busybox-static", file: "/bin/busybox" },
  ])
  : [];
if (unmet.length > 0) {
  console.error(`The bench needs ${unmet.join(", ")}, which could not be installed.`);
  Deno.exit(2);
}

// ---------------------------------------------------------------- helpers

/** Percentile (nearest rank) of `xs` in ms. */
function pct(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}
interface Stats {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  min: number;
  max: number;
}
function stats(xs: number[]): Stats {
  const r = (v: number) => Math.round(v * 10) / 10;
  return {
    n: xs.length,
    p50: r(pct(xs, 50)),
    p90: r(pct(xs, 90)),
    p99: r(pct(xs, 99)),
    min: r(Math.min(...xs)),
    max: r(Math.max(...xs)),
  };
}
const fmt = (s: Stats) =>
  `p50 ${s.p50.toFixed(1).padStart(6)}  p90 ${s.p90.toFixed(1).padStart(6)}  p99 ${
    s.p99.toFixed(1).padStart(6)
  }  (n=${s.n}, min ${s.min.toFixed(1)}, max ${s.max.toFixed(1)}) ms`;

interface ExecResult {
  code: number;
  ms: number;
  stdout: string;
  stderr: string;
}

/** Spawns `argv` inside the node's sandbox (the one wrapper both contenders share) and times it. */
async function execInNode(
  node: SimulatedNode,
  argv: string[],
  env: Record<string, string>,
  stdin: string,
): Promise<ExecResult> {
  const wrapped = node.sandbox.wrap(argv);
  const t0 = performance.now();
  const out = await runCommand(
    wrapped,
    { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1", ...env },
    stdin,
  );
  return { ...out, ms: performance.now() - t0 };
}

/** One contender: how to run its ADD, DEL and VERSION for a pod. */
interface Contender {
  name: string;
  argv: string[];
  env(verb: string, pod: PodSlot): Record<string, string>;
  config(pod: PodSlot): string;
}

/** A pod namespace and, for the reference, the veth it moves in. */
interface PodSlot {
  ns: NetnsHandle;
  containerId: string;
  /** Reference only: the node-side device and its ENI's addresses. */
  eni?: Eni;
}

/**
 * enim's network config: a Kubernetes pod's (the CNI_ARGS say so), so each ADD also makes
 * the pod's host link to the node, routing a Service CIDR (issue 27); `--host-link off`
 * measures without it.
 */
const ENIM_CONFIG = JSON.stringify({
  cniVersion: "1.1.0",
  name: "bench",
  type: "enim",
  serviceCidrs: ["10.96.0.0/16"],
  ...(flags["host-link"] === "off" ? { hostLink: { enabled: false } } : {}),
});
/** The same network with 10M limits both ways, as containerd passes a pod's bandwidth annotations. */
const SHAPED_CONFIG = JSON.stringify({
  ...JSON.parse(ENIM_CONFIG),
  runtimeConfig: {
    "io.kubernetes.cri.pod-annotations": {
      "kubernetes.io/ingress-bandwidth": "10M",
      "kubernetes.io/egress-bandwidth": "10M",
    },
    bandwidth: {
      ingressRate: 10_000_000,
      ingressBurst: 2 ** 32 - 1,
      egressRate: 10_000_000,
      egressBurst: 2 ** 32 - 1,
    },
  },
});

/** The launcher and an empty program, in a temp dir removed at the end. */
const BENCH_DIR = await Deno.makeTempDir({ prefix: "enim-bench-" });
const LAUNCHER = `${BENCH_DIR}/enim`;
await writeLauncher(LAUNCHER);
const EMPTY_JS = `${BENCH_DIR}/empty.js`;
await Deno.writeTextFile(EMPTY_JS, "");
/** The floor of any Deno process: an empty program, no config, no lockfile. */
const FLOOR_ARGV = [Deno.execPath(), "run", "--no-config", "--no-lock", EMPTY_JS];

const enimContender: Contender = {
  name: "enim",
  argv: [LAUNCHER],
  env: (verb, pod) => ({
    CNI_COMMAND: verb,
    CNI_CONTAINERID: pod.containerId,
    CNI_NETNS: pod.ns.path,
    CNI_IFNAME: "eth0",
    CNI_PATH: "/opt/cni/bin",
    CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod.ns.name}`,
    ENIM_LOG_FILE: "/run/enim/cni.log",
  }),
  config: () => ENIM_CONFIG,
};

/** enim with the pod's bandwidth shaped (`--bandwidth` section). */
const shapedContender: Contender = {
  ...enimContender,
  name: "enim-shaped",
  config: () => SHAPED_CONFIG,
};

const referenceContender: Contender = {
  name: "reference",
  argv: [HOST_DEVICE],
  env: (verb, pod) => ({
    CNI_COMMAND: verb,
    CNI_CONTAINERID: pod.containerId,
    CNI_NETNS: pod.ns.path,
    CNI_IFNAME: "eth0",
    CNI_PATH: "/usr/lib/cni",
    CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod.ns.name}`,
  }),
  config: (pod) => {
    const eni = pod.eni!;
    const addrs = [eni.ipv4, eni.ipv6].filter((a) => a !== null);
    return JSON.stringify({
      cniVersion: "1.0.0",
      name: "bench-ref",
      type: "host-device",
      device: vethNames(eni.mac).node,
      ipam: {
        type: "static",
        addresses: addrs.map((a) => ({
          address: `${a.address}/${a.prefixLength}`,
          gateway: a.gateway,
        })),
        routes: addrs.map((a) => ({
          dst: a.address.includes(":") ? "::/0" : "0.0.0.0/0",
          gw: a.gateway,
        })),
      },
    });
  },
};

async function cni(
  node: SimulatedNode,
  c: Contender,
  verb: "ADD" | "DEL",
  pod: PodSlot,
  wrap: string[] = [],
): Promise<ExecResult> {
  const res = await execInNode(node, [...wrap, ...c.argv], c.env(verb, pod), c.config(pod));
  if (res.code !== 0) {
    throw new Error(
      `${c.name} ${verb} for ${pod.ns.name} failed (exit ${res.code}): ${res.stdout.trim()} ${res.stderr.trim()}`,
    );
  }
  return res;
}

async function podNetns(node: SimulatedNode, name: string): Promise<NetnsHandle> {
  const ns = await node.vpc.pod(name);
  for (const k of ["default", "all"]) {
    const out = await node.vpc.exec(ns, [SYSCTL, "-qw", `net.ipv6.conf.${k}.accept_dad=0`]);
    if (out.code !== 0) throw new Error(`sysctl in ${ns.name} failed: ${out.stderr}`);
  }
  return ns;
}

/**
 * Gives `pod` a new namespace, as kubelet gives each sandbox one, and removes its last
 * (as the runtime does after a DEL); then waits, untimed, for the rest of enim's DELs
 * that answered before their device's move home (a read of the agent's state waits for
 * it), so the call timed next is timed alone.
 */
async function newSandbox(node: SimulatedNode, pod: PodSlot, name: string): Promise<void> {
  const old = pod.ns;
  pod.ns = await podNetns(node, name);
  await node.vpc.deletePod(old);
  await node.client.status();
}

let cidSeq = 0;
const newCid = (tag: string) => `bench-${tag}-${(cidSeq++).toString().padStart(6, "0")}`;

/** Reads fields (kB) of /proc/<pid>/status. */
/**
 * The kernel's cost of moving a veth end between two namespaces, with no process per
 * move: 3 batches of 20 `link set … netns` lines in one `ip -batch` each, between two
 * namespaces of the VPC fixture made for this; ms per move, per batch.
 */
async function kernelMoveFloor(node: SimulatedNode): Promise<number[]> {
  const a = await node.vpc.pod("mvfa"), b = await node.vpc.pod("mvfb");
  const dir = await Deno.makeTempDir({ prefix: "enim-bench-move-" });
  try {
    const batch = async (lines: string[]) => {
      const file = `${dir}/${crypto.randomUUID()}`;
      await Deno.writeTextFile(file, lines.join("\n") + "\n");
      const t = performance.now();
      const out = await node.vpc.exec(a, ["/usr/sbin/ip", "-batch", file]);
      if (out.code !== 0) throw new Error(`ip -batch in ${a.name} failed: ${out.stderr}`);
      return performance.now() - t;
    };
    const n = 20, perBatch: number[] = [];
    await batch(
      Array.from({ length: 3 * n }, (_, i) => `link add mvf${i} type veth peer name mvfp${i}`),
    );
    for (let k = 0; k < 3; k++) {
      const ms = await batch(
        Array.from({ length: n }, (_, i) => `link set dev mvf${k * n + i} netns ${b.path}`),
      );
      perBatch.push(ms / n);
    }
    return perBatch;
  } finally {
    await node.vpc.deletePod(a).catch(() => {});
    await node.vpc.deletePod(b).catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

/** A process's CPU time in ms, its own and its reaped children's (/proc/PID/stat, USER_HZ 100). */
async function procCpu(pid: number): Promise<{ own: number; children: number }> {
  const f = (await Deno.readTextFile(`/proc/${pid}/stat`)).split(") ")[1].split(" ");
  return {
    own: (Number(f[11]) + Number(f[12])) * 10,
    children: (Number(f[13]) + Number(f[14])) * 10,
  };
}

async function procStatus(pid: number): Promise<Record<string, number>> {
  const text = await Deno.readTextFile(`/proc/${pid}/status`);
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^(Vm\w+):\s+(\d+) kB$/gm)) out[m[1]] = Number(m[2]);
  return out;
}
async function fdCount(pid: number): Promise<number> {
  let n = 0;
  for await (const _ of Deno.readDir(`/proc/${pid}/fd`)) n++;
  return n;
}

// ---------------------------------------------------------------- /metrics parsing

/** `enim_operation_duration_seconds` sum and count per op (all results). */
function parseOps(text: string): Map<string, { sum: number; count: number }> {
  const out = new Map<string, { sum: number; count: number }>();
  for (const line of text.split("\n")) {
    const m = line.match(/^enim_operation_duration_seconds_(sum|count)\{op="(\w+)",[^}]*\} (\S+)$/);
    if (!m) continue;
    const e = out.get(m[2]) ?? { sum: 0, count: 0 };
    if (m[1] === "sum") e.sum += Number(m[3]);
    else e.count += Number(m[3]);
    out.set(m[2], e);
  }
  return out;
}

type Hist = Map<string, { buckets: Map<number, number>; sum: number; count: number }>;

/** Parses the `enim_phase_duration_seconds` histograms into `op/phase` → buckets, sum, count. */
function parsePhases(text: string): Hist {
  const h: Hist = new Map();
  const get = (op: string, phase: string) => {
    const k = `${op}/${phase}`;
    if (!h.has(k)) h.set(k, { buckets: new Map(), sum: 0, count: 0 });
    return h.get(k)!;
  };
  for (const line of text.split("\n")) {
    const m = line.match(/^enim_phase_duration_seconds_(bucket|sum|count)\{([^}]*)\} (\S+)$/);
    if (!m) continue;
    const labels = Object.fromEntries(
      [...m[2].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]),
    );
    const e = get(labels.op, labels.phase);
    const v = Number(m[3]);
    if (m[1] === "bucket") e.buckets.set(labels.le === "+Inf" ? Infinity : Number(labels.le), v);
    else if (m[1] === "sum") e.sum = v;
    else e.count = v;
  }
  return h;
}

interface PhaseFigure {
  count: number;
  p50ms: number;
  meanMs: number;
}

/** Per phase: count, interpolated median (as histogram_quantile does) and mean, of after − before. */
function phaseDelta(before: Hist, after: Hist): Record<string, PhaseFigure> {
  const out: Record<string, PhaseFigure> = {};
  for (const [k, a] of after) {
    const b = before.get(k);
    const count = a.count - (b?.count ?? 0);
    if (count <= 0) continue;
    const sum = a.sum - (b?.sum ?? 0);
    const les = [...a.buckets.keys()].sort((x, y) => x - y);
    const rank = count / 2;
    let prevLe = 0, prevCum = 0, p50 = NaN;
    for (const le of les) {
      const cum = a.buckets.get(le)! - (b?.buckets.get(le) ?? 0);
      if (cum >= rank) {
        p50 = le === Infinity
          ? prevLe
          : prevLe + (le - prevLe) * ((rank - prevCum) / (cum - prevCum));
        break;
      }
      prevLe = le;
      prevCum = cum;
    }
    out[k] = {
      count,
      p50ms: Math.round(p50 * 1e5) / 100,
      meanMs: Math.round((sum / count) * 1e5) / 100,
    };
  }
  return out;
}

// ---------------------------------------------------------------- the run

const results: Record<string, unknown> = {
  date: new Date().toISOString(),
  deno: Deno.version.deno,
  kernel: Deno.osRelease(),
  cpus: navigator.hardwareConcurrency,
  settings: { iterations: ITER, warmup: WARMUP, rounds: ROUNDS, parallel: PARALLEL, soak: SOAK },
};
const t0 = performance.now();
let failed = false;
console.log(
  `enim bench: ${ITER} iterations (+${WARMUP} warm-up), ${ROUNDS}×${PARALLEL}-way, soak ${SOAK}`,
);

// The VPC's subnets lie outside the shipped conflist's service CIDR (10.96.0.0/12,
// kubeadm's default), as a cluster's must: the CRI section runs that conflist unchanged,
// and enim refuses a service CIDR that overlaps the ENI's subnet (7).
const node = await SimulatedNode.start({
  subnets: { ipv4: "192.168.99.0/24", ipv6: "fd00:99::/64" },
  mock: { enis: PARALLEL + 4 },
  logLevel: "info",
});
try {
  const agentPid = node.agentPid!;
  // The reference's veths get addresses past the mock ENIs' (.2 … .21).
  for (let i = 0; i < 40; i++) node.vpc.newEni();
  const refEni = node.vpc.newEni();
  await node.vpc.plugEni(refEni);
  const enimPod: PodSlot = { ns: await podNetns(node, "e0"), containerId: "" };
  const refPod: PodSlot = { ns: await podNetns(node, "r0"), containerId: "", eni: refEni };

  // ---- startup alone, against the floor of any Deno process, in one alternating loop
  const startup = { enim: [] as number[], reference: [] as number[], floor: [] as number[] };
  const starters = [
    ["enim", enimContender.argv],
    ["reference", referenceContender.argv],
    ["floor", FLOOR_ARGV],
  ] as const;
  for (let i = 0; i < STARTUP_RUNS + 3; i++) {
    const order = i % 2 === 0 ? starters : [...starters].reverse();
    for (const [name, argv] of order) {
      const r = await execInNode(node, argv, { CNI_COMMAND: "VERSION" }, '{"cniVersion":"1.0.0"}');
      if (r.code !== 0) throw new Error(`${name} VERSION failed: ${r.stdout} ${r.stderr}`);
      if (i >= 3) startup[name].push(r.ms);
    }
  }

  // ---- the kernel's netns move alone: what both plugins' ADD pays once (no process per move)
  const moveFloor = await kernelMoveFloor(node);

  // ---- serial ADD/DEL, alternating
  const lat = {
    enim: { ADD: [] as number[], DEL: [] as number[] },
    reference: { ADD: [] as number[], DEL: [] as number[] },
  };
  const beforeText = await node.client.metrics();
  const before = parsePhases(beforeText);
  for (let i = 0; i < WARMUP + ITER; i++) {
    const order = i % 2 === 0
      ? [[enimContender, enimPod], [referenceContender, refPod]] as const
      : [[referenceContender, refPod], [enimContender, enimPod]] as const;
    for (const [c, pod] of order) {
      pod.containerId = newCid(c.name);
      // What the rest of enim's DEL costs a call beside it is the back-to-back section's.
      await newSandbox(node, pod, `s${c.name === "enim" ? "e" : "r"}${i}`);
      const add = await cni(node, c, "ADD", pod);
      const del = await cni(node, c, "DEL", pod);
      if (i >= WARMUP) {
        lat[c.name as "enim" | "reference"].ADD.push(add.ms);
        lat[c.name as "enim" | "reference"].DEL.push(del.ms);
      }
    }
  }
  const afterText = await node.client.metrics();
  const after = parsePhases(afterText);
  const phases = phaseDelta(before, after);
  const opsBefore = parseOps(beforeText), opsAfter = parseOps(afterText);
  const agentOp: Record<string, number> = {};
  for (const op of ["add", "del"]) {
    const a = opsAfter.get(op), b = opsBefore.get(op) ?? { sum: 0, count: 0 };
    if (a && a.count > b.count) {
      agentOp[op] = Math.round(((a.sum - b.sum) / (a.count - b.count)) * 1e5) / 100;
    }
  }

  // ---- back to back: a pod's DEL, then at once another pod's ADD (churn on a node). enim's
  // ADD runs beside the rest of the DEL it follows (its device's move home, its host link);
  // this is where that rest costs a call.
  const b2b = {
    enim: { DEL: [] as number[], ADD: [] as number[], both: [] as number[] },
    reference: { DEL: [] as number[], ADD: [] as number[], both: [] as number[] },
  };
  const live = {
    enim: { ...enimPod, ns: await podNetns(node, "b2be"), containerId: newCid("b2b") },
    reference: { ...refPod, ns: await podNetns(node, "b2br"), containerId: newCid("b2b") },
  };
  await cni(node, enimContender, "ADD", live.enim);
  await cni(node, referenceContender, "ADD", live.reference);
  for (let i = 0; i < WARMUP + ITER; i++) {
    const pair = [["enim", enimContender], ["reference", referenceContender]] as const;
    for (const [k, c] of i % 2 === 0 ? pair : [...pair].reverse()) {
      await node.client.status();
      const next = { ...live[k], ns: await podNetns(node, `b${k[0]}${i}`), containerId: newCid(k) };
      const del = await cni(node, c, "DEL", live[k]);
      const add = await cni(node, c, "ADD", next);
      await node.vpc.deletePod(live[k].ns);
      live[k] = next;
      if (i >= WARMUP) {
        b2b[k].DEL.push(del.ms);
        b2b[k].ADD.push(add.ms);
        b2b[k].both.push(del.ms + add.ms);
      }
    }
  }
  await cni(node, enimContender, "DEL", live.enim);
  await cni(node, referenceContender, "DEL", live.reference);
  await node.client.status();

  // ---- the agent API alone: the same ADD/DEL sent over the socket from this process
  const direct = { ADD: [] as number[], DEL: [] as number[] };
  const directCpu = { own: 0, children: 0 };
  for (let i = 0; i < WARMUP + ITER; i++) {
    const containerId = newCid("direct");
    const key = { containerId, ifName: "eth0" };
    await newSandbox(node, enimPod, `d${i}`);
    const cpu0 = await procCpu(agentPid);
    let t = performance.now();
    await node.client.add({
      ...key,
      netns: enimPod.ns.path,
      network: "bench",
      pod: { namespace: "bench", name: enimPod.ns.name },
      mode: "interface",
      // What the plugin's ADD asks for (cni/host_link.ts defaults), so both measure the same.
      ...(flags["host-link"] === "off" ? {} : {
        hostLink: { podIfName: "host0", nodeIfPrefix: "enimh", serviceCidrs: ["10.96.0.0/16"] },
      }),
    });
    const addMs = performance.now() - t;
    const cpu1 = await procCpu(agentPid);
    if (i >= WARMUP) {
      directCpu.own += cpu1.own - cpu0.own;
      directCpu.children += cpu1.children - cpu0.children;
    }
    t = performance.now();
    await node.client.del({ ...key, netns: enimPod.ns.path, network: "bench" });
    const delMs = performance.now() - t;
    if (i >= WARMUP) {
      direct.ADD.push(addMs);
      direct.DEL.push(delMs);
    }
  }

  // ---- bandwidth shaping: enim's ADD/DEL with 10M limits both ways against the same without
  const bw = {
    none: { ADD: [] as number[], DEL: [] as number[] },
    shaped: { ADD: [] as number[], DEL: [] as number[] },
  };
  const bwBefore = parsePhases(await node.client.metrics());
  for (let i = 0; i < WARMUP + ITER; i++) {
    const pair = [["none", enimContender], ["shaped", shapedContender]] as const;
    for (const [k, c] of i % 2 === 0 ? pair : [...pair].reverse()) {
      enimPod.containerId = newCid(c.name);
      await newSandbox(node, enimPod, `w${k[0]}${i}`);
      const add = await cni(node, c, "ADD", enimPod);
      const del = await cni(node, c, "DEL", enimPod);
      if (i >= WARMUP) {
        bw[k].ADD.push(add.ms);
        bw[k].DEL.push(del.ms);
      }
    }
  }
  const bwPhases = phaseDelta(bwBefore, parsePhases(await node.client.metrics()));

  // ---- peak RSS and CPU time of each plugin process (separate runs: the wrapper adds a fork)
  const rss = { enim: [] as number[], reference: [] as number[] };
  const cpu = {
    enim: { ADD: [] as number[], DEL: [] as number[] },
    reference: { ADD: [] as number[], DEL: [] as number[] },
  };
  /** `/usr/bin/time -f "RSS %M CPU %U %S"`: peak RSS (kB) and user + sys (ms). */
  const usageOf = (r: ExecResult) => {
    const m = r.stderr.trim().split("\n").at(-1)!.match(/^RSS (\d+) CPU ([\d.]+) ([\d.]+)$/);
    if (!m) throw new Error(`Cannot read /usr/bin/time's line in ${JSON.stringify(r.stderr)}`);
    return { rssKb: Number(m[1]), cpuMs: (Number(m[2]) + Number(m[3])) * 1000 };
  };
  for (let i = 0; i < RSS_RUNS; i++) {
    for (const [c, pod] of [[enimContender, enimPod], [referenceContender, refPod]] as const) {
      const k = c.name as "enim" | "reference";
      pod.containerId = newCid(c.name);
      const wrap = [TIME, "-f", "RSS %M CPU %U %S"];
      for (const verb of ["ADD", "DEL"] as const) {
        const u = usageOf(await cni(node, c, verb, pod, wrap));
        rss[k].push(u.rssKb);
        cpu[k][verb].push(u.cpuMs);
      }
    }
  }

  // ---- concurrency: 16 pods ADDed in parallel, then DELed in parallel
  const conc = {
    enim: {
      ADD: [] as number[],
      DEL: [] as number[],
      wallAdd: [] as number[],
      wallDel: [] as number[],
      wallDelDone: [] as number[],
    },
    reference: {
      ADD: [] as number[],
      DEL: [] as number[],
      wallAdd: [] as number[],
      wallDel: [] as number[],
      wallDelDone: [] as number[],
    },
  };
  const enimPods: PodSlot[] = [];
  const refPods: PodSlot[] = [];
  for (let i = 0; i < PARALLEL; i++) {
    enimPods.push({ ns: await podNetns(node, `ce${i}`), containerId: "" });
    const eni = node.vpc.newEni();
    await node.vpc.plugEni(eni);
    refPods.push({ ns: await podNetns(node, `cr${i}`), containerId: "", eni });
  }
  let concBefore: Hist = new Map();
  for (let r = 0; r < ROUNDS + 1; r++) {
    if (r === 1) concBefore = parsePhases(await node.client.metrics());
    for (const [c, pods] of [[enimContender, enimPods], [referenceContender, refPods]] as const) {
      const k = c.name as "enim" | "reference";
      for (const p of pods) p.containerId = newCid(`c${k}`);
      // Each side starts with the other's work done (enim's DELs finish after their answers).
      await node.client.status();
      let w0 = performance.now();
      const adds = await Promise.all(pods.map((p) => cni(node, c, "ADD", p)));
      const wallAdd = performance.now() - w0;
      w0 = performance.now();
      const dels = await Promise.all(pods.map((p) => cni(node, c, "DEL", p)));
      const wallDel = performance.now() - w0;
      // Until every device is home as well (the agent's reads wait for that).
      if (k === "enim") await node.client.status();
      const wallDelDone = performance.now() - w0;
      if (r === 0) continue; // warm-up round
      conc[k].wallDelDone.push(wallDelDone);
      conc[k].ADD.push(...adds.map((x) => x.ms));
      conc[k].DEL.push(...dels.map((x) => x.ms));
      conc[k].wallAdd.push(wallAdd);
      conc[k].wallDel.push(wallDel);
    }
  }
  const concPhases = phaseDelta(concBefore, parsePhases(await node.client.metrics()));
  const agentAfterConc = await procStatus(agentPid);

  // ---- soak
  const nodeLinksBefore = await linkSummary(node, node.vpc.node.name);
  const samples: { cycle: number; rssKb: number; fds: number }[] = [];
  let soakFailures = 0;
  const soakErrors: string[] = [];
  const sample = async (cycle: number) =>
    samples.push({
      cycle,
      rssKb: (await procStatus(agentPid)).VmRSS,
      fds: await fdCount(agentPid),
    });
  const soakT0 = performance.now();
  for (let i = 0; i < SOAK; i++) {
    if (i % 100 === 0) await sample(i);
    enimPod.containerId = newCid("soak");
    for (const verb of ["ADD", "DEL"] as const) {
      try {
        await cni(node, enimContender, verb, enimPod);
      } catch (err) {
        soakFailures++;
        if (soakErrors.length < 5) soakErrors.push(String(err));
      }
    }
  }
  await sample(SOAK);
  const soakSecs = (performance.now() - soakT0) / 1000;
  const attachments = await node.client.attachments();
  const status = await node.client.status();
  const nodeLinksAfter = await linkSummary(node, node.vpc.node.name);
  const podLeftovers: string[] = [];
  for (const p of [enimPod, ...enimPods]) {
    const links = await linkSummary(node, p.ns.name);
    if (links.length !== 1 || links[0] !== "lo") {
      podLeftovers.push(`${p.ns.name}: ${links.join(",")}`);
    }
  }
  const nodeAddrs = await node.vpc.exec(node.vpc.node, [
    IP,
    "-j",
    "addr",
    "show",
    "scope",
    "global",
  ]);
  const globalAddrs =
    (JSON.parse(nodeAddrs.stdout || "[]") as { ifname: string; addr_info: unknown[] }[])
      .filter((l) => l.addr_info.length > 0).map((l) => l.ifname);
  const agentEnd = await procStatus(agentPid);

  // ---- containerd's CRI: what kubelet waits for (RunPodSandbox, Stop+Remove)
  const cri = CRI_ROUNDS > 0 && criUnmet.length === 0 ? await criTimes(node, CRI_ROUNDS) : null;
  if (CRI_ROUNDS > 0 && criUnmet.length > 0) {
    console.error(`CRI timing skipped: cannot install ${criUnmet.join(", ")}`);
  }

  // ---- report
  const s = {
    enim: { ADD: stats(lat.enim.ADD), DEL: stats(lat.enim.DEL) },
    reference: { ADD: stats(lat.reference.ADD), DEL: stats(lat.reference.DEL) },
  };
  const ratio = {
    ADD: { p50: s.enim.ADD.p50 / s.reference.ADD.p50, p99: s.enim.ADD.p99 / s.reference.ADD.p99 },
    DEL: { p50: s.enim.DEL.p50 / s.reference.DEL.p50, p99: s.enim.DEL.p99 / s.reference.DEL.p99 },
  };
  const cs = {
    enim: {
      ADD: stats(conc.enim.ADD),
      DEL: stats(conc.enim.DEL),
      wallAdd: stats(conc.enim.wallAdd),
      wallDel: stats(conc.enim.wallDel),
      wallDelDone: stats(conc.enim.wallDelDone),
    },
    reference: {
      ADD: stats(conc.reference.ADD),
      DEL: stats(conc.reference.DEL),
      wallAdd: stats(conc.reference.wallAdd),
      wallDel: stats(conc.reference.wallDel),
    },
  };
  const wallRatio = {
    ADD: cs.enim.wallAdd.p50 / cs.reference.wallAdd.p50,
    DEL: cs.enim.wallDel.p50 / cs.reference.wallDel.p50,
    /** enim's DELs until every device is home too (they answer before the move home). */
    DEL_DONE: cs.enim.wallDelDone.p50 / cs.reference.wallDel.p50,
  };
  const st = {
    enim: stats(startup.enim),
    reference: stats(startup.reference),
    floor: stats(startup.floor),
  };
  const startupOverFloor = st.enim.p50 / st.floor.p50;
  const rssStats = { enim: stats(rss.enim), reference: stats(rss.reference) };
  const cpuStats = {
    enim: { ADD: stats(cpu.enim.ADD), DEL: stats(cpu.enim.DEL) },
    reference: { ADD: stats(cpu.reference.ADD), DEL: stats(cpu.reference.DEL) },
  };
  const directStats = { ADD: stats(direct.ADD), DEL: stats(direct.DEL) };
  const bwStats = {
    none: { ADD: stats(bw.none.ADD), DEL: stats(bw.none.DEL) },
    shaped: { ADD: stats(bw.shaped.ADD), DEL: stats(bw.shaped.DEL) },
    /** What shaping adds to a call, p50 against p50. */
    costMs: {
      ADD: Math.round((pct(bw.shaped.ADD, 50) - pct(bw.none.ADD, 50)) * 10) / 10,
      DEL: Math.round((pct(bw.shaped.DEL, 50) - pct(bw.none.DEL, 50)) * 10) / 10,
    },
    /** The agent's `shape` phase: the one `tc -batch` in the pod. */
    shapePhase: bwPhases["add/shape"] ?? null,
    configurePhase: bwPhases["add/configure"] ?? null,
  };
  // The plugin side: what a CNI call costs beyond the agent's own operation.
  const overhead = {
    ADD: s.enim.ADD.p50 - (agentOp.add ?? NaN),
    DEL: s.enim.DEL.p50 - (agentOp.del ?? NaN),
  };
  const rssVals = samples.map((x) => x.rssKb);
  const soakBaseline = samples.length > 1 ? samples[1] : samples[0];
  // Flatness: every sample after the first 100 cycles within ±5 MB of the cycle-100 sample.
  const rssSpreadMb = Math.max(...rssVals.slice(1).map((v) => Math.abs(v - soakBaseline.rssKb))) /
    1024;
  const fdGrowth = samples.at(-1)!.fds - soakBaseline.fds;
  const leftovers = {
    attachments: attachments.length,
    owned: status.pool.owned,
    free: status.pool.free,
    podDevices: podLeftovers,
    nodeDevicesChanged: JSON.stringify(nodeLinksBefore) !== JSON.stringify(nodeLinksAfter),
    nodeGlobalAddresses: globalAddrs,
  };
  const mb = (kb: number) => (kb / 1024).toFixed(1);
  const criRatio = cri
    ? {
      run: stats(cri.times.enim.run).p50 / stats(cri.times.reference.run).p50,
      stopRemove: stats(cri.times.enim.stopRemove).p50 /
        stats(cri.times.reference.stopRemove).p50,
    }
    : null;
  const goals = {
    startupOverFloor: startupOverFloor <= 1.3,
    pluginRss: rssStats.enim.max / 1024 <= 35,
    pluginCpuAdd: cpuStats.enim.ADD.p50 <= 40,
    addP50Ratio: ratio.ADD.p50 <= 1.5,
    delP50Ratio: ratio.DEL.p50 <= 1.5,
    agentApiAloneAdd: directStats.ADD.p50 <= s.reference.ADD.p50,
    concurrencyWall: wallRatio.ADD <= 1.0 && wallRatio.DEL <= 1.0,
    criRun: criRatio === null || criRatio.run <= 1.3,
    criStopRemove: criRatio === null || criRatio.stopRemove <= 1.3,
    agentVmHWM: agentEnd.VmHWM / 1024 <= 80,
    soakFlat: SOAK === 0 || (rssSpreadMb <= 5 && soakFailures === 0),
  };
  const verdict = (ok: boolean) => (ok ? "met" : "MISSED");

  console.log(`\nplugin start-up alone (VERSION; ms, spawn to exit, one alternating loop)`);
  console.log(`    enim       ${fmt(st.enim)}`);
  console.log(`    reference  ${fmt(st.reference)}`);
  console.log(`    floor      ${fmt(st.floor)}  (empty deno run --no-config --no-lock)`);
  console.log(
    `    enim / floor p50 ${startupOverFloor.toFixed(2)}  (goal ≤ 1.3: ${
      verdict(goals.startupOverFloor)
    })`,
  );
  const moveMs = [...moveFloor].sort((x, y) => x - y)[1];
  console.log(
    `\nthe kernel's netns move alone (3 batches of 20 in one ip -batch each; ms per move): ${
      moveFloor.map((m) => m.toFixed(1)).join(", ")
    }`,
  );
  console.log(
    `  both ADDs pay one move; enim's also pays a Deno start-up: empty deno run + one move = ${
      (st.floor.p50 + moveMs).toFixed(1)
    } ms, ${
      ((st.floor.p50 + moveMs) / s.reference.ADD.p50).toFixed(2)
    }× the reference's ADD p50 before enim does anything else`,
  );
  console.log(`\nserial, ${ITER} iterations each, alternating (ms, spawn to exit)`);
  for (const verb of ["ADD", "DEL"] as const) {
    console.log(`  ${verb}`);
    console.log(`    enim       ${fmt(s.enim[verb])}`);
    console.log(`    reference  ${fmt(s.reference[verb])}`);
    console.log(
      `    ratio enim/reference: p50 ${ratio[verb].p50.toFixed(2)}, p99 ${
        ratio[verb].p99.toFixed(2)
      }  (goal p50 ≤ 1.5: ${verdict(ratio[verb].p50 <= 1.5)})`,
    );
  }
  console.log(
    `\nback to back: a pod's DEL, then at once another pod's ADD (${ITER} each, alternating; ms)`,
  );
  for (const k of ["enim", "reference"] as const) {
    const st = { DEL: stats(b2b[k].DEL), ADD: stats(b2b[k].ADD), both: stats(b2b[k].both) };
    console.log(
      `  ${k.padEnd(9)} DEL p50 ${st.DEL.p50.toFixed(1)}, ADD p50 ${
        st.ADD.p50.toFixed(1)
      }, DEL+ADD p50 ${st.both.p50.toFixed(1)}`,
    );
  }
  console.log(
    `  DEL+ADD enim/reference p50: ${
      (stats(b2b.enim.both).p50 / stats(b2b.reference.both).p50).toFixed(2)
    } (enim's ADD runs beside the rest of its DEL)`,
  );
  console.log(`\nwhere enim's time goes (serial; ms)`);
  console.log(
    `  agent operation (enim_operation_duration_seconds mean): ADD ${
      agentOp.add?.toFixed(1)
    }, DEL ${
      agentOp.del?.toFixed(1)
    } (the DEL's whole work: it answers before its device's move home, which follows on the attachment's lock)`,
  );
  console.log(
    `  plugin side (plugin p50 minus the agent's operation): ADD ${overhead.ADD.toFixed(1)}, DEL ${
      overhead.DEL.toFixed(1)
    }${overhead.DEL < 0 ? " (negative: the DEL answered before its move home)" : ""}`,
  );
  console.log(
    `  agent API alone (same requests over the socket from the bench process, no plugin):`,
  );
  console.log(`    ADD ${fmt(directStats.ADD)}`);
  console.log(`    DEL ${fmt(directStats.DEL)}`);
  console.log(
    `    ADD p50 / the reference's whole ADD p50: ${
      (directStats.ADD.p50 / s.reference.ADD.p50).toFixed(2)
    }  (goal ≤ 1.0: ${verdict(goals.agentApiAloneAdd)})`,
  );
  console.log(
    `    CPU per ADD (mean of ${ITER}): the agent ${
      (directCpu.own / ITER).toFixed(1)
    } ms, the processes it ran ${
      (directCpu.children / ITER).toFixed(1)
    } ms (the plugin process adds its own, below)`,
  );
  console.log(
    `\nbandwidth shaping: enim ADD/DEL with 10M limits both ways against none, alternating (ms)`,
  );
  for (const verb of ["ADD", "DEL"] as const) {
    console.log(`  ${verb} none    ${fmt(bwStats.none[verb])}`);
    console.log(`  ${verb} shaped  ${fmt(bwStats.shaped[verb])}`);
  }
  console.log(
    `  cost of shaping (p50 − p50): ADD ${bwStats.costMs.ADD.toFixed(1)}, DEL ${
      bwStats.costMs.DEL.toFixed(1)
    }; the agent's shape phase (one tc -batch in the pod) p50≈${
      bwStats.shapePhase?.p50ms.toFixed(2) ?? "?"
    }, mean ${bwStats.shapePhase?.meanMs.toFixed(2) ?? "?"} (n=${bwStats.shapePhase?.count ?? 0})`,
  );
  console.log(`\nper-phase inside the agent during the serial run (from /metrics; ms)`);
  for (const [k, v] of Object.entries(phases).sort()) {
    console.log(
      `  ${k.padEnd(24)} p50≈${v.p50ms.toFixed(2).padStart(7)}  mean ${
        v.meanMs.toFixed(2).padStart(7)
      }  (n=${v.count})`,
    );
  }
  console.log(`\nplugin process resources (/usr/bin/time over ${RSS_RUNS} ADD and DEL runs each)`);
  console.log(
    `  enim plugin      peak RSS max ${mb(rssStats.enim.max)} MB, p50 ${
      mb(rssStats.enim.p50)
    } MB (goal ≤ 35: ${verdict(goals.pluginRss)}); CPU (user+sys) per ADD p50 ${
      cpuStats.enim.ADD.p50.toFixed(0)
    } ms (goal ≤ 40: ${verdict(goals.pluginCpuAdd)}), per DEL p50 ${
      cpuStats.enim.DEL.p50.toFixed(0)
    } ms`,
  );
  console.log(
    `  reference plugin peak RSS max ${mb(rssStats.reference.max)} MB, p50 ${
      mb(rssStats.reference.p50)
    } MB; CPU per ADD p50 ${cpuStats.reference.ADD.p50.toFixed(0)} ms, per DEL p50 ${
      cpuStats.reference.DEL.p50.toFixed(0)
    } ms  (host-device; static runs as its child)`,
  );
  console.log(
    `  agent            VmHWM ${mb(agentEnd.VmHWM)} MB (goal ≤ 80: ${
      verdict(goals.agentVmHWM)
    }), VmRSS ${mb(agentEnd.VmRSS)} MB (after the concurrency run ${mb(agentAfterConc.VmRSS)})`,
  );
  console.log(
    `\nconcurrency: ${ROUNDS} rounds of ${PARALLEL} pods ADDed in parallel, then DELed in parallel`,
  );
  for (const k of ["enim", "reference"] as const) {
    for (const verb of ["ADD", "DEL"] as const) {
      console.log(`  ${k.padEnd(9)} ${verb} ${fmt(cs[k][verb])}`);
    }
    console.log(
      `  ${k.padEnd(9)} wall per round: ADD p50 ${cs[k].wallAdd.p50.toFixed(0)} ms, DEL p50 ${
        cs[k].wallDel.p50.toFixed(0)
      } ms`,
    );
  }
  console.log(
    `  enim      DELs until every device is home as well: wall p50 ${
      cs.enim.wallDelDone.p50.toFixed(0)
    } ms`,
  );
  console.log(
    `  wall per round, enim / reference: ADD ${wallRatio.ADD.toFixed(2)}, DEL ${
      wallRatio.DEL.toFixed(2)
    } (answered; ${wallRatio.DEL_DONE.toFixed(2)} until every device is home)  (goal ≤ 1.0: ${
      verdict(goals.concurrencyWall)
    })`,
  );
  console.log(`  enim per-phase inside the agent under 16-way concurrency (from /metrics; ms)`);
  for (const [k, v] of Object.entries(concPhases).sort()) {
    console.log(
      `    ${k.padEnd(22)} p50≈${v.p50ms.toFixed(2).padStart(7)}  mean ${
        v.meanMs.toFixed(2).padStart(7)
      }  (n=${v.count})`,
    );
  }
  if (SOAK > 0) {
    console.log(
      `\nsoak: ${SOAK} ADD/DEL cycles in ${soakSecs.toFixed(0)} s, ${soakFailures} failures`,
    );
    console.log(`  cycle    VmRSS MB  fds`);
    for (const x of samples) {
      console.log(`  ${String(x.cycle).padStart(5)}  ${mb(x.rssKb).padStart(9)}  ${x.fds}`);
    }
    console.log(
      `  RSS deviation from the cycle-100 sample: max ${rssSpreadMb.toFixed(1)} MB (goal ±5: ${
        verdict(goals.soakFlat)
      }), fd growth ${fdGrowth} (goal 0: ${verdict(fdGrowth <= 0)})`,
    );
  } else {
    console.log(`\nsoak: skipped (--soak 0)`);
  }
  console.log(
    `  leftovers: ${leftovers.attachments} state rows, ${leftovers.owned} owned ENIs (${leftovers.free} free), pod devices ${
      podLeftovers.length ? podLeftovers.join("; ") : "none"
    }, node devices ${
      leftovers.nodeDevicesChanged ? "CHANGED" : "unchanged"
    }, node global addresses ${globalAddrs.length ? globalAddrs.join(",") : "none"}`,
  );
  for (const e of soakErrors) console.log(`  error: ${e}`);
  if (cri) {
    console.log(
      `\ncontainerd ${cri.version} CRI, ${CRI_ROUNDS} rounds (ms; what kubelet waits for)`,
    );
    for (const [k, t] of Object.entries(cri.times)) {
      console.log(
        `  ${k.padEnd(9)} RunPodSandbox ${stats(t.run).p50.toFixed(0)} ms p50, Stop+Remove ${
          stats(t.stopRemove).p50.toFixed(0)
        } ms p50 (Stop ${stats(t.stop).p50.toFixed(0)}, Remove ${
          stats(t.remove).p50.toFixed(0)
        }: its DEL has CNI_NETNS="", nothing left to undo)`,
      );
    }
    console.log(
      `  enim / reference p50: RunPodSandbox ${criRatio!.run.toFixed(2)}, Stop+Remove ${
        criRatio!.stopRemove.toFixed(2)
      }  (goal ≤ 1.3: ${verdict(goals.criRun)}, ${verdict(goals.criStopRemove)})`,
    );
  }
  console.log(
    `\ngoals (issues #11 and #23): ${
      Object.entries(goals).map(([k, v]) => `${k} ${verdict(v)}`).join(", ")
    }`,
  );
  failed = soakFailures > 0 || leftovers.attachments > 0 || leftovers.owned > 0 ||
    podLeftovers.length > 0 || leftovers.nodeDevicesChanged || globalAddrs.length > 0;

  Object.assign(results, {
    startup: { ...st, enimOverFloor: startupOverFloor },
    floor: st.floor,
    serial: s,
    ratio,
    phases,
    agentOperationMeanMs: agentOp,
    pluginOverheadMs: overhead,
    agentApiAlone: directStats,
    backToBack: {
      enim: { DEL: stats(b2b.enim.DEL), ADD: stats(b2b.enim.ADD), both: stats(b2b.enim.both) },
      reference: {
        DEL: stats(b2b.reference.DEL),
        ADD: stats(b2b.reference.ADD),
        both: stats(b2b.reference.both),
      },
    },
    bandwidth: bwStats,
    rssKb: {
      enimPlugin: rssStats.enim,
      referencePlugin: rssStats.reference,
      agentVmHWM: agentEnd.VmHWM,
      agentVmRSS: agentEnd.VmRSS,
    },
    cpuMs: cpuStats,
    concurrency: { ...cs, wallRatio, phases: concPhases },
    kernelMoveMsPerBatch: moveFloor,
    agentCpuPerApiAdd: { own: directCpu.own / ITER, children: directCpu.children / ITER },
    soak: {
      cycles: SOAK,
      seconds: soakSecs,
      failures: soakFailures,
      errors: soakErrors,
      samples,
      rssSpreadMb,
      fdGrowth,
      leftovers,
    },
    ...(cri ? { cri } : {}),
    goals,
  });
} catch (err) {
  failed = true;
  console.error(`bench aborted: ${err instanceof Error ? err.stack : String(err)}`);
  console.error((await node.agentLog()).split("\n").slice(-30).join("\n"));
} finally {
  await node.close();
  await Deno.remove(BENCH_DIR, { recursive: true }).catch(() => {});
}
await Deno.writeTextFile(flags.out!, JSON.stringify(results, null, 2) + "\n");
console.log(
  `\nwrote ${flags.out}; ${
    ((performance.now() - t0) / 1000).toFixed(0)
  } s; namespaces removed, agent stopped`,
);
Deno.exit(failed ? 1 : 0);

/** Link names in a namespace, sorted (for before/after comparisons). */
async function linkSummary(node: SimulatedNode, netns: string): Promise<string[]> {
  const out = await node.vpc.exec(netns, [IP, "-j", "link", "show"]);
  return (JSON.parse(out.stdout || "[]") as { ifname: string }[]).map((l) => l.ifname).sort();
}

/**
 * RunPodSandbox and Stop+Remove through containerd's CRI, enim against host-device +
 * static on a pre-made veth (tests/support/cri/timing.ts), as two runtime handlers of one
 * containerd inside the node. The conflist is the one `deno task install` stages.
 */
async function criTimes(node: SimulatedNode, rounds: number) {
  const { Containerd } = await import("../tests/support/cri/containerd.ts");
  const { makeReferenceVeth, referenceConflist, timeSandboxes } = await import(
    "../tests/support/cri/timing.ts"
  );
  const { install } = await import("./install.ts");
  const { pluginDir } = await import("../tests/support/clients.ts");
  const dir = await Deno.makeTempDir({ prefix: "enim-bench-cri-" });
  let cd: ContainerdType | null = null;
  try {
    const refVeth = `enimref${crypto.randomUUID().slice(0, 6)}`;
    await Deno.mkdir(`${dir}/ref`);
    await Deno.writeTextFile(
      `${dir}/ref/10-reference.conflist`,
      referenceConflist(refVeth, "192.168.99.250/24", "192.168.99.1"),
    );
    await install({ prefix: `${dir}/stage`, launcher: true, log: () => {} });
    await pluginDir(`${dir}/bin`, ["loopback", "host-device", "static"]);
    cd = await Containerd.start(node, {
      binDir: `${dir}/bin`,
      confDir: `${dir}/stage/etc/cni/net.d`,
      handlers: { reference: `${dir}/ref` },
      env: { ENIM_LOG_FILE: node.sandbox.inner("cni.log") },
      label: "bench",
    });
    await makeReferenceVeth(node, refVeth);
    const v = await cd.cri.version();
    const times = await timeSandboxes(cd, { enim: "", reference: "reference" }, {
      rounds,
      // enim's DEL answers before its device's move home: a read of the agent's state waits.
      settle: async (label) => void (label === "enim" && await node.client.status()),
    });
    return { version: `${v.runtimeName} ${v.runtimeVersion}`, times };
  } finally {
    await cd?.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
