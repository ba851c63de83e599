/**
 * Bench section: the agent API alone, the same ADD/DEL the plugin sends, over the
 * socket from the bench process (no plugin process), with the agent's CPU per ADD;
 * and the report of where enim's serial time goes (the agent's operation, the plugin
 * side, the API alone).
 *
 * @module
 */
import { type BenchContext, newCid, newSandbox } from "./_cni.ts";
import { procCpu } from "./_proc.ts";
import type { Serial } from "./serial.ts";
import { fmt, type Stats, stats, verdict } from "./_stats.ts";

/** The section's figures. */
export interface AgentApi {
  stats: { ADD: Stats; DEL: Stats };
  /** CPU ms over the timed ADDs: the agent's own and the processes it ran. */
  cpu: { own: number; children: number };
}

/** Runs the section. */
export async function measureAgentApi(ctx: BenchContext): Promise<AgentApi> {
  const { node, enimPod, settings: { warmup, iterations } } = ctx;
  const direct = { ADD: [] as number[], DEL: [] as number[] };
  const directCpu = { own: 0, children: 0 };
  for (let i = 0; i < warmup + iterations; i++) {
    const containerId = newCid("direct");
    const key = { containerId, ifName: "eth0" };
    await newSandbox(node, enimPod, `d${i}`);
    const cpu0 = await procCpu(ctx.agentPid);
    let t = performance.now();
    await node.client.add({
      ...key,
      netns: enimPod.ns.path,
      network: "bench",
      pod: { namespace: "bench", name: enimPod.ns.name },
      mode: "interface",
      // What the plugin's ADD asks for (cni/host_link.ts defaults), so both measure the same.
      ...(ctx.settings.hostLink
        ? {
          hostLink: { podIfName: "host0", nodeIfPrefix: "enimh", serviceCidrs: ["10.96.0.0/16"] },
        }
        : {}),
    });
    const addMs = performance.now() - t;
    const cpu1 = await procCpu(ctx.agentPid);
    if (i >= warmup) {
      directCpu.own += cpu1.own - cpu0.own;
      directCpu.children += cpu1.children - cpu0.children;
    }
    t = performance.now();
    await node.client.del({ ...key, netns: enimPod.ns.path, network: "bench" });
    const delMs = performance.now() - t;
    if (i >= warmup) {
      direct.ADD.push(addMs);
      direct.DEL.push(delMs);
    }
  }
  return { stats: { ADD: stats(direct.ADD), DEL: stats(direct.DEL) }, cpu: directCpu };
}

/** The goal: the API's ADD alone at most the reference's whole ADD (p50). */
export const agentApiGoal = (api: AgentApi, serial: Serial): boolean =>
  api.stats.ADD.p50 <= serial.s.reference.ADD.p50;

/** Prints where enim's serial time goes. */
export function reportTimeSplit(serial: Serial, api: AgentApi, iterations: number): void {
  const { agentOp, overhead } = serial;
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
  console.log(`    ADD ${fmt(api.stats.ADD)}`);
  console.log(`    DEL ${fmt(api.stats.DEL)}`);
  console.log(
    `    ADD p50 / the reference's whole ADD p50: ${
      (api.stats.ADD.p50 / serial.s.reference.ADD.p50).toFixed(2)
    }  (goal ≤ 1.0: ${verdict(agentApiGoal(api, serial))})`,
  );
  console.log(
    `    CPU per ADD (mean of ${iterations}): the agent ${
      (api.cpu.own / iterations).toFixed(1)
    } ms, the processes it ran ${
      (api.cpu.children / iterations).toFixed(1)
    } ms (the plugin process adds its own, below)`,
  );
}
