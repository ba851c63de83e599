/**
 * Bench section: ADD then DEL of one pod, enim and the reference alternating (the
 * order flips every iteration), each in a new sandbox namespace; and what the agent's
 * own operation and phases took meanwhile (from its /metrics).
 *
 * @module
 */
import { type BenchContext, cni, newCid, newSandbox } from "./_cni.ts";
import { parseOps, parsePhases, phaseDelta, type PhaseFigure, printPhases } from "./_metrics.ts";
import { fmt, type Stats, stats, verdict } from "./_stats.ts";

type Verbs<T> = { ADD: T; DEL: T };

/** The serial run's figures. */
export interface Serial {
  s: { enim: Verbs<Stats>; reference: Verbs<Stats> };
  ratio: Verbs<{ p50: number; p99: number }>;
  /** The agent's phases during the run. */
  phases: Record<string, PhaseFigure>;
  /** The agent's operation mean (ms) per op. */
  agentOp: Record<string, number>;
  /** The plugin side: what a CNI call costs beyond the agent's own operation. */
  overhead: Verbs<number>;
}

/** Runs the section. */
export async function measureSerial(ctx: BenchContext): Promise<Serial> {
  const { node, settings: { warmup, iterations } } = ctx;
  const { enim, reference } = ctx.contenders;
  const lat = {
    enim: { ADD: [] as number[], DEL: [] as number[] },
    reference: { ADD: [] as number[], DEL: [] as number[] },
  };
  const beforeText = await node.client.metrics();
  const before = parsePhases(beforeText);
  for (let i = 0; i < warmup + iterations; i++) {
    const order = i % 2 === 0
      ? [[enim, ctx.enimPod], [reference, ctx.refPod]] as const
      : [[reference, ctx.refPod], [enim, ctx.enimPod]] as const;
    for (const [c, pod] of order) {
      pod.containerId = newCid(c.name);
      // What the rest of enim's DEL costs a call beside it is the back-to-back section's.
      await newSandbox(node, pod, `s${c.name === "enim" ? "e" : "r"}${i}`);
      const add = await cni(node, c, "ADD", pod);
      const del = await cni(node, c, "DEL", pod);
      if (i >= warmup) {
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
  const s = {
    enim: { ADD: stats(lat.enim.ADD), DEL: stats(lat.enim.DEL) },
    reference: { ADD: stats(lat.reference.ADD), DEL: stats(lat.reference.DEL) },
  };
  const ratio = {
    ADD: { p50: s.enim.ADD.p50 / s.reference.ADD.p50, p99: s.enim.ADD.p99 / s.reference.ADD.p99 },
    DEL: { p50: s.enim.DEL.p50 / s.reference.DEL.p50, p99: s.enim.DEL.p99 / s.reference.DEL.p99 },
  };
  const overhead = {
    ADD: s.enim.ADD.p50 - (agentOp.add ?? NaN),
    DEL: s.enim.DEL.p50 - (agentOp.del ?? NaN),
  };
  return { s, ratio, phases, agentOp, overhead };
}

/** Prints the section's latencies and ratios. */
export function reportSerial(r: Serial, iterations: number): void {
  console.log(`\nserial, ${iterations} iterations each, alternating (ms, spawn to exit)`);
  for (const verb of ["ADD", "DEL"] as const) {
    console.log(`  ${verb}`);
    console.log(`    enim       ${fmt(r.s.enim[verb])}`);
    console.log(`    reference  ${fmt(r.s.reference[verb])}`);
    console.log(
      `    ratio enim/reference: p50 ${r.ratio[verb].p50.toFixed(2)}, p99 ${
        r.ratio[verb].p99.toFixed(2)
      }  (goal p50 ≤ 1.5: ${verdict(r.ratio[verb].p50 <= 1.5)})`,
    );
  }
}

/** Prints the agent's phases during the serial run. */
export function reportSerialPhases(r: Serial): void {
  console.log(`\nper-phase inside the agent during the serial run (from /metrics; ms)`);
  printPhases(r.phases, "  ", 24);
}
