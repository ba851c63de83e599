/**
 * Bench section: peak RSS and CPU time (user + sys) of each plugin process, through
 * `/usr/bin/time` in separate runs (the wrapper adds a fork, so it stays out of the
 * latency runs); reported with the agent's memory.
 *
 * @module
 */
import { type BenchContext, cni, type ExecResult, newCid } from "./_cni.ts";
import { mb, type Stats, stats, verdict } from "./_stats.ts";

const TIME = "/usr/bin/time";

type Verbs<T> = { ADD: T; DEL: T };

/** The section's figures. */
export interface Resources {
  rss: { enim: Stats; reference: Stats };
  cpu: { enim: Verbs<Stats>; reference: Verbs<Stats> };
}

/** `/usr/bin/time -f "RSS %M CPU %U %S"`: peak RSS (kB) and user + sys (ms). */
function usageOf(r: ExecResult) {
  const m = r.stderr.trim().split("\n").at(-1)!.match(/^RSS (\d+) CPU ([\d.]+) ([\d.]+)$/);
  if (!m) throw new Error(`Cannot read /usr/bin/time's line in ${JSON.stringify(r.stderr)}`);
  return { rssKb: Number(m[1]), cpuMs: (Number(m[2]) + Number(m[3])) * 1000 };
}

/** Runs the section. */
export async function measureResources(ctx: BenchContext): Promise<Resources> {
  const rss = { enim: [] as number[], reference: [] as number[] };
  const cpu = {
    enim: { ADD: [] as number[], DEL: [] as number[] },
    reference: { ADD: [] as number[], DEL: [] as number[] },
  };
  const pairs = [
    [ctx.contenders.enim, ctx.enimPod],
    [ctx.contenders.reference, ctx.refPod],
  ] as const;
  for (let i = 0; i < ctx.settings.rssRuns; i++) {
    for (const [c, pod] of pairs) {
      const k = c.name as "enim" | "reference";
      pod.containerId = newCid(c.name);
      const wrap = [TIME, "-f", "RSS %M CPU %U %S"];
      for (const verb of ["ADD", "DEL"] as const) {
        const u = usageOf(await cni(ctx.node, c, verb, pod, wrap));
        rss[k].push(u.rssKb);
        cpu[k][verb].push(u.cpuMs);
      }
    }
  }
  return {
    rss: { enim: stats(rss.enim), reference: stats(rss.reference) },
    cpu: {
      enim: { ADD: stats(cpu.enim.ADD), DEL: stats(cpu.enim.DEL) },
      reference: { ADD: stats(cpu.reference.ADD), DEL: stats(cpu.reference.DEL) },
    },
  };
}

/** The goals: the plugin's peak RSS at most 35 MB, its CPU per ADD at most 40 ms (p50). */
export const resourceGoals = (r: Resources) => ({
  pluginRss: r.rss.enim.max / 1024 <= 35,
  pluginCpuAdd: r.cpu.enim.ADD.p50 <= 40,
});

/** The goal: the agent's peak RSS (VmHWM) at most 80 MB. */
export const agentMemoryGoal = (agentEnd: Record<string, number>): boolean =>
  agentEnd.VmHWM / 1024 <= 80;

/** Prints the section with the agent's memory at the end and after the concurrency run. */
export function reportResources(
  r: Resources,
  rssRuns: number,
  agentEnd: Record<string, number>,
  agentAfterConc: Record<string, number>,
): void {
  const goals = resourceGoals(r);
  console.log(`\nplugin process resources (/usr/bin/time over ${rssRuns} ADD and DEL runs each)`);
  console.log(
    `  enim plugin      peak RSS max ${mb(r.rss.enim.max)} MB, p50 ${
      mb(r.rss.enim.p50)
    } MB (goal ≤ 35: ${verdict(goals.pluginRss)}); CPU (user+sys) per ADD p50 ${
      r.cpu.enim.ADD.p50.toFixed(0)
    } ms (goal ≤ 40: ${verdict(goals.pluginCpuAdd)}), per DEL p50 ${
      r.cpu.enim.DEL.p50.toFixed(0)
    } ms`,
  );
  console.log(
    `  reference plugin peak RSS max ${mb(r.rss.reference.max)} MB, p50 ${
      mb(r.rss.reference.p50)
    } MB; CPU per ADD p50 ${r.cpu.reference.ADD.p50.toFixed(0)} ms, per DEL p50 ${
      r.cpu.reference.DEL.p50.toFixed(0)
    } ms  (host-device; static runs as its child)`,
  );
  console.log(
    `  agent            VmHWM ${mb(agentEnd.VmHWM)} MB (goal ≤ 80: ${
      verdict(agentMemoryGoal(agentEnd))
    }), VmRSS ${mb(agentEnd.VmRSS)} MB (after the concurrency run ${mb(agentAfterConc.VmRSS)})`,
  );
}
