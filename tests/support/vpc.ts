/**
 * The simulated node and VPC that integration tests, the demo, the bench and the
 * fake BCE server build on (see design.md, "The node, as the tests see it").
 *
 * - a "node" namespace where the agent and plugin run;
 * - a "VPC" namespace with bridge `br0` holding each subnet's gateway (.1 and ::1);
 * - per ENI a veth pair ({@linkcode VethDeviceSimulator}): one end on the bridge, the
 *   other in the node namespace with the ENI's MAC;
 * - pods are further namespaces.
 *
 * Every namespace is named `enim-t-<random>-…`; deleting the namespaces removes
 * every device (veth pairs die with their namespace). Nothing is created in the
 * machine's root namespace.
 *
 * @example
 * ```ts ignore
 * await using vpc = await SimulatedVpc.create();
 * const eni = vpc.newEni();
 * await vpc.plugEni(eni);
 * const pod = await vpc.pod("a");
 * ```
 *
 * @module
 */
import { type Cidr, formatIp, nthAddress, parseCidr } from "../../lib/ip.ts";
import { ipBatch, netnsExec } from "../../netns/ip.ts";
import {
  allowGateways,
  allowPort,
  createBridge,
  createNetns,
  deleteNetns,
  SECURITY_GROUP_TABLE,
  setPortGroups,
  SOURCE_CHECK_TABLE,
  uniqueName,
  VethDeviceSimulator,
} from "../../netns/sim.ts";
import type { AddressSpec, RouteSpec } from "../../netns/types.ts";
import { buildResult } from "../../manager/result.ts";
import { type Eni, makeEni } from "../../providers/contract.ts";
import { lazyTool } from "../../scripts/_deps.ts";

/** A named network namespace and its path. */
export interface NetnsHandle {
  /** The name under /run/netns (for `ip -n` and `ip netns exec`). */
  name: string;
  /** /run/netns/<name> (what CNI_NETNS would carry). */
  path: string;
}

/** IPv6 duplicate address detection off for interfaces created from now on in a namespace. */
const NO_DAD = { "net/ipv6/conf/default/accept_dad": "0", "net/ipv6/conf/all/accept_dad": "0" };

/** A machine on the VPC bridge: its namespace, MAC, bridge port and addresses (no prefix). */
export interface VpcHost {
  ns: NetnsHandle;
  mac: string;
  /** Its port on the VPC bridge (what its security groups are given to). */
  port: string;
  ipv4?: string;
  ipv6?: string;
}

/** Options of a machine the tests attach to the VPC ({@linkcode SimulatedVpc.host}, `nodeNic`). */
export interface VpcHostOptions {
  /** The security groups of its port (default none: it admits everything). */
  groups?: string[];
}

/** The subnets of the simulated VPC. */
export interface VpcSubnets {
  ipv4?: string;
  ipv6?: string;
}

/** Options for {@linkcode SimulatedVpc.create}. */
export interface SimulatedVpcOptions {
  /** Defaults to 10.99.0.0/24 and fd00:99::/64; leave one out for a single-stack VPC. */
  subnets?: VpcSubnets;
  /** Name prefix of every namespace (default `enim-t`). */
  prefix?: string;
  /**
   * More subnets of the VPC (per-pod profiles): each gets its gateway (first host)
   * on the bridge, so a pod with an ENI of that subnet reaches its own gateway.
   */
  extraSubnets?: string[];
}

/**
 * The ping binary (iputils), looked up on first use: callers install iputils-ping
 * (scripts/_deps.ts) after importing this module.
 */
export const pingPath: () => string = lazyTool("/usr/bin/ping");

interface Subnet {
  net: Cidr;
  prefixLength: number;
  gateway: string;
}

function subnet(cidr: string): Subnet {
  const net = parseCidr(cidr);
  if (!net) throw new RangeError(`"${cidr}" is not a prefix`);
  return { net, prefixLength: net.prefix, gateway: hostAddress(net, 1) };
}

/** The `n`th address of a network (n small). */
function hostAddress(net: Cidr, n: number): string {
  return formatIp(nthAddress(net, n));
}

/** The gateway the simulated VPC gives a subnet: its first host. */
export function gatewayOf(cidr: string): string {
  return subnet(cidr).gateway;
}

/** A simulated node + VPC; dispose it (or call `close()`) to remove everything. */
export class SimulatedVpc implements AsyncDisposable {
  /** The node namespace (where the agent runs). */
  readonly node: NetnsHandle;
  /** The VPC namespace (holding the gateways). */
  readonly vpc: NetnsHandle;
  /** The bridge in the VPC namespace. */
  readonly bridge = "br0";
  /** The device simulator for a provider (ENI ends go to the node namespace). */
  readonly simulator: VethDeviceSimulator;
  /** Gateways of the subnets. */
  readonly gateways: { ipv4: string | null; ipv6: string | null };
  readonly #prefix: string;
  readonly #v4: Subnet | null;
  readonly #v6: Subnet | null;
  readonly #pods = new Map<string, NetnsHandle>();
  #nextHost = 10;
  #closed = false;
  /** This node's number in its VPC: 0 for the node that made it, 1… for those that joined. */
  #nodeIndex = 0;
  /** How many nodes joined this one's VPC (on the node that made it). */
  #joins = 0;
  /** The node that made the VPC (itself, unless it joined another's). */
  #root: SimulatedVpc = this;
  /** Whether this fixture made the VPC namespace (a node that joined another's does not). */
  readonly #ownsVpc: boolean;

  private constructor(prefix: string, subnets: VpcSubnets, sharedVpc?: NetnsHandle) {
    this.#prefix = prefix;
    this.node = handle(`${prefix}-node`);
    this.vpc = sharedVpc ?? handle(`${prefix}-vpc`);
    this.#ownsVpc = sharedVpc === undefined;
    this.#v4 = subnets.ipv4 ? subnet(subnets.ipv4) : null;
    this.#v6 = subnets.ipv6 ? subnet(subnets.ipv6) : null;
    this.gateways = { ipv4: this.#v4?.gateway ?? null, ipv6: this.#v6?.gateway ?? null };
    this.simulator = new VethDeviceSimulator({
      vpcNetns: this.vpc.name,
      bridge: this.bridge,
      nodeNetns: this.node.name,
    });
  }

  /** Builds the node and VPC namespaces; removes what it made if a step fails. */
  static async create(opts: SimulatedVpcOptions = {}): Promise<SimulatedVpc> {
    const subnets = opts.subnets ?? { ipv4: "10.99.0.0/24", ipv6: "fd00:99::/64" };
    const vpc = new SimulatedVpc(uniqueName(opts.prefix ?? "enim-t"), subnets);
    try {
      await createNetns(vpc.node.name);
      await createNetns(vpc.vpc.name);
      // A cloud's ports have no duplicate address detection to wait for: an interface's
      // IPv6 link-local address is usable at once (its first packets are not lost).
      await vpc.sysctl(vpc.node, NO_DAD);
      await vpc.sysctl(vpc.vpc, NO_DAD);
      const cidrs = [vpc.#v4, vpc.#v6, ...(opts.extraSubnets ?? []).map(subnet)]
        .filter((s): s is Subnet => s !== null)
        .map((s) => `${s.gateway}/${s.prefixLength}`);
      await createBridge(vpc.vpc.name, vpc.bridge, cidrs);
      // The VPC routes between its subnets (a Service's endpoint may be in another one), as
      // a cloud's does: without redirects (its subnets share one bridge here).
      await vpc.sysctl(vpc.vpc, {
        "net/ipv4/ip_forward": "1",
        "net/ipv6/conf/all/forwarding": "1",
        "net/ipv4/conf/all/send_redirects": "0",
        "net/ipv4/conf/default/send_redirects": "0",
      });
    } catch (err) {
      await vpc.close().catch(() => {});
      throw err;
    }
    return vpc;
  }

  /**
   * Another node of `vpc`'s VPC: its own node namespace (and pods), the same VPC
   * namespace and bridge, so its ENIs' devices reach the same gateways and the
   * other node's pods. Closing it removes its node and pods, never the VPC.
   */
  static async join(
    vpc: SimulatedVpc,
    opts: { prefix?: string; extraSubnets?: string[] } = {},
  ): Promise<SimulatedVpc> {
    const joined = new SimulatedVpc(uniqueName(opts.prefix ?? "enim-t"), {
      ...(vpc.#v4 ? { ipv4: `${formatIp(vpc.#v4.net.ip)}/${vpc.#v4.prefixLength}` } : {}),
      ...(vpc.#v6 ? { ipv6: `${formatIp(vpc.#v6.net.ip)}/${vpc.#v6.prefixLength}` } : {}),
    }, vpc.vpc);
    joined.#root = vpc.#root;
    joined.#nodeIndex = ++vpc.#root.#joins;
    try {
      await createNetns(joined.node.name);
      await joined.sysctl(joined.node, NO_DAD);
      await joined.addSubnets(opts.extraSubnets ?? []);
    } catch (err) {
      await joined.close().catch(() => {});
      throw err;
    }
    return joined;
  }

  /**
   * Gives more subnets their gateway on the VPC's bridge (idempotent): the subnets of a
   * node that joined, which the VPC's creator did not know.
   */
  async addSubnets(cidrs: string[]): Promise<void> {
    if (cidrs.length === 0) return;
    const subnets = cidrs.map(subnet);
    await ipBatch(
      subnets.map((s) => [
        "addr",
        "replace",
        `${s.gateway}/${s.prefixLength}`,
        "dev",
        this.bridge,
        ...(s.gateway.includes(":") ? ["nodad"] : []),
      ]),
      { netns: this.vpc.name },
    );
    await allowGateways(this.vpc.name, subnets.map((s) => s.gateway));
  }

  /**
   * How many frames the VPC's source check has dropped so far (every port: a frame
   * from a MAC or an address that is not the port's own).
   */
  sourceCheckDrops(): Promise<number> {
    return this.#drops(SOURCE_CHECK_TABLE, "the source check");
  }

  /**
   * How many packets the VPC's security groups have dropped so far (every port: a packet
   * none of the port's groups admits).
   */
  securityGroupDrops(): Promise<number> {
    return this.#drops(SECURITY_GROUP_TABLE, "the security groups");
  }

  /** Gives a machine's port exactly these security groups (none: it admits everything). */
  async setHostGroups(host: VpcHost, groups: string[]): Promise<void> {
    const addrs = [host.ipv4, host.ipv6].filter((a): a is string => a !== undefined);
    await setPortGroups(this.vpc.name, host.port, addrs, groups);
  }

  /** The packets every counter of a bridge table of the VPC has counted. */
  async #drops(table: string, what: string): Promise<number> {
    const out = await this.exec(this.vpc, [
      "/usr/sbin/nft",
      "-j",
      "list",
      "table",
      "bridge",
      table,
    ]);
    if (out.code !== 0) throw new Error(`Cannot read ${what}: ${out.stderr}`);
    const text = JSON.stringify(JSON.parse(out.stdout));
    return [...text.matchAll(/"counter":\{"packets":(\d+)/g)].reduce((n, m) => n + Number(m[1]), 0);
  }

  /** Every namespace this fixture has created and not yet removed. */

  get namespaces(): string[] {
    return [
      this.node.name,
      ...(this.#ownsVpc ? [this.vpc.name] : []),
      ...[...this.#pods.values()].map((p) => p.name),
    ];
  }

  /** Creates a pod namespace `<prefix>-<name>` (loopback up). */
  async pod(name: string): Promise<NetnsHandle> {
    if (!/^[a-z0-9-]{1,32}$/.test(name)) throw new TypeError(`Invalid pod name "${name}"`);
    const h = handle(`${this.#prefix}-${name}`);
    if (this.#pods.has(h.name)) throw new Error(`Pod "${name}" exists already`);
    this.#pods.set(h.name, h);
    try {
      await createNetns(h.name);
      await this.sysctl(h, NO_DAD);
    } catch (err) {
      this.#pods.delete(h.name);
      throw err;
    }
    return h;
  }

  /** The pod namespaces made with {@linkcode pod} and not deleted since. */
  get pods(): NetnsHandle[] {
    return [...this.#pods.values()];
  }

  /** Deletes a pod namespace (whatever is in it: a veth ENI in it is destroyed with it). */
  async deletePod(pod: NetnsHandle): Promise<void> {
    await deleteNetns(pod.name);
    this.#pods.delete(pod.name);
  }

  /** A new ENI in this VPC (unique MAC and addresses), not yet plugged. */
  newEni(): Eni {
    const n = this.#nextHost++;
    const rand = Array.from(crypto.getRandomValues(new Uint8Array(2)), hex);
    const mac = ["02", "e0", ...rand, hex(n >> 8 & 0xff), hex(n & 0xff)].join(":");
    const addr = (s: Subnet | null) =>
      s
        ? { address: hostAddress(s.net, n), prefixLength: s.prefixLength, gateway: s.gateway }
        : null;
    return makeEni({
      id: `eni-${rand.join("")}${n.toString().padStart(4, "0")}`,
      mac,
      ipv4: addr(this.#v4),
      ipv6: addr(this.#v6),
      subnetId: "sbn-sim",
      state: "free",
      owner: null,
    });
  }

  /** Makes the ENI's device appear in the node namespace (idempotent). */
  plugEni(eni: Eni): Promise<void> {
    return this.simulator.plug(eni);
  }

  /** Removes the ENI's device (idempotent). */
  unplugEni(eni: Eni): Promise<void> {
    return this.simulator.unplug(eni);
  }

  /**
   * What `IpDeviceLayer.plug` takes for this ENI: its addresses and the routes the
   * manager's route policy gives it (`manager/result.ts`, the one owner).
   */
  static plugSpec(eni: Eni): { addresses: AddressSpec[]; routes: RouteSpec[] } {
    const { ips, routes } = buildResult(eni, { routes: [] });
    return { addresses: ips.map((i) => ({ cidr: i.address })), routes };
  }

  /**
   * Sets sysctls (paths under /proc/sys, `net/ipv4/conf/all/rp_filter`) in one of this
   * fixture's namespaces, in one process; throws naming the first that failed.
   */
  async sysctl(netns: NetnsHandle | string, settings: Record<string, string>): Promise<void> {
    const pairs = Object.entries(settings);
    for (const [k] of pairs) {
      if (!/^[a-z0-9_./-]+$/i.test(k) || k.includes("..")) throw new TypeError(`Bad sysctl "${k}"`);
    }
    const script =
      'while [ $# -gt 0 ]; do printf %s "$2" > "/proc/sys/$1" || exit 1; shift 2; done';
    const out = await this.exec(netns, ["/bin/sh", "-c", script, "sh", ...pairs.flat()]);
    if (out.code !== 0) {
      throw new Error(`Cannot set sysctls ${JSON.stringify(settings)}: ${out.stderr.trim()}`);
    }
  }

  /**
   * Gives the node namespace its own NIC, as a cloud node has: `eth0`, a port of the
   * VPC bridge (`vpnode`; source-checked like every port, with `groups` as its security
   * groups), with the 250th address of each subnet of the VPC (the 249th for the first
   * node that joined, and so on) and default routes via their gateways; and turns
   * forwarding on in the node (a Kubernetes node routes its pods' traffic). Returns its
   * addresses.
   */
  async nodeNic(opts: VpcHostOptions = {}): Promise<VpcHost> {
    const i = this.#nodeIndex;
    const port = i === 0 ? "vpnode" : `vpnode${i}`;
    const nic = await this.#attach(this.node, port, "eth0", 250 - i, [this.#v4, this.#v6], opts);
    await this.sysctl(this.node, {
      "net/ipv4/ip_forward": "1",
      "net/ipv6/conf/all/forwarding": "1",
    });
    return nic;
  }

  /**
   * A machine of the VPC outside this node (another node's pod, a client): namespace
   * `<prefix>-<name>` with `eth0` on the VPC bridge, the `host`th address of `subnets`
   * (default: the VPC's own; a subnet named here gets its gateway on the bridge when it
   * is one of `extraSubnets`) and default routes via their gateways.
   */
  async host(
    name: string,
    host: number,
    subnets: { ipv4?: string; ipv6?: string } = {},
    opts: VpcHostOptions = {},
  ): Promise<VpcHost> {
    const ns = await this.pod(name);
    const pick = (cidr: string | undefined, own: Subnet | null) => cidr ? subnet(cidr) : own;
    return await this.#attach(ns, `vh${name}`.slice(0, 15), "eth0", host, [
      pick(subnets.ipv4, this.#v4),
      pick(subnets.ipv6, this.#v6),
    ], opts);
  }

  /**
   * A veth from the bridge (port `port`) into `ns` as `ifName`, addressed, source-checked
   * and with its groups.
   */
  async #attach(
    ns: NetnsHandle,
    port: string,
    ifName: string,
    n: number,
    subnets: (Subnet | null)[],
    opts: VpcHostOptions = {},
  ): Promise<VpcHost> {
    const mac = ["02", "aa", ...Array.from(crypto.getRandomValues(new Uint8Array(3)), hex), hex(n)]
      .join(":");
    const nets = subnets.filter((x): x is Subnet => x !== null);
    const addrs = nets.map((x) => ({ ip: hostAddress(x.net, n), sub: x }));
    await ipBatch([[
      "link",
      "add",
      port,
      "master",
      this.bridge,
      "up",
      "type",
      "veth",
      "peer",
      "name",
      ifName,
      "address",
      mac,
      "netns",
      ns.name,
    ]], { netns: this.vpc.name });
    await allowPort(this.vpc.name, port, mac, addrs.map((a) => a.ip), opts.groups);
    await ipBatch([
      ["link", "set", "dev", ifName, "up"],
      ...addrs.map((a) => [
        "addr",
        "add",
        `${a.ip}/${a.sub.prefixLength}`,
        "dev",
        ifName,
        ...(a.ip.includes(":") ? ["nodad"] : []),
      ]),
      ...addrs.map((a) => ["route", "add", "default", "via", a.sub.gateway, "dev", ifName]),
    ], { netns: ns.name });
    // IPv6 has no send_redirects: the machine ignores the VPC's redirects instead.
    await this.sysctl(ns, {
      "net/ipv6/conf/all/accept_redirects": "0",
      [`net/ipv6/conf/${ifName}/accept_redirects`]: "0",
    });
    const v4 = addrs.find((a) => !a.ip.includes(":"))?.ip;
    const v6 = addrs.find((a) => a.ip.includes(":"))?.ip;
    return { ns, mac, port, ...(v4 ? { ipv4: v4 } : {}), ...(v6 ? { ipv6: v6 } : {}) };
  }

  /** Runs a program in a namespace of this fixture (`ip netns exec`). */
  exec(netns: NetnsHandle | string, argv: string[]) {
    return netnsExec(typeof netns === "string" ? netns : netns.name, argv);
  }

  /**
   * Whether a ping from `netns` to `address` gets an answer within 3 s: echoes go
   * out every 0.2 s until one is answered (a first one can be lost to neighbour
   * discovery on a loaded machine).
   */
  async ping(netns: NetnsHandle | string, address: string): Promise<boolean> {
    const out = await this.exec(netns, [pingPath(), "-c1", "-w3", "-i0.2", "-n", address]);
    return out.code === 0;
  }

  /** Removes every namespace (pods, node, VPC) and with them every device; idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const errors: unknown[] = [];
    const own = this.#ownsVpc ? [this.vpc.name] : [];
    for (const name of [...this.#pods.keys(), this.node.name, ...own]) {
      try {
        await deleteNetns(name);
      } catch (err) {
        errors.push(err);
      }
    }
    this.#pods.clear();
    if (errors.length > 0) throw new AggregateError(errors, "Cannot remove the simulated VPC");
  }

  /** Same as {@linkcode close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function handle(name: string): NetnsHandle {
  return { name, path: `/run/netns/${name}` };
}

function hex(b: number): string {
  return b.toString(16).padStart(2, "0");
}
