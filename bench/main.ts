/**
 * `deno task bench` (root): enim's CNI ADD/DEL against the CNI reference plugins,
 * in one run, on a simulated node (tests/support/node.ts) with warm ENIs. This
 * runner sets the node up, runs the sections (one file each beside it) in order,
 * prints their reports and the goals, and writes everything to bench-results.json
 * (or `--out FILE`).
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
 * The sections, in the order they run: start-up alone (startup.ts), the kernel's
 * netns move alone (kernel_move.ts), serial ADD/DEL (serial.ts), back to back
 * (back_to_back.ts), the agent API alone (agent_api.ts), bandwidth shaping
 * (bandwidth.ts), plugin process resources (resources.ts), 16-way concurrency
 * (concurrency.ts), the soak and leftover check (soak.ts) and, unless `--no-cri`,
 * containerd's CRI (cri.ts).
 *
 * Flags (bench/_settings.ts): `--quick` (a short run), `--iterations N`, `--warmup N`,
 * `--soak N` (0 skips it), `--rounds N`, `--no-cri`, `--host-link on|off` (enim's pods
 * get their host link to the node, as Kubernetes pods do by default; off: the ENI
 * alone), `--out FILE`.
 *
 * @module
 */
import { aptNeedsOf, ensureApt, isRoot } from "../scripts/_deps.ts";
import { writeLauncher } from "../scripts/launcher.ts";
import { SimulatedNode } from "../tests/support/node.ts";
import { type BenchContext, contenders, podNetns } from "./_cni.ts";
import { procStatus } from "./_proc.ts";
import { parseSettings } from "./_settings.ts";
import { verdict } from "./_stats.ts";
import { measureStartup, reportStartup, startupGoal } from "./startup.ts";
import { measureKernelMove, reportKernelMove } from "./kernel_move.ts";
import { measureSerial, reportSerial, reportSerialPhases } from "./serial.ts";
import { backToBackJson, measureBackToBack, reportBackToBack } from "./back_to_back.ts";
import { agentApiGoal, measureAgentApi, reportTimeSplit } from "./agent_api.ts";
import { measureBandwidth, reportBandwidth } from "./bandwidth.ts";
import { agentMemoryGoal, measureResources, reportResources, resourceGoals } from "./resources.ts";
import { concurrencyGoal, measureConcurrency, reportConcurrency } from "./concurrency.ts";
import { measureSoak, reportSoak, soakFailed, soakGoal } from "./soak.ts";
import { criGoals, measureCri, reportCri } from "./cri.ts";

const settings = parseSettings(Deno.args);
if ("error" in settings) {
  console.error(settings.error);
  Deno.exit(2);
}
const { iterations: ITER, warmup: WARMUP, rounds: ROUNDS, soak: SOAK, parallel: PARALLEL } =
  settings;

if (!isRoot()) {
  console.error("The bench builds network namespaces and needs root: run it as root.");
  Deno.exit(2);
}
const unmet = await ensureApt(aptNeedsOf("bench"));
const criUnmet = settings.criRounds > 0 ? await ensureApt(aptNeedsOf("bench-cri")) : [];
if (unmet.length > 0) {
  console.error(`The bench needs ${unmet.join(", ")}, which could not be installed.`);
  Deno.exit(2);
}

/** The launcher and an empty program, in a temp dir removed at the end. */
const BENCH_DIR = await Deno.makeTempDir({ prefix: "enim-bench-" });
const LAUNCHER = `${BENCH_DIR}/enim`;
await writeLauncher(LAUNCHER);
const EMPTY_JS = `${BENCH_DIR}/empty.js`;
await Deno.writeTextFile(EMPTY_JS, "");

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
  const ctx: BenchContext = {
    settings,
    node,
    agentPid,
    contenders: contenders(settings, LAUNCHER),
    floorArgv: [Deno.execPath(), "run", "--no-config", "--no-lock", EMPTY_JS],
    enimPod: { ns: await podNetns(node, "e0"), containerId: "" },
    refPod: { ns: await podNetns(node, "r0"), containerId: "", eni: refEni },
  };

  // ---- measure, section by section
  const startup = await measureStartup(ctx);
  const moveFloor = await measureKernelMove(node);
  const serial = await measureSerial(ctx);
  const b2b = await measureBackToBack(ctx);
  const api = await measureAgentApi(ctx);
  const bandwidth = await measureBandwidth(ctx);
  const resources = await measureResources(ctx);
  const conc = await measureConcurrency(ctx);
  const agentAfterConc = await procStatus(agentPid);
  const soak = await measureSoak(ctx, conc.enimPods);
  const agentEnd = await procStatus(agentPid);
  const cri = settings.criRounds > 0 && criUnmet.length === 0
    ? await measureCri(node, settings.criRounds)
    : null;
  if (settings.criRounds > 0 && criUnmet.length > 0) {
    console.error(`CRI timing skipped: cannot install ${criUnmet.join(", ")}`);
  }

  // ---- report
  const goals = {
    startupOverFloor: startupGoal(startup),
    ...resourceGoals(resources),
    addP50Ratio: serial.ratio.ADD.p50 <= 1.5,
    delP50Ratio: serial.ratio.DEL.p50 <= 1.5,
    agentApiAloneAdd: agentApiGoal(api, serial),
    concurrencyWall: concurrencyGoal(conc),
    ...criGoals(cri),
    agentVmHWM: agentMemoryGoal(agentEnd),
    soakFlat: soakGoal(soak),
  };
  reportStartup(startup);
  reportKernelMove(moveFloor, startup.floor.p50, serial.s.reference.ADD.p50);
  reportSerial(serial, ITER);
  reportBackToBack(b2b, ITER);
  reportTimeSplit(serial, api, ITER);
  reportBandwidth(bandwidth);
  reportSerialPhases(serial);
  reportResources(resources, settings.rssRuns, agentEnd, agentAfterConc);
  reportConcurrency(conc, ROUNDS, PARALLEL);
  reportSoak(soak);
  if (cri) reportCri(cri, settings.criRounds);
  console.log(
    `\ngoals (issues #11 and #23): ${
      Object.entries(goals).map(([k, v]) => `${k} ${verdict(v)}`).join(", ")
    }`,
  );
  failed = soakFailed(soak);

  const { enim, reference, floor, enimOverFloor } = startup;
  Object.assign(results, {
    startup: { enim, reference, floor, enimOverFloor },
    floor,
    serial: serial.s,
    ratio: serial.ratio,
    phases: serial.phases,
    agentOperationMeanMs: serial.agentOp,
    pluginOverheadMs: serial.overhead,
    agentApiAlone: api.stats,
    backToBack: backToBackJson(b2b),
    bandwidth,
    rssKb: {
      enimPlugin: resources.rss.enim,
      referencePlugin: resources.rss.reference,
      agentVmHWM: agentEnd.VmHWM,
      agentVmRSS: agentEnd.VmRSS,
    },
    cpuMs: resources.cpu,
    concurrency: { ...conc.cs, wallRatio: conc.wallRatio, phases: conc.phases },
    kernelMoveMsPerBatch: moveFloor,
    agentCpuPerApiAdd: { own: api.cpu.own / ITER, children: api.cpu.children / ITER },
    soak,
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
await Deno.writeTextFile(settings.out, JSON.stringify(results, null, 2) + "\n");
console.log(
  `\nwrote ${settings.out}; ${
    ((performance.now() - t0) / 1000).toFixed(0)
  } s; namespaces removed, agent stopped`,
);
Deno.exit(failed ? 1 : 0);
