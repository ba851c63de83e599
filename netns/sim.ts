/**
 * Building blocks of the simulated node and VPC (tests, the demo, the bench):
 * named namespaces, a bridge holding the subnet gateways, and
 * {@linkcode VethDeviceSimulator}, which makes each ENI a veth pair.
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
import { ipBatch, IpError, ipJson, type NetnsRef, nftApply, runIp } from "./ip.ts";
import { normalizeIp } from "../lib/ip.ts";
import { LinkSchema } from "./types.ts";
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import type { DeviceSimulator, Eni } from "../providers/contract.ts";

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
  await nftApply(sourceCheckRuleset(), { netns });
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

/** Lets port `port` of the VPC bridge in `netns` send from `mac` and `addresses` (idempotent). */
export async function allowPort(
  netns: string,
  port: string,
  mac: string,
  addresses: string[],
): Promise<void> {
  const t = `bridge ${SOURCE_CHECK_TABLE}`;
  const m = mac.toLowerCase();
  const lines = [`add element ${t} ports { "${port}" . ${m} }`];
  for (const a of addresses) {
    const ip = normalizeIp(a);
    lines.push(`add element ${t} ${ip.includes(":") ? "ipv6" : "ipv4"} { ${m} . ${ip} }`);
  }
  await nftApply(lines.join("\n") + "\n", { netns });
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
    // The VPC's source check: the port sends only from the ENI's MAC and addresses.
    await allowPort(
      this.#vpc,
      names.vpc,
      eni.mac,
      [eni.ipv4?.address, eni.ipv6?.address].filter((a): a is string => a !== undefined),
    );
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
