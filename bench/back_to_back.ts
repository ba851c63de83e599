/**
 * Bench section: back to back, a pod's DEL then at once another pod's ADD (churn on a
 * node). enim's ADD runs beside the rest of the DEL it follows (its device's move home,
 * its host link); this is where that rest costs a call.
 *
 * @module
 */
import { type BenchContext, cni, newCid, podNetns } from "./_cni.ts";
import { stats } from "./_stats.ts";

type Series = { DEL: number[]; ADD: number[]; both: number[] };

/** The section's samples per contender (ms). */
export type BackToBack = { enim: Series; reference: Series };

/** Runs the section. */
export async function measureBackToBack(ctx: BenchContext): Promise<BackToBack> {
  const { node, settings: { warmup, iterations } } = ctx;
  const { enim, reference } = ctx.contenders;
  const b2b = {
    enim: { DEL: [] as number[], ADD: [] as number[], both: [] as number[] },
    reference: { DEL: [] as number[], ADD: [] as number[], both: [] as number[] },
  };
  const live = {
    enim: { ...ctx.enimPod, ns: await podNetns(node, "b2be"), containerId: newCid("b2b") },
    reference: { ...ctx.refPod, ns: await podNetns(node, "b2br"), containerId: newCid("b2b") },
  };
  await cni(node, enim, "ADD", live.enim);
  await cni(node, reference, "ADD", live.reference);
  for (let i = 0; i < warmup + iterations; i++) {
    const pair = [["enim", enim], ["reference", reference]] as const;
    for (const [k, c] of i % 2 === 0 ? pair : [...pair].reverse()) {
      await node.client.status();
      const next = { ...live[k], ns: await podNetns(node, `b${k[0]}${i}`), containerId: newCid(k) };
      const del = await cni(node, c, "DEL", live[k]);
      const add = await cni(node, c, "ADD", next);
      await node.vpc.deletePod(live[k].ns);
      live[k] = next;
      if (i >= warmup) {
        b2b[k].DEL.push(del.ms);
        b2b[k].ADD.push(add.ms);
        b2b[k].both.push(del.ms + add.ms);
      }
    }
  }
  await cni(node, enim, "DEL", live.enim);
  await cni(node, reference, "DEL", live.reference);
  await node.client.status();
  return b2b;
}

/** Prints the section. */
export function reportBackToBack(b2b: BackToBack, iterations: number): void {
  console.log(
    `\nback to back: a pod's DEL, then at once another pod's ADD (${iterations} each, alternating; ms)`,
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
}

/** The section in the results file. */
export function backToBackJson(b2b: BackToBack) {
  return {
    enim: { DEL: stats(b2b.enim.DEL), ADD: stats(b2b.enim.ADD), both: stats(b2b.enim.both) },
    reference: {
      DEL: stats(b2b.reference.DEL),
      ADD: stats(b2b.reference.ADD),
      both: stats(b2b.reference.both),
    },
  };
}
