/**
 * Building blocks of the simulated node and VPC (tests, the demo, the bench):
 * named namespaces, a bridge holding the subnet gateways, and
 * {@linkcode VethDeviceSimulator}, which makes each ENI a veth pair.
 *
 * Why one file: the simulated VPC's bridge, its source check and its security groups
 * are one nftables table whose sets the simulator fills port by port; split, the
 * table's text and the code that fills it would drift apart.
 *
 * What the kernel does with a simulated ENI whose pod namespace is deleted: a veth
 * pair is destroyed as a whole when either end's namespace goes away, so the VPC
 * end disappears too and nothing comes back to the node (a physical ENI, by
 * contrast, returns to the initial namespace, under its pod-side name or `dev<N>`).
 * `IpDeviceLayer.unplug` then reports "missing", and calling
 * `VethDeviceSimulator.plug` again re-creates the ENI's device on the node.
 *
 * @module
 */
import {
  inNetnsArgv,
  ipBatch,
  IpError,
  ipJson,
  type NetnsRef,
  NFT_BIN,
  nftApply,
  runIp,
  spawn,
} from "./ip.ts";
import { normalizeIp } from "../lib/ip.ts";
import { LinkSchema } from "./types.ts";
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import type { DeviceSimulator, Eni, SimulatedGroupRule } from "../providers/contract.ts";

/** A unique name with `prefix` (namespaces, test fixtures): `prefix-<8 hex>`. */
export function uniqueName(prefix = "enim-t"): string {
  const bytes = crypto.getRandomValues(new Uint8Array(4));
  return `${prefix}-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** Creates the named namespace /run/netns/`name` and brings its loopback up. */
export async function createNetns(name: string): Promise<void> {
  await runIp(["netns", "add", name]);
  try {
    await runIp(["link", "set", "dev", "lo", "up"], { netns: name });
  } catch (err) {
    await deleteNetns(name).catch(() => {});
    throw err;
  }
}

/** Deletes the named namespace; succeeds when it does not exist. */
export async function deleteNetns(name: string): Promise<void> {
  try {
    await runIp(["netns", "del", name]);
  } catch (err) {
    if (err instanceof IpError && /No such file/.test(err.stderr)) return;
    throw err;
  }
}

/** Lists the named namespaces (under /run/netns). */
export async function listNetns(): Promise<string[]> {
  const { stdout } = await runIp(["netns", "list"]);
  return stdout.split("\n").map((l) => l.trim().split(" ")[0]).filter((n) => n !== "");
}

/** The VPC bridge's MAC (the subnets' gateways'): locally administered, fixed. */
export const BRIDGE_MAC = "02:fe:00:00:00:01";

/**
 * Creates bridge `name` in `netns`, up, holding `cidrs` (IPv6 without DAD), with the
 * VPC's source check on its ports (see {@linkcode SOURCE_CHECK_TABLE}).
 */
export async function createBridge(netns: string, name: string, cidrs: string[]): Promise<void> {
  await ipBatch([
    // Its own MAC, set: a bridge without one takes the lowest of its ports', so the
    // gateways' MAC would change whenever a port with a lower random MAC joined, and the
    // machines that had resolved a gateway would send to a MAC nobody has any more (a
    // cloud's gateway keeps its MAC).
    ["link", "add", "name", name, "address", BRIDGE_MAC, "type", "bridge"],
    ["link", "set", "dev", name, "up"],
    ...cidrs.map((c) => ["addr", "add", c, "dev", name, ...(c.includes(":") ? ["nodad"] : [])]),
  ], { netns });
  await nftApply(
    sourceCheckRuleset() + securityGroupRuleset() +
      gatewayLines(cidrs.map((c) => c.split("/")[0])).join("\n") + "\n",
    { netns },
  );
}

/**
 * Records `addresses` as the VPC's own router's (the subnets' gateways on the bridge):
 * what they send themselves (ICMP errors, redirects) passes every security group.
 */
export async function allowGateways(netns: string, addresses: string[]): Promise<void> {
  if (addresses.length > 0) await nftApply(gatewayLines(addresses).join("\n") + "\n", { netns });
}

function gatewayLines(addresses: string[]): string[] {
  const t = `bridge ${SECURITY_GROUP_TABLE}`;
  return addresses.map(normalizeIp).map((ip) =>
    `add element ${t} gateway${ip.includes(":") ? 6 : 4} { ${ip} }`
  );
}

/**
 * The simulated VPC's source check, as a cloud enforces it per port: a frame that
 * enters the bridge through a port must come from the port's own MAC, and an IP
 * packet or ARP message from one of that MAC's addresses (IPv6 link-local and the
 * unspecified address of neighbour discovery aside). Ports and addresses are
 * allowed one by one ({@linkcode allowPort}); anything else is dropped, so a design
 * that forwards a pod's packets out of the node's NIC fails here as it would in a
 * cloud. An nftables `bridge` table in the VPC namespace.
 */
export const SOURCE_CHECK_TABLE = "vpc_source_check";

function sourceCheckRuleset(): string {
  const t = SOURCE_CHECK_TABLE;
  return [
    `table bridge ${t} {`,
    `	set ports { type ifname . ether_addr; }`,
    `	set ipv4 { type ether_addr . ipv4_addr; }`,
    `	set ipv6 { type ether_addr . ipv6_addr; }`,
    `	chain prerouting {`,
    `		type filter hook prerouting priority 0; policy accept;`,
    `		iifname . ether saddr != @ports counter drop`,
    `		ether type ip ether saddr . ip saddr != @ipv4 counter drop`,
    `		ether type arp ether saddr . arp saddr ip != @ipv4 counter drop`,
    `		ether type ip6 ip6 saddr != { ::, fe80::/10 } ether saddr . ip6 saddr != @ipv6 counter drop`,
    `	}`,
    `}`,
    "",
  ].join("\n");
}

/**
 * Lets port `port` of the VPC bridge in `netns` send from `mac` and `addresses`
 * (idempotent); with `groups`, the port also gets those security groups (a port that
 * had none before: see {@linkcode setPortGroups} to change them).
 */
export async function allowPort(
  netns: string,
  port: string,
  mac: string,
  addresses: string[],
  groups?: string[],
): Promise<void> {
  const t = `bridge ${SOURCE_CHECK_TABLE}`;
  const m = mac.toLowerCase();
  const lines = [`add element ${t} ports { "${port}" . ${m} }`];
  for (const a of addresses) {
    const ip = normalizeIp(a);
    lines.push(`add element ${t} ${ip.includes(":") ? "ipv6" : "ipv4"} { ${m} . ${ip} }`);
  }
  if (groups) lines.push(...portGroupLines(port, addresses, groups));
  await nftApply(lines.join("\n") + "\n", { netns });
}

/**
 * The simulated VPC's security groups, as a cloud enforces them per port (an nftables
 * `bridge` table in the VPC namespace, beside the source check): a packet the bridge
 * sends out of a port (bridged from another port, or routed by the VPC between its
 * subnets) passes when one of the port's groups admits it. A group admits what its
 * rules ({@linkcode setGroupRules}) name: a sender's group (by the sender's address:
 * every port's addresses are its groups' members) or a CIDR, on a TCP or UDP port. A
 * group no rule names admits everything (the mock's groups are open unless given rules),
 * and so does a port without groups (machines of the tests' own, unless given some).
 * Replies pass: this kernel has no conntrack in the bridge family (`ct state` there is a
 * "Protocol error"), so the reverse direction of each rule is admitted explicitly
 * (source port the rule's port, from a member of the rule's group to the admitted
 * sender, TCP without a bare SYN). ARP, neighbour discovery, multicast listener
 * reports and what the VPC's router sends itself (from a gateway: ICMP errors,
 * redirects) always pass.
 */
export const SECURITY_GROUP_TABLE = "vpc_security_groups";

/** A group's number in {@linkcode SECURITY_GROUP_TABLE} (nft marks): its id's FNV-1a hash, never 0. */
export function groupMark(id: string): number {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(id)) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h === 0 ? 1 : h;
}

const markHex = (n: number) => `0x${n.toString(16).padStart(8, "0")}`;
const groupChain = (id: string) => `grp_${groupMark(id).toString(16).padStart(8, "0")}`;
const portChain = (port: string) => `port_${port.replace(/[^A-Za-z0-9]/g, "_")}`;

function securityGroupRuleset(): string {
  const t = SECURITY_GROUP_TABLE;
  return [
    `table bridge ${t} {`,
    `	set member4 { type ipv4_addr . mark; }`,
    `	set member6 { type ipv6_addr . mark; }`,
    `	set enforced { type mark; }`,
    `	set gateway4 { type ipv4_addr; }`,
    `	set gateway6 { type ipv6_addr; }`,
    `	map ports { type ifname : verdict; }`,
    `	chain replies {`,
    `	}`,
    `	chain postrouting {`,
    `		type filter hook postrouting priority 0; policy accept;`,
    `		ether type arp accept`,
    `		icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } accept`,
    `		icmpv6 type { mld-listener-query, mld-listener-report, mld-listener-done, mld2-listener-report } accept`,
    `		ip saddr @gateway4 accept`,
    `		ip6 saddr @gateway6 accept`,
    `		oifname vmap @ports`,
    `	}`,
    `}`,
    "",
  ].join("\n");
}

/**
 * The nft lines that give port `port` the groups `groups` (none: it admits everything)
 * and make its addresses members of them; no deletion (a port's earlier memberships go
 * in {@linkcode setPortGroups}).
 */
function portGroupLines(port: string, addresses: string[], groups: string[]): string[] {
  if (!/^[A-Za-z0-9_.-]{1,15}$/.test(port)) throw new TypeError(`Invalid port name "${port}"`);
  const t = `bridge ${SECURITY_GROUP_TABLE}`;
  const c = portChain(port);
  const lines = [`add chain ${t} ${c}`, `flush chain ${t} ${c}`];
  if (groups.length === 0) {
    lines.push(`add rule ${t} ${c} accept`);
  } else {
    lines.push(`add rule ${t} ${c} jump replies`);
    for (const g of groups) {
      lines.push(
        `add chain ${t} ${groupChain(g)}`,
        // A group no rule names admits everything.
        `add rule ${t} ${c} meta mark set ${markHex(groupMark(g))} meta mark != @enforced accept`,
        `add rule ${t} ${c} jump ${groupChain(g)}`,
      );
    }
    lines.push(`add rule ${t} ${c} counter drop`);
  }
  lines.push(`add element ${t} ports { "${port}" : jump ${c} }`);
  for (const a of addresses) {
    const ip = normalizeIp(a);
    for (const g of groups) {
      lines.push(
        `add element ${t} member${ip.includes(":") ? 6 : 4} { ${ip} . ${markHex(groupMark(g))} }`,
      );
    }
  }
  return lines;
}

/** One element of a member set as `nft -j` lists it: an address and a group's number. */
const MemberSetSchema = z.object({
  nftables: z.array(z.looseObject({
    set: z.optional(z.looseObject({
      elem: z._default(
        z.array(z.object({ concat: z.tuple([z.string(), z.number().check(z.int())]) })),
        [],
      ),
    })),
  })),
});

/**
 * Gives port `port` of the VPC bridge in `netns` exactly the groups `groups` (none: it
 * admits everything) and makes `addresses` (the port's) members of exactly those.
 */
export async function setPortGroups(
  netns: string,
  port: string,
  addresses: string[],
  groups: string[],
): Promise<void> {
  const t = `bridge ${SECURITY_GROUP_TABLE}`;
  const mine = new Set(addresses.map(normalizeIp));
  const lines: string[] = [];
  for (const set of ["member4", "member6"]) {
    const { stdout } = await spawn(
      inNetnsArgv([NFT_BIN, "-j", "list", "set", "bridge", SECURITY_GROUP_TABLE, set], netns),
    );
    for (const item of MemberSetSchema.parse(JSON.parse(stdout)).nftables) {
      for (const e of item.set?.elem ?? []) {
        const [ip, mark] = e.concat;
        if (mine.has(normalizeIp(ip))) {
          lines.push(`delete element ${t} ${set} { ${normalizeIp(ip)} . ${markHex(mark)} }`);
        }
      }
    }
  }
  lines.push(...portGroupLines(port, addresses, groups));
  await nftApply(lines.join("\n") + "\n", { netns });
}

/**
 * The nft lines that make `rules` the simulated cloud's security group rules: every
 * group a rule names as `group` admits only what its rules admit (and the replies).
 */
export function groupRuleLines(rules: SimulatedGroupRule[]): string[] {
  const t = `bridge ${SECURITY_GROUP_TABLE}`;
  const lines = [`flush chain ${t} replies`, `flush set ${t} enforced`];
  for (const g of new Set(rules.map((r) => r.group))) {
    lines.push(
      `add chain ${t} ${groupChain(g)}`,
      `flush chain ${t} ${groupChain(g)}`,
      `add element ${t} enforced { ${markHex(groupMark(g))} }`,
    );
  }
  const cidrFamily = (c: string) => c.includes(":") ? 6 : 4;
  for (const r of rules) {
    const isGroup = !r.from.includes("/");
    for (const fam of [4, 6] as const) {
      if (!isGroup && cidrFamily(r.from) !== fam) continue;
      const f = fam === 4 ? "ip" : "ip6";
      const members = `@member${fam}`;
      const from = (dir: "saddr" | "daddr") =>
        isGroup
          ? `meta mark set ${markHex(groupMark(r.from))} ${f} ${dir} . meta mark ${members}`
          : `${f} ${dir} ${r.from}`;
      const p = r.protocol;
      lines.push(
        `add rule ${t} ${groupChain(r.group)} ${from("saddr")} ${p} dport ${r.port} accept`,
        // The reply direction: from a member of the group, from the rule's port, to the sender.
        `add rule ${t} replies meta mark set ${
          markHex(groupMark(r.group))
        } ${f} saddr . meta mark ${members} ${from("daddr")} ${p} sport ${r.port}${
          p === "tcp" ? " tcp flags & (syn | ack) != syn" : ""
        } accept`,
      );
    }
  }
  return lines;
}

/** Makes `rules` the security group rules of the simulated VPC in `netns` (see {@linkcode groupRuleLines}). */
export async function setGroupRules(netns: string, rules: SimulatedGroupRule[]): Promise<void> {
  await nftApply(groupRuleLines(rules).join("\n") + "\n", { netns });
}

/** The groups of an ENI's port: its regular and enterprise groups. */
function groupsOf(eni: Eni): string[] {
  return [...eni.securityGroupIds, ...eni.enterpriseSecurityGroupIds];
}

/** An ENI's addresses (no prefix). */
function addressesOf(eni: Eni): string[] {
  return [eni.ipv4?.address, eni.ipv6?.address].filter((a): a is string => a !== undefined);
}

/** Options for {@linkcode VethDeviceSimulator}. */
export interface VethDeviceSimulatorOptions {
  /** The VPC namespace (a name under /run/netns). */
  vpcNetns: string;
  /** The bridge in the VPC namespace that the VPC ends join. */
  bridge: string;
  /**
   * The node namespace where the ENI ends appear (a name under /run/netns); absent:
   * the current process's namespace (the agent's).
   */
  nodeNetns?: string;
}

/** The device names of an ENI's veth pair: derived from the MAC, so unique per ENI. */
export function vethNames(mac: string): { node: string; vpc: string } {
  const hex = mac.toLowerCase().replaceAll(":", "");
  return { node: `en${hex}`, vpc: `vp${hex}` };
}

/**
 * Makes each ENI a veth pair: the VPC end on the VPC bridge (up), the node end in
 * the node namespace with the ENI's MAC, named `en<mac hex>` (down, unconfigured).
 *
 * `plug` is idempotent: the pair is recognised by its VPC end, which stays in the
 * VPC namespace wherever the ENI end is (on the node or moved into a pod).
 */
export class VethDeviceSimulator implements DeviceSimulator {
  readonly #vpc: string;
  readonly #bridge: string;
  readonly #node: NetnsRef;

  constructor(opts: VethDeviceSimulatorOptions) {
    this.#vpc = opts.vpcNetns;
    this.#bridge = opts.bridge;
    this.#node = opts.nodeNetns;
  }

  /** Creates the ENI's veth pair unless it exists. */
  async plug(eni: Eni): Promise<void> {
    const names = vethNames(eni.mac);
    if (await this.#vpcEndExists(names.vpc)) return;
    const home = this.#node ?? String(Deno.pid);
    try {
      await ipBatch([[
        "link",
        "add",
        names.vpc,
        "master",
        this.#bridge,
        "up",
        "type",
        "veth",
        "peer",
        "name",
        names.node,
        "address",
        eni.mac,
        "netns",
        home,
      ]], { netns: this.#vpc });
    } catch (err) {
      // A concurrent plug of the same ENI won the race.
      if (err instanceof IpError && /File exists/.test(err.stderr)) return;
      throw new Error(`Cannot create the simulated device of ENI "${eni.id}" (MAC "${eni.mac}")`, {
        cause: err,
      });
    }
    // The VPC's source check: the port sends only from the ENI's MAC and addresses; and
    // the port has the ENI's security groups.
    await allowPort(this.#vpc, names.vpc, eni.mac, addressesOf(eni), groupsOf(eni));
  }

  /** Applies the groups the ENI has now to its port. */
  async setSecurityGroups(eni: Eni): Promise<void> {
    await setPortGroups(this.#vpc, vethNames(eni.mac).vpc, addressesOf(eni), groupsOf(eni));
  }

  /** Makes `rules` the simulated cloud's security group rules. */
  async setSecurityGroupRules(rules: SimulatedGroupRule[]): Promise<void> {
    await setGroupRules(this.#vpc, rules);
  }

  /** Removes the ENI's veth pair (wherever its ENI end is); succeeds when it is gone. */
  async unplug(eni: Eni): Promise<void> {
    const names = vethNames(eni.mac);
    try {
      await runIp(["link", "del", "dev", names.vpc], { netns: this.#vpc });
    } catch (err) {
      if (err instanceof IpError && /Cannot find device|does not exist/.test(err.stderr)) return;
      throw new Error(`Cannot remove the simulated device of ENI "${eni.id}"`, { cause: err });
    }
  }

  async #vpcEndExists(name: string): Promise<boolean> {
    try {
      const links = await ipJson(z.array(LinkSchema), ["link", "show", "dev", name], {
        netns: this.#vpc,
      });
      return links.length > 0;
    } catch (err) {
      if (err instanceof IpError && /does not exist|Cannot find device/.test(err.stderr)) {
        return false;
      }
      throw err;
    }
  }
}
