/**
 * One stress run (what `deno task stress` runs): a simulated node on the mock
 * provider with fewer ENIs than pods, the clients of `_clients.ts`, and rounds of
 *
 * 1. the clients run for a random while;
 * 2. new operations stop and the agent is SIGKILLed with calls in flight;
 * 3. the calls in flight settle (against the dead agent), the kernel settles;
 * 4. the agent is restarted, sometimes SIGKILLed again during start-up or
 *    reconcile (aimed at the reconcile window measured in earlier starts);
 * 5. once it answers, a dry-run GC queues behind its start-up GC pass, and the
 *    state, the provider and the kernel are checked (`_checker.ts`).
 *
 * At the end every pod namespace is deleted, a final `enim gc` runs, and nothing
 * may be left. The planted violations (`_plant.ts`) run once, a third of the way in.
 *
 * @module
 */
import { SimulatedNode } from "../support/node.ts";
import { prng } from "../support/agent_proc.ts";
import { GcReportSchema } from "../../api/schema.ts";
import { AgentRun, type KillPhase, logSize } from "./_agent.ts";
import { checkInvariants, type Violation } from "./_checker.ts";
import { clientLoop, makeClients, Operations } from "./_clients.ts";
import { type Figures, type FoundViolation, StressContext } from "./_context.ts";
import { readKernel, settleKernel } from "./_kernel.ts";
import { Model, type PodRecord } from "./_model.ts";
import { runLimits, type StressOptions } from "./_options.ts";
import { type PlantResult, PLANTS, runPlant } from "./_plant.ts";
import { killLivePlugins } from "./_plugin.ts";

/** What a run found. */
export interface StressReport {
  seed: number;
  options: StressOptions;
  figures: Figures;
  violations: FoundViolation[];
  plants: PlantResult[];
  anomalyExamples: Record<string, string[]>;
  /** Why the rounds ended. */
  stoppedBy: "kills" | "time" | "signal" | "violation" | "agent";
  durationMs: number;
  /** The final GC pass's report items (what it reclaimed). */
  finalGc: { reclaimed: number; failed: number } | null;
  /** Where the agent's and the plugin's logs were kept (when there were violations). */
  logDir: string | null;
}

/** Where a run prints its progress. */
export interface StressIo {
  log(line: string): void;
  /** Aborted on Ctrl-C / SIGTERM: the run stops and cleans up. */
  signal?: AbortSignal;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function median(xs: number[]): number {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** Runs one stress run; cleans up everything it created whatever happens. */
export async function runStress(opts: StressOptions, io: StressIo): Promise<StressReport> {
  const t0 = performance.now();
  const rand = prng(opts.seed);
  const node = await SimulatedNode.start({
    startAgent: false,
    logLevel: "info",
    mock: {
      enis: opts.enis,
      preattached: Math.ceil(opts.enis / 2),
      attachLatencyMs: 3,
      seed: opts.seed,
    },
    gc: { intervalSeconds: 3600, graceSeconds: opts.graceSeconds },
  });
  const prefix = node.vpc.node.name.replace(/-node$/, "");
  const runId = `s${opts.seed.toString(36)}`;
  const pods: PodRecord[] = Array.from({ length: opts.pods }, (_, i) => ({
    index: i,
    name: `pod-${i}`,
    short: `p${i}`,
    nsName: `${prefix}-p${i}`,
    path: `/run/netns/${prefix}-p${i}`,
    gen: 0,
    exists: false,
    ino: null,
    ctr: 0,
    busy: false,
    old: [],
  }));
  const model = new Model(
    runId,
    pods,
    performance.now(),
    opts.graceSeconds * 1000,
  );
  const ctx = new StressContext(node, model, opts);
  const ops = new Operations(ctx);
  const plants: PlantResult[] = [];
  let agent: AgentRun | null = null;
  let loops: Promise<void>[] = [];
  let stoppedBy: StressReport["stoppedBy"] = "kills";
  let finalGc: StressReport["finalGc"] = null;
  let logDir: string | null = null;
  const lastTimes: { started?: number; reconciled?: number } = {};
  const { aborted, stop } = runLimits(io.signal, opts.minutes);
  const podNames = () => model.namespaceNames();
  /** MACs found astray at a check: later settles do not wait for them again. */
  const stuck = new Set<string>();
  const settle = async () => {
    const pending = await settleKernel(
      node.vpc.node.name,
      node.vpc.vpc.name,
      podNames,
      3000,
      stuck,
    );
    for (const m of pending) stuck.add(m);
    return pending;
  };

  const start = async (): Promise<AgentRun> => {
    const a = new AgentRun(node, await logSize(node.logPath));
    agent = a;
    return a;
  };
  const kill = async (phaseHint: number): Promise<KillPhase> => {
    const a = agent!;
    // Before the signal: an operation that ends after it has seen the agent die.
    ctx.agentEpoch++;
    const phase = await a.kill(phaseHint);
    model.agentKilled();
    const t = a.times;
    if (t.started !== undefined && t.reconciled !== undefined) {
      lastTimes.started = t.started;
      lastTimes.reconciled = t.reconciled;
    }
    agent = null;
    ctx.figures.kills[phase]++;
    ctx.figures.killsTotal++;
    return phase;
  };
  /** Starts the agent until it answers, with kills during start-up at random moments. */
  const restart = async (): Promise<void> => {
    for (let tries = 0;; tries++) {
      const a = await start();
      const more = ctx.figures.killsTotal < opts.kills && tries < 3 &&
        rand() < opts.startupKillRate;
      if (more) {
        // Aim at the reconcile window of earlier starts most of the time.
        const med = median(ctx.figures.restartMs) || 300;
        let delay: number;
        if (lastTimes.started !== undefined && lastTimes.reconciled !== undefined && rand() < 0.6) {
          const lo = Math.max(0, lastTimes.started - 10);
          const hi = lastTimes.reconciled + 15;
          delay = lo + rand() * (hi - lo);
        } else {
          delay = rand() * med * 1.2;
        }
        await sleep(delay);
        await a.readTimes();
        await kill(0);
        await settle();
        continue;
      }
      try {
        await a.waitHealthy(node.socket, 60_000);
      } catch (err) {
        await a.kill(0);
        agent = null;
        ctx.violation(
          "agent_start_failed",
          `pid ${a.pid}`,
          String(err instanceof Error ? err.message : err),
          {
            log: (await a.logLines()).slice(-20).map((l) => l.raw),
          },
        );
        throw new AgentStartError(err);
      }
      await a.readTimes();
      ctx.figures.restartMs.push(a.times.healthy!);
      return;
    }
  };

  /** Reads the three views and checks them. */
  const views = async (final?: { leftoverNetns: string[] }): Promise<Violation[]> => {
    // Queue behind the start-up GC pass (the GC lock is FIFO): nothing moves after this.
    await node.client.gc({ dryRun: true });
    const unaccounted = await settle();
    const [attachments, enis, kernel] = await Promise.all([
      node.client.attachments(),
      node.client.enis(),
      readKernel(node.vpc.node.name, node.vpc.vpc.name, model.namesToRead()),
    ]);
    ctx.figures.checks++;
    return checkInvariants({ attachments, enis, kernel, model, unaccounted, final });
  };
  const checkAndReport = async (what: string, final?: { leftoverNetns: string[] }) => {
    const fresh = ctx.report(await views(final));
    for (const v of fresh) {
      io.log(
        `VIOLATION ${v.class} (${what}, round ${v.round}, after ${v.kills} kills): ${v.message}`,
      );
    }
    return fresh;
  };

  /** Runs every planted violation; one the checker misses is a violation itself. */
  const plantAll = async () => {
    for (const p of PLANTS) {
      const res = await runPlant(ctx, ops, p, () => views());
      plants.push(res);
      if (res.caught === false) {
        ctx.violation(
          "plant_missed",
          p.name,
          `The checker did not report the planted ${p.name} (${p.expect} of ${res.subject}); ` +
            `it reported: ${res.reported.join("; ") || "nothing"}`,
          {},
        );
      }
      io.log(
        `planted ${p.name}: ${
          res.caught === null ? `not set up (${res.note})` : res.caught ? "caught" : "MISSED"
        }`,
      );
      await checkAndReport(`after undoing the planted ${p.name}`);
    }
  };

  try {
    await restart();
    await checkAndReport("first start");
    loops = makeClients(opts.clients, opts.seed).map((c) => clientLoop(ops, c));
    const plantRound = opts.plant ? Math.max(1, Math.floor(opts.kills / 3)) : -1;
    let plantsDone = !opts.plant;
    while (ctx.figures.killsTotal < opts.kills) {
      const early = stop();
      if (early) {
        stoppedBy = early;
        break;
      }
      model.round = ++ctx.figures.rounds;
      ctx.resume();
      // Mostly short windows (kills land among the first calls), sometimes long ones.
      const r = rand();
      const windowMs = r < 0.35 ? rand() * 60 : r < 0.85 ? 60 + rand() * 400 : 460 + rand() * 1800;
      await sleep(windowMs);
      ctx.pause();
      const inFlight = ctx.inFlight;
      const phase = await kill(inFlight);
      await ctx.idle();
      await settle();
      await restart();
      const fresh = await checkAndReport(`after kill ${ctx.figures.killsTotal} (${phase})`);
      if (opts.verbose) {
        io.log(
          `round ${ctx.figures.rounds}: window ${
            Math.round(windowMs)
          } ms, ${inFlight} in flight, ` +
            `kills ${ctx.figures.killsTotal}, plugin kills ${ctx.figures.pluginKills}, ` +
            `restart ${ctx.figures.restartMs.at(-1)} ms, violations ${ctx.violations.size}`,
        );
      } else if (ctx.figures.rounds % 25 === 0) {
        io.log(
          `… ${ctx.figures.killsTotal}/${opts.kills} kills, ${ctx.figures.pluginKills} plugin kills, ` +
            `${ctx.figures.checks} checks, ${ctx.violations.size} violations`,
        );
      }
      if (fresh.length && opts.stopOnViolation) {
        stoppedBy = "violation";
        break;
      }
      if (!plantsDone && ctx.figures.rounds >= plantRound) {
        plantsDone = true;
        await plantAll();
      }
    }
    if (!plantsDone && !aborted()) await plantAll();
    ctx.stop();
    await Promise.all(loops);
    loops = [];

    if (!aborted()) {
      // The final pass: every pod deleted without DEL, one GC pass, nothing may be left.
      model.round = ++ctx.figures.rounds;
      for (const p of pods) {
        await ops.deletePod(p, "all pods deleted for the final GC");
        for (const o of [...p.old]) {
          await ops.deleteOldSandbox(p, o.gen, "all pods deleted for the final GC");
        }
      }
      await settle();
      if (opts.graceSeconds > 0) {
        await agent!.stop();
        agent = null;
        await node.editConfig((c) => {
          (c.gc as Record<string, unknown>).graceSeconds = 0;
        });
        await restart();
      }
      const gc = await node.enim(["gc", "--json"]);
      try {
        const report = GcReportSchema.parse(JSON.parse(gc.stdout));
        const failed = report.items.filter((i) => i.outcome === "failed").length;
        finalGc = { reclaimed: report.items.length - failed, failed };
      } catch {
        ctx.anomaly(
          "final_gc_failed",
          `exit ${gc.code}: ${gc.stdout.slice(0, 300)} ${gc.stderr.slice(-300)}`,
        );
      }
      const leftover = [...Deno.readDirSync("/run/netns")].map((e) => e.name)
        .filter((n) =>
          /^p\d+(g\d+)?$/.test(n.slice(prefix.length + 1)) && n.startsWith(`${prefix}-`)
        );
      await checkAndReport("after the final GC", { leftoverNetns: leftover });
      const s = await agent!.stop();
      agent = null;
      if (s.code !== 0) {
        ctx.anomaly("agent_sigterm_exit", `the agent exited with ${s.code} on SIGTERM`);
      }
    }
    if (aborted()) stoppedBy = "signal";
  } catch (err) {
    if (!(err instanceof AgentStartError)) throw err;
    stoppedBy = "agent";
  } finally {
    ctx.stop();
    killLivePlugins();
    await countGcLeft(node.logPath, ctx.figures).catch(() => {});
    ctx.figures.gcLeft.excused = [...model.keys.values()].filter((k) => k.staleExcused).length;
    if (agent) await (agent as AgentRun).kill(0).catch(() => {});
    await Promise.allSettled(loops);
    if (ctx.violations.size > 0) logDir = await keepLogs(node, opts.seed).catch(() => null);
    await node.close().catch((err) => io.log(`cleanup: ${err}`));
  }
  return {
    seed: opts.seed,
    options: opts,
    figures: ctx.figures,
    violations: [...ctx.violations.values()],
    plants,
    anomalyExamples: Object.fromEntries(ctx.anomalyExamples),
    stoppedBy,
    durationMs: Math.round(performance.now() - t0),
    finalGc,
    logDir,
  };
}

/** Counts, in the agent's log, the attachments GC passes left alone and why. */
async function countGcLeft(logPath: string, figures: Figures): Promise<void> {
  const text = await Deno.readTextFile(logPath);
  for (const line of text.split("\n")) {
    if (line.includes('"GC leaves a young attachment a CNI GC did not list"')) {
      figures.gcLeft.young++;
    } else if (
      line.includes('"GC leaves an attachment an ADD confirmed after the pass')
    ) {
      figures.gcLeft.confirmed++;
    }
  }
}

/** The agent did not come back after a kill: the run ends (reported as a violation). */
class AgentStartError extends Error {
  constructor(cause: unknown) {
    super(`The agent did not come back: ${cause instanceof Error ? cause.message : cause}`, {
      cause,
    });
    this.name = "AgentStartError";
  }
}

/** Copies the agent's log, its stderr and the plugin's log out of the sandbox before it goes. */
async function keepLogs(node: SimulatedNode, seed: number): Promise<string> {
  const dir = `/tmp/enim-stress-${seed}-${new Date().toISOString().replace(/[:.]/g, "-")}`;
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  for (const f of ["agent.log", "agent.stderr", "cni.log", "agent.jsonc"]) {
    await Deno.copyFile(node.sandbox.host(f), `${dir}/${f}`).catch(() => {});
  }
  return dir;
}
