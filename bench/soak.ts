/**
 * Bench section: a soak of enim ADD/DEL cycles with the agent's RSS and open files
 * sampled every 100 cycles, then the leftover check: no state rows, no owned ENI, no
 * device left in a pod, the node's devices and addresses as before.
 *
 * @module
 */
import { type BenchContext, cni, newCid, type PodSlot } from "./_cni.ts";
import { fdCount, globalAddressLinks, linkSummary, procStatus } from "./_proc.ts";
import { mb, verdict } from "./_stats.ts";

/** What the soak leaves behind (all zero, empty or unchanged when enim is clean). */
export interface Leftovers {
  attachments: number;
  owned: number;
  free: number;
  podDevices: string[];
  nodeDevicesChanged: boolean;
  nodeGlobalAddresses: string[];
}

/** The section's figures (as the results file holds them). */
export interface Soak {
  cycles: number;
  seconds: number;
  failures: number;
  /** The first five failures. */
  errors: string[];
  samples: { cycle: number; rssKb: number; fds: number }[];
  /** The largest RSS deviation (MB) from the cycle-100 sample. */
  rssSpreadMb: number;
  fdGrowth: number;
  leftovers: Leftovers;
}

/** Runs the soak, then checks what is left in `pods` (with the bench's own pod) and the node. */
export async function measureSoak(ctx: BenchContext, pods: PodSlot[]): Promise<Soak> {
  const { node, enimPod, agentPid, settings: { soak: cycles } } = ctx;
  const nodeLinksBefore = await linkSummary(node, node.vpc.node.name);
  const samples: Soak["samples"] = [];
  let failures = 0;
  const errors: string[] = [];
  const sample = async (cycle: number) =>
    samples.push({
      cycle,
      rssKb: (await procStatus(agentPid)).VmRSS,
      fds: await fdCount(agentPid),
    });
  const t0 = performance.now();
  for (let i = 0; i < cycles; i++) {
    if (i % 100 === 0) await sample(i);
    enimPod.containerId = newCid("soak");
    for (const verb of ["ADD", "DEL"] as const) {
      try {
        await cni(node, ctx.contenders.enim, verb, enimPod);
      } catch (err) {
        failures++;
        if (errors.length < 5) errors.push(String(err));
      }
    }
  }
  await sample(cycles);
  const seconds = (performance.now() - t0) / 1000;
  const attachments = await node.client.attachments();
  const status = await node.client.status();
  const nodeLinksAfter = await linkSummary(node, node.vpc.node.name);
  const podLeftovers: string[] = [];
  for (const p of [enimPod, ...pods]) {
    const links = await linkSummary(node, p.ns.name);
    if (links.length !== 1 || links[0] !== "lo") {
      podLeftovers.push(`${p.ns.name}: ${links.join(",")}`);
    }
  }
  const globalAddrs = await globalAddressLinks(node);
  const rssVals = samples.map((x) => x.rssKb);
  const soakBaseline = samples.length > 1 ? samples[1] : samples[0];
  // Flatness: every sample after the first 100 cycles within ±5 MB of the cycle-100 sample.
  const rssSpreadMb = Math.max(...rssVals.slice(1).map((v) => Math.abs(v - soakBaseline.rssKb))) /
    1024;
  const fdGrowth = samples.at(-1)!.fds - soakBaseline.fds;
  return {
    cycles,
    seconds,
    failures,
    errors,
    samples,
    rssSpreadMb,
    fdGrowth,
    leftovers: {
      attachments: attachments.length,
      owned: status.pool.owned,
      free: status.pool.free,
      podDevices: podLeftovers,
      nodeDevicesChanged: JSON.stringify(nodeLinksBefore) !== JSON.stringify(nodeLinksAfter),
      nodeGlobalAddresses: globalAddrs,
    },
  };
}

/** The goal: no soak, or the agent's RSS flat within ±5 MB and no failure. */
export const soakGoal = (s: Soak): boolean =>
  s.cycles === 0 || (s.rssSpreadMb <= 5 && s.failures === 0);

/** Whether the soak failed or left anything behind (the bench then exits 1). */
export function soakFailed(s: Soak): boolean {
  const l = s.leftovers;
  return s.failures > 0 || l.attachments > 0 || l.owned > 0 || l.podDevices.length > 0 ||
    l.nodeDevicesChanged || l.nodeGlobalAddresses.length > 0;
}

/** Prints the section. */
export function reportSoak(s: Soak): void {
  const { leftovers } = s;
  if (s.cycles > 0) {
    console.log(
      `\nsoak: ${s.cycles} ADD/DEL cycles in ${s.seconds.toFixed(0)} s, ${s.failures} failures`,
    );
    console.log(`  cycle    VmRSS MB  fds`);
    for (const x of s.samples) {
      console.log(`  ${String(x.cycle).padStart(5)}  ${mb(x.rssKb).padStart(9)}  ${x.fds}`);
    }
    console.log(
      `  RSS deviation from the cycle-100 sample: max ${s.rssSpreadMb.toFixed(1)} MB (goal ±5: ${
        verdict(soakGoal(s))
      }), fd growth ${s.fdGrowth} (goal 0: ${verdict(s.fdGrowth <= 0)})`,
    );
  } else {
    console.log(`\nsoak: skipped (--soak 0)`);
  }
  console.log(
    `  leftovers: ${leftovers.attachments} state rows, ${leftovers.owned} owned ENIs (${leftovers.free} free), pod devices ${
      leftovers.podDevices.length ? leftovers.podDevices.join("; ") : "none"
    }, node devices ${
      leftovers.nodeDevicesChanged ? "CHANGED" : "unchanged"
    }, node global addresses ${
      leftovers.nodeGlobalAddresses.length ? leftovers.nodeGlobalAddresses.join(",") : "none"
    }`,
  );
  for (const e of s.errors) console.log(`  error: ${e}`);
}
