/**
 * Bench section: what bandwidth shaping adds to enim's ADD and DEL — 10M limits both
 * ways, as containerd passes a pod's annotations, against none, alternating — and the
 * agent's `shape` phase (the one `tc -batch` in the pod).
 *
 * @module
 */
import { type BenchContext, cni, newCid, newSandbox } from "./_cni.ts";
import { parsePhases, phaseDelta, type PhaseFigure } from "./_metrics.ts";
import { fmt, pct, type Stats, stats } from "./_stats.ts";

type Verbs<T> = { ADD: T; DEL: T };

/** The section's figures (as the results file holds them). */
export interface Bandwidth {
  none: Verbs<Stats>;
  shaped: Verbs<Stats>;
  /** What shaping adds to a call, p50 against p50. */
  costMs: Verbs<number>;
  /** The agent's `shape` phase: the one `tc -batch` in the pod. */
  shapePhase: PhaseFigure | null;
  configurePhase: PhaseFigure | null;
}

/** Runs the section. */
export async function measureBandwidth(ctx: BenchContext): Promise<Bandwidth> {
  const { node, enimPod, settings: { warmup, iterations } } = ctx;
  const bw = {
    none: { ADD: [] as number[], DEL: [] as number[] },
    shaped: { ADD: [] as number[], DEL: [] as number[] },
  };
  const bwBefore = parsePhases(await node.client.metrics());
  for (let i = 0; i < warmup + iterations; i++) {
    const pair = [["none", ctx.contenders.enim], ["shaped", ctx.contenders.shaped]] as const;
    for (const [k, c] of i % 2 === 0 ? pair : [...pair].reverse()) {
      enimPod.containerId = newCid(c.name);
      await newSandbox(node, enimPod, `w${k[0]}${i}`);
      const add = await cni(node, c, "ADD", enimPod);
      const del = await cni(node, c, "DEL", enimPod);
      if (i >= warmup) {
        bw[k].ADD.push(add.ms);
        bw[k].DEL.push(del.ms);
      }
    }
  }
  const bwPhases = phaseDelta(bwBefore, parsePhases(await node.client.metrics()));
  return {
    none: { ADD: stats(bw.none.ADD), DEL: stats(bw.none.DEL) },
    shaped: { ADD: stats(bw.shaped.ADD), DEL: stats(bw.shaped.DEL) },
    costMs: {
      ADD: Math.round((pct(bw.shaped.ADD, 50) - pct(bw.none.ADD, 50)) * 10) / 10,
      DEL: Math.round((pct(bw.shaped.DEL, 50) - pct(bw.none.DEL, 50)) * 10) / 10,
    },
    shapePhase: bwPhases["add/shape"] ?? null,
    configurePhase: bwPhases["add/configure"] ?? null,
  };
}

/** Prints the section. */
export function reportBandwidth(bwStats: Bandwidth): void {
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
}
