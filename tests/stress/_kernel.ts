/**
 * The kernel's side of the stress checks: what `ip -j` shows in the simulated
 * node's namespace, in each pod namespace and in the VPC namespace, parsed with
 * zod. Read-only: nothing here changes a namespace.
 *
 * Each namespace costs one spawn (`ip -n NAME -j -batch -`: `addr show`, then
 * `route show table all`).
 *
 * @module
 */
import { z } from "zod";
import { vethNames } from "../../netns/sim.ts";
import { HOST_LINK_GROUP } from "../../netns/host_link.ts";
import { type CommandOutput, runCommand } from "../support/command.ts";

const IP = "/usr/sbin/ip";

/** A link with its addresses, as `ip -j addr show` prints it (the fields the checks read). */
export const AddrLinkSchema = z.looseObject({
  ifindex: z.number().int(),
  ifname: z.string(),
  address: z.string().optional(),
  ifalias: z.string().optional(),
  flags: z.array(z.string()).default([]),
  group: z.string().optional(),
  addr_info: z.array(z.looseObject({
    family: z.string(),
    local: z.string(),
    prefixlen: z.number().int(),
    scope: z.string().optional(),
  })).default([]),
});

/** A route as `ip -j route show table all` prints it. */
export const RouteEntrySchema = z.looseObject({
  dst: z.string(),
  gateway: z.string().optional(),
  dev: z.string().optional(),
  table: z.string().optional(),
  type: z.string().optional(),
});

const AddrShowSchema = z.array(AddrLinkSchema);
const RouteShowSchema = z.array(RouteEntrySchema);
const LinkShowSchema = z.array(
  z.looseObject({ ifname: z.string(), address: z.string().optional() }),
);

/** One link as the checks see it. */
export interface KernelLink {
  ifname: string;
  /** Lower-case MAC, or "" for links without one. */
  mac: string;
  alias: string | null;
  up: boolean;
  /** Every address, `ip/prefix`. */
  addrs: string[];
  /** Global-scope addresses only, `ip/prefix` (what an ENI carries in a pod). */
  globalAddrs: string[];
  /** Main-table unicast routes through this link: `default via GW`, `DST via GW` or `DST`. */
  routes: string[];
  /** Whether it is a host link's node end (the host-link group, `netns/host_link.ts`). */
  nodeEnd: boolean;
}

/** One namespace as the checks see it. */
export interface NamespaceView {
  /** Its name under /run/netns. */
  name: string;
  /** /run/netns/<name>. */
  path: string;
  /** Whether it existed when read. */
  exists: boolean;
  /** The inode of the namespace file (its identity), when it exists. */
  ino: number | null;
  links: KernelLink[];
}

/** Everything the checks read from the kernel, at one moment of quiet. */
/** A policy-routing rule of the node at enim's host-link priorities (`ip -j rule`). */
export interface KernelRule {
  family: 4 | 6;
  priority: number;
  iif: string | null;
  /** The rule's input device does not exist (`[detached]`). */
  detached: boolean;
  table: string | null;
  src: string | null;
}

export interface KernelView {
  node: NamespaceView;
  /** The node's rules at enim's host-link priorities (1500, 1501). */
  nodeRules: KernelRule[];
  /** The pod namespaces the harness knows, existing or not, by path. */
  pods: Map<string, NamespaceView>;
  /** MACs whose VPC end exists (every simulated ENI device that the kernel still has). */
  vpcEnds: Set<string>;
}

/** The MAC a VPC end `vp<12 hex>` belongs to, or null. */
export function macOfVpcEnd(ifname: string): string | null {
  const m = ifname.match(/^vp([0-9a-f]{12})$/);
  return m ? m[1].match(/../g)!.join(":") : null;
}

function ipOut(args: string[], stdin?: string): Promise<CommandOutput> {
  return runCommand([IP, ...args], { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", LC_ALL: "C" }, stdin);
}

function jsonLines(stdout: string): unknown[] {
  return stdout.split("\n").map((l) => l.trim()).filter((l) => l !== "").map((l) => JSON.parse(l));
}

function routeText(r: z.infer<typeof RouteEntrySchema>): string {
  return r.gateway ? `${r.dst} via ${r.gateway}` : r.dst;
}

async function inode(path: string): Promise<number | null> {
  try {
    return (await Deno.stat(path)).ino;
  } catch {
    return null;
  }
}

/** Reads one named namespace (`exists: false` when it is not there). */
export async function readNamespace(name: string): Promise<NamespaceView> {
  const path = `/run/netns/${name}`;
  const ino = await inode(path);
  const empty: NamespaceView = { name, path, exists: false, ino: null, links: [] };
  if (ino === null) return empty;
  const out = await ipOut(["-n", name, "-j", "-batch", "-"], "addr show\nroute show table all\n");
  if (out.code !== 0) {
    if (/No such file|Invalid argument/.test(out.stderr) && (await inode(path)) === null) {
      return empty;
    }
    throw new Error(`Cannot read netns "${name}": ${out.stderr.trim()}`);
  }
  const [addrs, routes] = jsonLines(out.stdout);
  const links = AddrShowSchema.parse(addrs ?? []);
  const table = RouteShowSchema.parse(routes ?? []).filter((r) =>
    (r.table === undefined || r.table === "main") && (r.type === undefined || r.type === "unicast")
  );
  return {
    name,
    path,
    exists: true,
    ino,
    links: links.filter((l) => l.ifname !== "lo").map((l) => ({
      ifname: l.ifname,
      mac: (l.address ?? "").toLowerCase(),
      alias: l.ifalias ?? null,
      up: l.flags.includes("UP"),
      addrs: l.addr_info.map((a) => `${a.local}/${a.prefixlen}`),
      globalAddrs: l.addr_info.filter((a) => a.scope === "global").map((a) =>
        `${a.local}/${a.prefixlen}`
      ),
      routes: table.filter((r) => r.dev === l.ifname).map(routeText),
      nodeEnd: l.group === String(HOST_LINK_GROUP),
    })),
  };
}

/** The MACs whose VPC end exists in the VPC namespace. */
export async function readVpcEnds(vpcName: string): Promise<Set<string>> {
  const out = await ipOut(["-n", vpcName, "-j", "link", "show"]);
  if (out.code !== 0) throw new Error(`Cannot list links in "${vpcName}": ${out.stderr.trim()}`);
  const links = LinkShowSchema.parse(jsonLines(out.stdout)[0] ?? []);
  return new Set(links.map((l) => macOfVpcEnd(l.ifname)).filter((m): m is string => m !== null));
}

const RuleShowSchema = z.array(z.looseObject({
  priority: z.number(),
  iif: z.optional(z.string()),
  iif_detached: z.optional(z.unknown()),
  table: z.optional(z.string()),
  src: z.optional(z.string()),
}));

/** The node's rules at enim's host-link priorities, both families. */
export async function readNodeRules(nodeName: string): Promise<KernelRule[]> {
  const out: KernelRule[] = [];
  for (const family of [4, 6] as const) {
    const r = await ipOut(["-n", nodeName, `-${family}`, "-j", "rule", "show"]);
    if (r.code !== 0) throw new Error(`Cannot list the rules of "${nodeName}": ${r.stderr.trim()}`);
    for (const rule of RuleShowSchema.parse(jsonLines(r.stdout)[0] ?? [])) {
      if (rule.priority !== 1500 && rule.priority !== 1501) continue;
      out.push({
        family,
        priority: rule.priority,
        iif: rule.iif ?? null,
        detached: "iif_detached" in rule,
        table: rule.table ?? null,
        src: rule.src ?? null,
      });
    }
  }
  return out;
}

/** Reads the node, the given pod namespaces and the VPC ends. */
export async function readKernel(
  nodeName: string,
  vpcName: string,
  podNames: string[],
): Promise<KernelView> {
  const [node, nodeRules, vpcEnds, ...pods] = await Promise.all([
    readNamespace(nodeName),
    readNodeRules(nodeName),
    readVpcEnds(vpcName),
    ...podNames.map(readNamespace),
  ]);
  return { node, nodeRules, vpcEnds, pods: new Map(pods.map((p) => [p.path, p])) };
}

/** Where a MAC is: one entry per namespace holding a link with it. */
export function locate(view: KernelView, mac: string): { ns: string; link: KernelLink }[] {
  const want = mac.toLowerCase();
  const out: { ns: string; link: KernelLink }[] = [];
  for (const l of view.node.links) if (l.mac === want) out.push({ ns: "node", link: l });
  for (const p of view.pods.values()) {
    for (const l of p.links) if (l.mac === want) out.push({ ns: p.path, link: l });
  }
  return out;
}

/**
 * Waits until the kernel is quiet: every simulated ENI whose VPC end exists has its
 * other end visible in the node or a pod (a veth pair whose pod namespace was deleted
 * is destroyed a few ms later, both ends at once). Returns the MACs still unaccounted
 * for after `timeoutMs` (their device sits in a namespace the harness does not know).
 */
export async function settleKernel(
  nodeName: string,
  vpcName: string,
  podNames: () => string[],
  timeoutMs = 3000,
  stuck: Set<string> = new Set(),
): Promise<string[]> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const view = await readKernel(nodeName, vpcName, podNames());
    const seen = new Set<string>();
    for (const l of view.node.links) seen.add(l.mac);
    for (const p of view.pods.values()) for (const l of p.links) seen.add(l.mac);
    const pending = [...view.vpcEnds].filter((m) => !seen.has(m));
    // Devices found astray at an earlier check are not waited for again.
    if (pending.every((m) => stuck.has(m)) || Date.now() > until) return pending;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The node-side device name the simulator gives an ENI (`en<mac hex>`). */
export function simulatedNodeName(mac: string): string {
  return vethNames(mac).node;
}
