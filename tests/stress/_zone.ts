/**
 * The zone mode of `deno task stress` (`--zone`, issue 26): two simulated nodes
 * of one zone on one simulated VPC, each agent on the BCE provider with its
 * sticky pods kept zone-wide, one fake BCE cloud whose attaches and detaches take
 * a while (`--cloud-delay-ms`), built by `support/zone_cluster.ts` as the
 * two-node end-to-end test builds it. Rounds of
 *
 * 1. clients move pods between the nodes for a random while: a sticky pod's DEL
 *    on its node (it parks its ENI), then its ADD on the other (which claims it);
 *    a plain pod moves or is re-created on its node. As a runtime does, a DEL is
 *    retried until it succeeds, and a failed ADD is DELeted and tried again with a
 *    new container;
 * 2. either agent is SIGKILLed: most often aimed at an ENI the cloud shows
 *    `attaching` or `detaching` (the kill lands mid-claim or mid-park, counted from
 *    the cloud's status and record at the kill), otherwise at a random moment;
 * 3. it is restarted; the moves in flight finish, the cloud and the agents settle;
 * 4. both nodes are checked: each node's own invariants (`_checker.ts`, against
 *    what its runtime was told) and the cross-node ones (`_zone_checker.ts`).
 *
 * At the end every pod is deleted (DEL), a GC pass runs on each node, every hold
 * expires, and nothing may be left in the cloud or on a node. A planted
 * cross-node violation (an ENI attached to a node behind its agent's back) runs a
 * third of the way in: the checker must report it.
 *
 * @module
 */
import { prng } from "../support/agent_proc.ts";
import type { NetnsHandle } from "../support/vpc.ts";
import type { CniOutcome } from "../support/node.ts";
import { INSTANCES, stickyEvents, ZoneCluster, type ZoneNode } from "../support/zone_cluster.ts";
import { decodeRecord } from "../../providers/bce/_sticky.ts";
import { checkInvariants, type Violation, VIOLATION_CLASSES } from "./_checker.ts";
import { addedFrom } from "./_clients.ts";
import { Model, type PodRecord } from "./_model.ts";
import { runLimits, type StressOptions } from "./_options.ts";
import type { StressIo } from "./_run.ts";
import { checkZone, readZoneViews } from "./_zone_checker.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The figures of a zone run. */
export interface ZoneFigures {
  rounds: number;
  /** Agent SIGKILLs per node. */
  kills: Record<string, number>;
  killsTotal: number;
  /** Kills aimed at an ENI the cloud showed attaching or detaching. */
  aimed: number;
  /**
   * Parks a kill cut: zone-sticky ENIs detaching from the victim's instance with their
   * parked record at the kill (one kill may cut several).
   */
  midPark: number;
  /** Claims a kill cut: parked ENIs attaching to the victim's instance at the kill. */
  midClaim: number;
  /** Other attaches and detaches of the victim's instance a kill cut. */
  midOther: number;
  /** Pods moved to the other node (sticky and plain). */
  moves: number;
  /** Sticky pods' moves that kept their ENI (same MAC). */
  stickyMoves: number;
  stickyKept: number;
  /** Plain pods re-created on their own node. */
  recreates: number;
  /** ADD attempts that failed and were DELeted and retried, as a runtime does. */
  addRetries: number;
  /** Invariant checks (each covers both nodes and the cloud). */
  checks: number;
  /**
   * Expiries the agents counted at the end (`enim_sticky_zone_events_total{event="expiry"}`:
   * in-process counters, so those since each agent's last start).
   */
  expiries: number;
  /** Operations by verb and outcome. */
  ops: Record<string, Record<string, number>>;
  /** Milliseconds from a kill's restart to the agent answering. */
  restartMs: number[];
}

/** A violation as reported. */
export interface ZoneViolation extends Violation {
  round: number;
  kills: number;
  repeats: number;
}

/** What a zone run found. */
export interface ZoneStressReport {
  seed: number;
  options: StressOptions;
  figures: ZoneFigures;
  violations: ZoneViolation[];
  plants: { name: string; expect: string; subject: string | null; caught: boolean | null }[];
  stoppedBy: "kills" | "time" | "signal" | "violation";
  durationMs: number;
  logDir: string | null;
}

/** One pod of the run. */
interface ZonePod {
  name: string;
  short: string;
  sticky: boolean;
  /** The index of its node in the cluster. */
  node: number;
  sandbox: { handle: NetnsHandle; rec: PodRecord; cid: string; mac: string } | null;
  gen: number;
  busy: boolean;
}

/** Runs the zone mode (see the module doc); cleans up everything it created. */
export async function runZoneStress(opts: StressOptions, io: StressIo): Promise<ZoneStressReport> {
  const t0 = performance.now();
  const rand = prng(opts.seed);
  const runId = `z${opts.seed.toString(36)}`;
  const f: ZoneFigures = {
    rounds: 0,
    kills: { A: 0, B: 0 },
    killsTotal: 0,
    aimed: 0,
    midPark: 0,
    midClaim: 0,
    midOther: 0,
    moves: 0,
    stickyMoves: 0,
    stickyKept: 0,
    recreates: 0,
    addRetries: 0,
    checks: 0,
    expiries: 0,
    ops: {},
    restartMs: [],
  };
  const violations = new Map<string, ZoneViolation>();
  const plants: ZoneStressReport["plants"] = [];
  let stoppedBy: ZoneStressReport["stoppedBy"] = "kills";
  let logDir: string | null = null;
  const { aborted, stop } = runLimits(io.signal, opts.minutes);
  const count = (verb: string, outcome: string) => {
    const m = (f.ops[verb] ??= {});
    m[outcome] = (m[outcome] ?? 0) + 1;
  };
  const report = (vs: Violation[], what: string): ZoneViolation[] => {
    const fresh: ZoneViolation[] = [];
    for (const v of vs) {
      const id = `${v.class}|${v.subject}`;
      const seen = violations.get(id);
      if (seen) {
        seen.repeats++;
        continue;
      }
      const z: ZoneViolation = { ...v, round: f.rounds, kills: f.killsTotal, repeats: 0 };
      violations.set(id, z);
      fresh.push(z);
      io.log(
        `VIOLATION ${v.class} (${what}, round ${f.rounds}, after ${f.killsTotal} kills): ${v.message}`,
      );
    }
    return fresh;
  };

  const cluster = await ZoneCluster.start({
    logLevel: "info",
    holdSeconds: opts.holdSeconds,
    gcIntervalSeconds: 2,
    timeouts: { orphanScanIntervalMs: 2000, parkedExpiryGraceMs: 0 },
  });
  const nodes: ZoneNode[] = cluster.zoneNodes;
  const models = nodes.map(() => new Model(runId, [], t0, 0));
  const pods: ZonePod[] = [
    ...Array.from(
      { length: opts.pods },
      (_, i) => ({ name: `sticky-${i}`, short: `s${i}`, sticky: true }),
    ),
    ...Array.from(
      { length: opts.plainPods },
      (_, i) => ({ name: `plain-${i}`, short: `q${i}`, sticky: false }),
    ),
  ].map((p, i) => ({ ...p, node: i % nodes.length, sandbox: null, gen: 0, busy: false }));

  // ---- the gate: clients start no new move while paused; the driver waits for idle
  let paused = true, stopped = false, inFlight = 0;
  let gate = Promise.withResolvers<void>();
  const idleWaiters: (() => void)[] = [];
  const resume = () => {
    paused = false;
    gate.resolve();
  };
  const pause = () => {
    if (paused) return;
    paused = true;
    gate = Promise.withResolvers<void>();
  };
  const idle = () =>
    inFlight === 0 ? Promise.resolve() : new Promise<void>((r) => idleWaiters.push(r));

  /** A runtime's DEL: retried until it succeeds (bounded: past that, a violation). */
  const delUntil = async (
    n: number,
    pod: ZonePod,
    rec: PodRecord,
    handle: NetnsHandle,
    cid: string,
  ) => {
    const node = nodes[n];
    const k = models[n].key(rec, cid);
    for (let i = 0;; i++) {
      const r = await cluster.del(node.node, handle, cid, pod.name, pod.sticky);
      count(`DEL/${node.label}`, outcome(r));
      if (r.code === 0) {
        k.status = "deleted";
        models[n].released(k);
        models[n].note(k, "DEL acknowledged");
        return true;
      }
      models[n].note(k, `DEL failed: ${outcome(r)}`);
      if (i >= 300) {
        report([{
          class: "zone_move_stuck",
          subject: `${node.label}:${cid}`,
          message: `DEL of "${cid}" (pod ${pod.name}) on node ${node.label} kept failing: ${
            said(r)
          }`,
          context: {},
        }], "a move");
        return false;
      }
      await sleep(200);
    }
  };
  const recFor = (n: number, pod: ZonePod, handle: NetnsHandle): PodRecord => {
    const m = models[n];
    const rec: PodRecord = {
      index: m.pods.length,
      name: pod.name,
      short: pod.short,
      nsName: handle.name,
      path: handle.path,
      gen: 0,
      exists: true,
      ino: null,
      ctr: 0,
      busy: false,
      old: [],
    };
    m.pods.push(rec);
    return rec;
  };

  /** A new sandbox of `pod` on node `n`: ADD until one succeeds (each failure DELeted). */
  const addOn = async (n: number, pod: ZonePod): Promise<void> => {
    const node = nodes[n];
    const handle = await node.node.vpc.pod(`${pod.short}g${pod.gen++}`);
    const rec = recFor(n, pod, handle);
    for (let attempt = 0;; attempt++) {
      const cid = `${runId}-${pod.short}-${pod.gen}-${attempt}`;
      const k = models[n].key(rec, cid);
      k.status = "pending";
      models[n].note(k, `ADD on node ${node.label}`);
      const r = await cluster.add(node.node, handle, cid, pod.name, pod.sticky);
      count(`ADD/${node.label}`, outcome(r));
      if (r.code === 0 && r.json) {
        k.status = "added";
        k.added = addedFrom({ code: 0, json: r.json }, "plugin", rec, "eth0");
        models[n].note(k, `ADD acknowledged: MAC ${k.added!.mac}`);
        pod.node = n;
        pod.sandbox = { handle, rec, cid, mac: k.added!.mac };
        return;
      }
      k.status = "unknown";
      models[n].note(k, `ADD failed: ${outcome(r)}`);
      f.addRetries++;
      await delUntil(n, pod, rec, handle, cid);
      if (attempt >= 150) {
        report([{
          class: "zone_move_stuck",
          subject: `${node.label}:${pod.name}`,
          message: `Pod ${pod.name} never got an ENI on node ${node.label}: ${said(r)}`,
          context: {},
        }], "a move");
        rec.exists = false;
        await node.node.vpc.deletePod(handle);
        return;
      }
      await sleep(200);
    }
  };

  /** Deletes the pod's sandbox: DEL until it succeeds, then its namespace goes. */
  const removeSandbox = async (pod: ZonePod) => {
    const s = pod.sandbox;
    if (!s) return;
    await delUntil(pod.node, pod, s.rec, s.handle, s.cid);
    s.rec.exists = false;
    await nodes[pod.node].node.vpc.deletePod(s.handle);
    pod.sandbox = null;
  };

  /** One move: a sticky pod to the other node; a plain pod there or re-created here. */
  const move = async (pod: ZonePod, r: () => number) => {
    const from = pod.node;
    const to = pod.sticky || r() < 0.5 ? 1 - from : from;
    const mac = pod.sandbox?.mac;
    await removeSandbox(pod);
    await addOn(to, pod);
    if (to === from) f.recreates++;
    else f.moves++;
    if (pod.sticky && to !== from && mac) {
      f.stickyMoves++;
      if (pod.sandbox?.mac === mac) f.stickyKept++;
    }
  };

  const client = async (index: number) => {
    const r = prng((opts.seed ^ (index * 0x9e3779b9)) >>> 0);
    while (!stopped) {
      if (paused) {
        await gate.promise;
        continue;
      }
      const free = pods.filter((p) => !p.busy);
      if (free.length === 0) {
        await sleep(20);
        continue;
      }
      const pod = free[Math.floor(r() * free.length)];
      pod.busy = true;
      inFlight++;
      try {
        await move(pod, r);
      } catch (err) {
        io.log(`client ${index}: ${err instanceof Error ? err.message : err}`);
      } finally {
        pod.busy = false;
        if (--inFlight === 0) { for (const w of idleWaiters.splice(0)) w(); }
      }
      await sleep(r() * 100);
    }
  };

  const check = async (what: string, final = false) => {
    const views = await readZoneViews(cluster, {
      podNames: (label) => {
        const i = nodes.findIndex((n) => n.label === label);
        return i < 0 ? [] : models[i].namesToRead();
      },
      final,
    });
    f.checks++;
    const found: Violation[] = checkZone(views);
    for (const [i, n] of nodes.entries()) {
      const v = views.nodes.find((x) => x.label === n.label)!;
      if (!v.agent) continue;
      const per = checkInvariants({
        attachments: v.agent.attachments,
        enis: v.agent.enis,
        kernel: v.kernel,
        model: models[i],
        unaccounted: [],
        ...(final ? { final: { leftoverNetns: [] } } : {}),
      });
      found.push(
        ...per.map((x) => ({
          ...x,
          subject: `${n.label}:${x.subject}`,
          message: `node ${n.label}: ${x.message}`,
        })),
      );
    }
    return { found, fresh: report(found, what) };
  };

  /** Kills one agent (aimed at an ENI in transit most of the time) and restarts it. */
  const killRound = async (windowMs: number) => {
    let victim = nodes[Math.floor(rand() * nodes.length)];
    let before = null as Awaited<ReturnType<typeof cluster.fake.state>> | null;
    if (rand() < 0.7) {
      // Half the aimed kills wait for an attach (a claim), half for a detach (a park):
      // every move detaches first, so aiming at whichever comes first would miss claims.
      const want = rand() < 0.5 ? "attaching" : "detaching";
      const until = Date.now() + windowMs + (want === "attaching" ? 1500 : 0);
      while (Date.now() < until) {
        const st = await cluster.fake.state();
        const moving = st.enis.filter((e) =>
          e.status === want && nodes.some((n) => n.instanceId === e.instanceId)
        );
        if (moving.length) {
          const e = moving[Math.floor(rand() * moving.length)];
          victim = nodes.find((n) => n.instanceId === e.instanceId)!;
          before = st;
          f.aimed++;
          break;
        }
        await sleep(25);
      }
    } else {
      await sleep(windowMs);
    }
    before ??= await cluster.fake.state();
    pause();
    await victim.node.stopAgent("SIGKILL");
    f.kills[victim.label]++;
    f.killsTotal++;
    for (const e of before.enis.filter((x) => x.instanceId === victim.instanceId)) {
      const rec = decodeRecord(e.description);
      if (e.status === "detaching" && rec?.state === "parked") f.midPark++;
      else if (e.status === "attaching" && rec?.state === "parked") f.midClaim++;
      else if (e.status === "attaching" || e.status === "detaching") f.midOther++;
    }
    const t = Date.now();
    await victim.node.startAgent();
    f.restartMs.push(Date.now() - t);
    return victim;
  };

  /** The planted cross-node violation: an ENI attached to B behind its agent's back. */
  const plant = async () => {
    const expect = "zone_attached_unrecorded";
    const eniId = await cluster.fake.attachNewOutOfBand(INSTANCES.B);
    const views = await readZoneViews(cluster, {
      podNames: (label) => models[nodes.findIndex((n) => n.label === label)]?.namesToRead() ?? [],
    });
    const found = checkZone(views);
    const caught = found.some((v) => v.class === expect && v.subject === eniId);
    await cluster.fake.outOfBand("delete", eniId);
    plants.push({ name: "foreign_attach", expect, subject: eniId, caught });
    io.log(`planted foreign_attach (${eniId} on ${INSTANCES.B}): ${caught ? "caught" : "MISSED"}`);
    if (!caught) {
      report([{
        class: "plant_missed",
        subject: "foreign_attach",
        message: `The checker did not report the planted ENI "${eniId}" attached to ` +
          `"${INSTANCES.B}" behind its agent's back; it reported: ${
            found.map((v) => `${v.class} ${v.subject}`).join("; ") || "nothing"
          }`,
        context: {},
      }], "the plant");
    }
  };

  let loops: Promise<void>[] = [];
  try {
    await cluster.fake.delays(opts.cloudDelayMs, opts.cloudDelayMs);
    for (const p of pods) await addOn(p.node, p);
    await cluster.settle(60_000);
    await check("first start");
    loops = Array.from({ length: opts.clients }, (_, i) => client(i));
    const plantRound = opts.plant ? Math.max(1, Math.floor(opts.kills / 3)) : -1;
    while (f.killsTotal < opts.kills) {
      const early = stop();
      if (early) {
        stoppedBy = early;
        break;
      }
      f.rounds++;
      resume();
      const victim = await killRound(200 + rand() * 2500);
      await idle();
      await cluster.settle(60_000);
      const { fresh } = await check(`after kill ${f.killsTotal} (node ${victim.label})`);
      if (opts.verbose || f.rounds % 10 === 0) {
        io.log(
          `… ${f.killsTotal}/${opts.kills} kills (mid-park ${f.midPark}, mid-claim ${f.midClaim}), ` +
            `${f.moves} moves, ${f.checks} checks, ${violations.size} violations`,
        );
      }
      if (fresh.length && opts.stopOnViolation) {
        stoppedBy = "violation";
        break;
      }
      if (f.rounds === plantRound) {
        await plant();
        await cluster.settle(60_000);
        await check("after undoing the plant");
      }
    }
    if (opts.plant && plants.length === 0 && !aborted()) await plant();
    stopped = true;
    resume();
    await Promise.all(loops);
    loops = [];

    if (!aborted()) {
      // The final pass: every pod deleted, a GC pass on each node, every hold expired.
      f.rounds++;
      for (const p of pods) await removeSandbox(p);
      await cluster.settle(60_000);
      for (const n of nodes) {
        const gc = await n.node.enim(["gc", "--json"]);
        if (gc.code !== 0) {
          io.log(`final GC on ${n.label}: exit ${gc.code} ${gc.stderr.slice(-300)}`);
        }
      }
      const until = Date.now() + opts.holdSeconds * 1000 + 60_000;
      for (;;) {
        const st = await cluster.fake.state();
        if (!st.enis.some((e) => e.status !== "inuse") || Date.now() > until) break;
        await sleep(250);
      }
      await cluster.settle(60_000);
      for (const n of nodes) f.expiries += await stickyEvents(n.node, "expiry");
      await check("after the final GC and expiry", true);
    }
    if (aborted()) stoppedBy = "signal";
  } finally {
    stopped = true;
    resume();
    await Promise.allSettled(loops);
    if (violations.size > 0) logDir = await keepLogs(cluster, opts.seed).catch(() => null);
    await cluster.close();
  }
  return {
    seed: opts.seed,
    options: opts,
    figures: f,
    violations: [...violations.values()],
    plants,
    stoppedBy,
    durationMs: Math.round(performance.now() - t0),
    logDir,
  };
}

function outcome(r: CniOutcome): string {
  if (r.code === 0) return "ok";
  const code = (r.json as { code?: unknown } | null)?.code;
  return typeof code === "number" ? `code ${code}` : `exit ${r.code}`;
}

function said(r: CniOutcome): string {
  return `exit ${r.code}: ${(r.stdout + r.stderr).slice(0, 600)}`;
}

/** Copies both agents' logs out of their sandboxes before they go. */
async function keepLogs(cluster: ZoneCluster, seed: number): Promise<string> {
  const dir = `/tmp/enim-stress-zone-${seed}-${new Date().toISOString().replace(/[:.]/g, "-")}`;
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  for (const n of cluster.zoneNodes) {
    for (const file of ["agent.log", "agent.stderr", "cni.log"]) {
      await Deno.copyFile(n.node.sandbox.host(file), `${dir}/${n.label}-${file}`).catch(() => {});
    }
  }
  return dir;
}

/** The command line that runs the same zone configuration again. */
export function reproduceZone(o: StressOptions): string {
  return [
    "deno task stress --zone",
    `--seed ${o.seed}`,
    `--kills ${o.kills}`,
    `--pods ${o.pods}`,
    `--plain-pods ${o.plainPods}`,
    `--clients ${o.clients}`,
    `--hold-seconds ${o.holdSeconds}`,
    `--cloud-delay-ms ${o.cloudDelayMs}`,
  ].join(" ");
}

/** A zone report as text: the seed, the figures, each violation with its context. */
export function formatZoneReport(r: ZoneStressReport): string {
  const f = r.figures;
  const pct = (xs: number[], p: number) => {
    if (xs.length === 0) return 0;
    const s = [...xs].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.floor(s.length * p))];
  };
  const lines = [
    `seed ${r.seed}  (reproduce: ${reproduceZone(r.options)})`,
    `${f.rounds} rounds in ${(r.durationMs / 1000).toFixed(0)} s, stopped by ${r.stoppedBy}; ` +
    `2 nodes, ${r.options.pods} sticky pods, ${r.options.plainPods} plain pods, ${r.options.clients} clients`,
    `agent SIGKILLs: ${f.killsTotal} (A ${f.kills.A}, B ${f.kills.B}; ${f.aimed} aimed at an ENI in transit): ` +
    `mid-park ${f.midPark}, mid-claim ${f.midClaim}, mid other attach/detach ${f.midOther}`,
    `moves to the other node: ${f.moves} (sticky ${f.stickyMoves}, ${f.stickyKept} kept their ENI); ` +
    `re-created on their node: ${f.recreates}; failed ADDs retried: ${f.addRetries}`,
    `restart to healthy: median ${pct(f.restartMs, 0.5)} ms, max ${pct(f.restartMs, 1)} ms`,
    `invariant checks (both nodes and the cloud): ${f.checks}; ` +
    `expiries the agents counted since their last start: ${f.expiries}`,
    "operations:",
  ];
  for (const verb of Object.keys(f.ops).sort()) {
    const outs = Object.entries(f.ops[verb]).sort((a, b) => b[1] - a[1]).map(([o, n]) =>
      `${o} ${n}`
    );
    lines.push(`  ${verb.padEnd(8)} ${outs.join(", ")}`);
  }
  for (const p of r.plants) {
    lines.push(
      `planted ${p.name} expects ${p.expect}: ${
        p.caught === null ? "not set up" : p.caught ? "caught" : "MISSED"
      }`,
    );
  }
  if (r.logDir) lines.push(`the agents' and the plugin's logs are kept in ${r.logDir}`);
  lines.push(`violations: ${r.violations.length}`);
  for (const v of r.violations) {
    lines.push("");
    lines.push(
      `VIOLATION ${v.class}: ${VIOLATION_CLASSES[v.class]}\n  seed ${r.seed}, round ${v.round}, ` +
        `after ${v.kills} agent kills${
          v.repeats ? `, seen again in ${v.repeats} later checks` : ""
        }\n  ${v.message}`,
    );
    lines.push(JSON.stringify(v.context, null, 2).split("\n").map((l) => `  ${l}`).join("\n"));
  }
  return lines.join("\n");
}
