/**
 * Bench section: 16 pods ADDed in parallel, then DELed in parallel, per contender, a
 * warm-up round and then the timed ones; the wall time per round against the
 * reference's, and the agent's phases under that load.
 *
 * @module
 */
import { type BenchContext, cni, newCid, podNetns, type PodSlot } from "./_cni.ts";
import { type Hist, parsePhases, phaseDelta, type PhaseFigure, printPhases } from "./_metrics.ts";
import { fmt, type Stats, stats, verdict } from "./_stats.ts";

/** The section's figures. */
export interface Concurrency {
  cs: {
    enim: Record<"ADD" | "DEL" | "wallAdd" | "wallDel" | "wallDelDone", Stats>;
    reference: Record<"ADD" | "DEL" | "wallAdd" | "wallDel", Stats>;
  };
  wallRatio: {
    ADD: number;
    DEL: number;
    /** enim's DELs until every device is home too (they answer before the move home). */
    DEL_DONE: number;
  };
  phases: Record<string, PhaseFigure>;
  /** enim's pod slots (the soak checks they are left empty). */
  enimPods: PodSlot[];
}

/** Runs the section. */
export async function measureConcurrency(ctx: BenchContext): Promise<Concurrency> {
  const { node, settings: { parallel, rounds } } = ctx;
  const series = () => ({
    ADD: [] as number[],
    DEL: [] as number[],
    wallAdd: [] as number[],
    wallDel: [] as number[],
    wallDelDone: [] as number[],
  });
  const conc = { enim: series(), reference: series() };
  const enimPods: PodSlot[] = [];
  const refPods: PodSlot[] = [];
  for (let i = 0; i < parallel; i++) {
    enimPods.push({ ns: await podNetns(node, `ce${i}`), containerId: "" });
    const eni = node.vpc.newEni();
    await node.vpc.plugEni(eni);
    refPods.push({ ns: await podNetns(node, `cr${i}`), containerId: "", eni });
  }
  let concBefore: Hist = new Map();
  const sides = [
    [ctx.contenders.enim, enimPods],
    [ctx.contenders.reference, refPods],
  ] as const;
  for (let r = 0; r < rounds + 1; r++) {
    if (r === 1) concBefore = parsePhases(await node.client.metrics());
    for (const [c, pods] of sides) {
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
  const phases = phaseDelta(concBefore, parsePhases(await node.client.metrics()));
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
    DEL_DONE: cs.enim.wallDelDone.p50 / cs.reference.wallDel.p50,
  };
  return { cs, wallRatio, phases, enimPods };
}

/** The goal: enim's wall time per round at most the reference's, for ADD and DEL. */
export const concurrencyGoal = (c: Concurrency): boolean =>
  c.wallRatio.ADD <= 1.0 && c.wallRatio.DEL <= 1.0;

/** Prints the section. */
export function reportConcurrency(c: Concurrency, rounds: number, parallel: number): void {
  const { cs, wallRatio } = c;
  console.log(
    `\nconcurrency: ${rounds} rounds of ${parallel} pods ADDed in parallel, then DELed in parallel`,
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
      verdict(concurrencyGoal(c))
    })`,
  );
  console.log(`  enim per-phase inside the agent under 16-way concurrency (from /metrics; ms)`);
  printPhases(c.phases, "    ", 22);
}
