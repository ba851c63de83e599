/**
 * What the bench reads of a process from /proc (the agent's CPU, memory and open
 * files) and of a namespace's links.
 *
 * @module
 */
import type { SimulatedNode } from "../tests/support/node.ts";

const IP = "/usr/sbin/ip";

/** A process's CPU time in ms, its own and its reaped children's (/proc/PID/stat, USER_HZ 100). */
export async function procCpu(pid: number): Promise<{ own: number; children: number }> {
  const f = (await Deno.readTextFile(`/proc/${pid}/stat`)).split(") ")[1].split(" ");
  return {
    own: (Number(f[11]) + Number(f[12])) * 10,
    children: (Number(f[13]) + Number(f[14])) * 10,
  };
}

/** Reads the `Vm*` fields (kB) of /proc/<pid>/status. */
export async function procStatus(pid: number): Promise<Record<string, number>> {
  const text = await Deno.readTextFile(`/proc/${pid}/status`);
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^(Vm\w+):\s+(\d+) kB$/gm)) out[m[1]] = Number(m[2]);
  return out;
}

/** How many files a process has open. */
export async function fdCount(pid: number): Promise<number> {
  let n = 0;
  for await (const _ of Deno.readDir(`/proc/${pid}/fd`)) n++;
  return n;
}

/** Link names in a namespace, sorted (for before/after comparisons). */
export async function linkSummary(node: SimulatedNode, netns: string): Promise<string[]> {
  const out = await node.vpc.exec(netns, [IP, "-j", "link", "show"]);
  return (JSON.parse(out.stdout || "[]") as { ifname: string }[]).map((l) => l.ifname).sort();
}

/** The node namespace's links that carry a global address. */
export async function globalAddressLinks(node: SimulatedNode): Promise<string[]> {
  const nodeAddrs = await node.vpc.exec(node.vpc.node, [
    IP,
    "-j",
    "addr",
    "show",
    "scope",
    "global",
  ]);
  return (JSON.parse(nodeAddrs.stdout || "[]") as { ifname: string; addr_info: unknown[] }[])
    .filter((l) => l.addr_info.length > 0).map((l) => l.ifname);
}
