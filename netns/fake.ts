/**
 * An in-memory {@linkcode DeviceLayer} for unit tests that need no root.
 *
 * It models links per namespace (the node and pod namespaces by path) with
 * MACs, names, aliases, addresses and routes; namespaces can be created,
 * deleted (their physical links return to the node, as the kernel does) and
 * replaced by a new one at the same path (new identity). It records every call,
 * injects faults by step name, can hang a step forever (a crash in tests), and
 * provides a {@linkcode DeviceSimulator} so attached ENIs appear on the node.
 *
 * Why it ships: the agent's `devices: "fake"` mode (agent/fake_devices.ts) is built on it, and
 * that mode is how the tests run the real agent process (the shipped bundle, under the
 * production permission set) with no root and no kernel devices: tests/agent_process_test.ts,
 * device_plugin_test.ts, reliability_test.ts, agent_crash_test.ts. agent/deps.ts imports it
 * only when the config says `devices: "fake"`, so an agent on `ip` never loads it.
 *
 * Why one file: `FakeDeviceLayer` is one in-memory model of the kernel (namespaces,
 * links, host links, bandwidth shaping), and every method of the `DeviceLayer` contract
 * reads and writes that same model; split, each part would reach into the others' state.
 *
 * @module
 */
import type { DeviceSimulator, Eni } from "../providers/contract.ts";
import { HOST_LINK_GROUP, podRulesOf, resultRoutes } from "./host_link.ts";
import type { RuleEntry } from "./ip.ts";
import { type InstalledShaping, installedShaping, isShaped, liveShapingOf } from "./bandwidth.ts";
import { namesOneNamespace } from "./pin.ts";
import {
  DeviceError,
  type DeviceLayer,
  type HostLinkRef,
  type HostLinkState,
  type Link,
  type LiveShaping,
  type NetnsIdentity,
  type NodeAddresses,
  type PinnedNetns,
  type PlugParams,
  type PlugResult,
  type PodInterfaceState,
  type RouteSpec,
  type UnplugOutcome,
  type UnplugParams,
} from "./types.ts";

/** A link in the fake. */
export interface FakeLink {
  ifindex: number;
  ifname: string;
  mac: string;
  alias?: string;
  up: boolean;
  mtu: number;
  addresses: string[];
  routes: RouteSpec[];
  /** The bandwidth shaping a plug installed (dropped when the link leaves the pod). */
  shaping?: InstalledShaping;
  /** The link's group (a host link's node end has `HOST_LINK_GROUP`). */
  group?: number;
  /** A veth pod end: its node end's name (the pair dies together). */
  peer?: string;
}

interface FakeNs {
  identity: NetnsIdentity;
  links: FakeLink[];
  /** The pod's policy rules, as a plug with a host link leaves them. */
  rules?: RuleEntry[];
}

/** The steps that faults and hangs can target. */
export type FakeStep =
  | "findByMac"
  | "plug"
  | "plug:after-move"
  | "unplug"
  | "inspect"
  | "netnsIdentity"
  | "pin"
  | "hostLink"
  | "nft";

/** One recorded call. */
export interface FakeCall {
  op: string;
  args: unknown;
}

/** The node namespace's key in {@linkcode FakeDeviceLayer.snapshot}. */
export const NODE = "<node>";

const clone = <T>(v: T): T => structuredClone(v);
const byIndex = (links: FakeLink[]) => clone(links).sort((a, b) => a.ifindex - b.ifindex);

/** An in-memory device layer (see the module doc). */
/** The path of a namespace argument. */
function pathOf(netns: string | PinnedNetns): string {
  return typeof netns === "string" ? netns : netns.path;
}

export class FakeDeviceLayer implements DeviceLayer {
  readonly calls: FakeCall[] = [];
  #node: FakeLink[] = [];
  #ns = new Map<string, FakeNs>();
  #nextIndex = 2;
  #nextIno = 4026532000;
  #faults = new Map<FakeStep, { error: Error; times: number }>();
  #hangs = new Set<FakeStep>();
  #gates = new Map<FakeStep, Promise<void>>();
  #simCount = 0;
  /** What {@linkcode nodeAddresses} answers (tests set it). */
  nodeAddrs: NodeAddresses = { addresses: [], primary: {} };
  /** How often the node's nftables table was loaded. */
  tableLoads = 0;
  /**
   * Every nftables text loaded, by namespace (`NODE` or a path): `loadRuleset`'s, and a
   * plug's `policyRuleset` once the plug succeeded (it rides in the pod's `nft -f`).
   */
  readonly rulesets = new Map<string, string[]>();
  /** What `listCounters` answers, by namespace (`NODE` or a path); none: no counters. */
  readonly counters = new Map<string, string>();
  /** Files as the node's namespace shows them (`readNodeFile`); any other is missing. */
  readonly nodeFiles = new Map<string, string>();

  // ---- test controls ----

  /** Adds a link on the node (what an attached ENI looks like). */
  addNodeLink(mac: string, ifname?: string): FakeLink {
    const link: FakeLink = {
      ifindex: this.#nextIndex++,
      ifname: ifname ?? `ens${this.#nextIndex}`,
      mac,
      up: false,
      mtu: 1500,
      addresses: [],
      routes: [],
    };
    this.#node.push(link);
    return link;
  }

  /** Removes the link with `mac` wherever it is (an ENI detached). */
  removeLink(mac: string): void {
    this.#node = this.#node.filter((l) => l.mac !== mac);
    for (const ns of this.#ns.values()) ns.links = ns.links.filter((l) => l.mac !== mac);
  }

  /** Creates a network namespace at `path` (a new identity). */
  addNetns(path: string): NetnsIdentity {
    const identity = { dev: 4, ino: this.#nextIno++ };
    this.#ns.set(path, { identity, links: [] });
    return identity;
  }

  /** Deletes the namespace at `path`; its links return to the node as the kernel returns them. */
  deleteNetns(path: string): void {
    const ns = this.#ns.get(path);
    if (!ns) return;
    this.#ns.delete(path);
    for (const l of ns.links.filter((x) => x.peer !== undefined)) {
      this.#node = this.#node.filter((n) => n.ifname !== l.peer);
    }
    for (const l of ns.links.filter((x) => x.peer === undefined)) {
      if (this.#node.some((n) => n.ifname === l.ifname)) l.ifname = `dev${l.ifindex}`;
      l.up = false;
      l.addresses = [];
      l.routes = [];
      this.#node.push(l);
    }
  }

  /**
   * Moves the node's link with `mac` into `netns` renamed `ifName`, keeping its node name
   * in the alias: what a device plugin such as host-device does before it calls IPAM.
   */
  moveIntoNetns(mac: string, netns: string, ifName: string): FakeLink {
    const ns = this.#ns.get(netns);
    const i = this.#node.findIndex((l) => l.mac === mac);
    if (!ns || i < 0) throw new Error(`No netns "${netns}" or no node link with MAC ${mac}`);
    const [link] = this.#node.splice(i, 1);
    link.alias = link.ifname;
    link.ifname = ifName;
    ns.links.push(link);
    return link;
  }

  /** Moves `ifName` out of `netns` back to the node under the name in its alias (host-device's DEL). */
  moveOutOfNetns(netns: string, ifName: string): FakeLink {
    const ns = this.#ns.get(netns);
    const link = ns?.links.find((l) => l.ifname === ifName);
    if (!ns || !link) throw new Error(`failed to find "${ifName}" in "${netns}"`);
    ns.links = ns.links.filter((l) => l !== link);
    link.ifname = link.alias ?? link.ifname;
    delete link.alias;
    link.up = false;
    link.addresses = [];
    link.routes = [];
    this.#node.push(link);
    return link;
  }

  /**
   * Deletes and recreates the namespace at `path`: same path, new identity, or with
   * `reuseInode` the old one (the kernel hands a freed namespace's inode to the next).
   */
  replaceNetns(path: string, opts: { reuseInode?: boolean } = {}): NetnsIdentity {
    const old = this.#ns.get(path)?.identity;
    this.deleteNetns(path);
    this.addNetns(path);
    if (opts.reuseInode && old) this.#ns.get(path)!.identity = clone(old);
    return clone(this.#ns.get(path)!.identity);
  }

  /** Makes `step` throw `error` (a DeviceError "failed" by default) the next `times` calls. */
  failOn(step: FakeStep, error?: Error, times = 1): void {
    this.#faults.set(step, {
      error: error ?? new DeviceError(step, "failed", `Injected failure at "${step}"`),
      times,
    });
  }

  /** Whether a step was made to hang ({@linkcode hangOn}) and not cleared since. */
  get hanging(): boolean {
    return this.#hangs.size > 0;
  }

  /** Makes `step` never return (a crash at that point, for reconcile tests). */
  hangOn(step: FakeStep): void {
    this.#hangs.add(step);
  }

  /** Makes `step` wait until the returned function is called (a slow kernel, for ordering tests). */
  holdOn(step: FakeStep): () => void {
    let open!: () => void;
    this.#gates.set(step, new Promise<void>((r) => (open = r)));
    return () => {
      this.#gates.delete(step);
      open();
    };
  }

  /** Clears faults and hangs. */
  clearFaults(): void {
    this.#faults.clear();
    this.#hangs.clear();
  }

  /** The link with `mac` and where it is (`NODE` or a netns path). */
  where(mac: string): { ns: string; link: FakeLink } | null {
    const n = this.#node.find((l) => l.mac === mac);
    if (n) return { ns: NODE, link: clone(n) };
    for (const [path, ns] of this.#ns) {
      const l = ns.links.find((x) => x.mac === mac);
      if (l) return { ns: path, link: clone(l) };
    }
    return null;
  }

  /** A deep copy of every namespace and link (for before/after comparisons). */
  snapshot(): Record<string, { identity: NetnsIdentity | null; links: FakeLink[] }> {
    const out: Record<string, { identity: NetnsIdentity | null; links: FakeLink[] }> = {
      [NODE]: { identity: null, links: byIndex(this.#node) },
    };
    for (const [path, ns] of [...this.#ns].sort(([a], [b]) => a.localeCompare(b))) {
      out[path] = { identity: clone(ns.identity), links: byIndex(ns.links) };
    }
    return out;
  }

  /** A {@linkcode DeviceSimulator}: attached ENIs appear as node links with their MAC. */
  simulator(): DeviceSimulator {
    return {
      plug: (eni: Eni) => {
        if (!this.where(eni.mac)) this.addNodeLink(eni.mac, `sim${++this.#simCount}`);
        return Promise.resolve();
      },
      unplug: (eni: Eni) => {
        this.removeLink(eni.mac);
        return Promise.resolve();
      },
    };
  }

  async #step(step: FakeStep): Promise<void> {
    if (this.#hangs.has(step)) await new Promise(() => {});
    await this.#gates.get(step);
    const f = this.#faults.get(step);
    if (f && f.times > 0) {
      f.times--;
      if (f.times === 0) this.#faults.delete(step);
      throw f.error;
    }
    await Promise.resolve();
  }

  #toLink(l: FakeLink): Link {
    return {
      ifindex: l.ifindex,
      ifname: l.ifname,
      address: l.mac,
      ...(l.alias ? { ifalias: l.alias } : {}),
      operstate: l.up ? "UP" : "DOWN",
      flags: l.up ? ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"] : ["BROADCAST", "MULTICAST"],
      link_type: "ether",
      group: l.group === undefined ? "default" : String(l.group),
    };
  }

  // ---- DeviceLayer ----

  async nodeLinks(): Promise<Link[]> {
    this.calls.push({ op: "nodeLinks", args: {} });
    await this.#step("findByMac");
    return this.#node.map((l) => this.#toLink(l));
  }

  async findByMac(mac: string, netns?: string): Promise<Link | null> {
    this.calls.push({ op: "findByMac", args: { mac, netns } });
    await this.#step("findByMac");
    const links = netns === undefined ? this.#node : this.#ns.get(netns)?.links;
    if (!links) throw new DeviceError("findByMac", "netns_invalid", `No netns "${netns}"`);
    const l = links.find((x) => x.mac === mac.toLowerCase());
    return l ? this.#toLink(l) : null;
  }

  async plug(params: PlugParams): Promise<PlugResult> {
    const p = { ...params, netns: pathOf(params.netns) };
    const { timing, nodeName: _hint, beforeMove, policyRuleset, ...args } = p;
    this.calls.push({ op: "plug", args: clone(args) });
    await this.#step("plug");
    const ns = this.#ns.get(p.netns);
    if (!ns) {
      throw new DeviceError("plug", "netns_invalid", `Netns "${p.netns}" does not exist`);
    }
    const i = this.#node.findIndex((l) => l.mac === p.mac);
    if (i < 0) {
      throw new DeviceError("plug", "not_found", `No device with MAC "${p.mac}" on the node`);
    }
    beforeMove?.(this.#node[i].ifname);
    const hl = p.hostLink;
    if (hl && ns.links.some((l) => l.ifname === hl.podIfName)) {
      throw new DeviceError(
        "host_link",
        "ifname_exists",
        `Cannot create the host link "${hl.podIfName}" in netns "${p.netns}": the pod has an interface of that name`,
      );
    }
    if (ns.links.some((l) => l.ifname === p.ifName)) {
      throw new DeviceError(
        "plug",
        "ifname_exists",
        `Interface "${p.ifName}" already exists in "${p.netns}"`,
      );
    }
    const [link] = this.#node.splice(i, 1);
    const nodeName = link.ifname;
    link.alias = nodeName;
    link.ifname = p.ifName;
    ns.links.push(link);
    let policy: string | undefined;
    try {
      // As the real layer: the policy's text is made while the device moves.
      policy = hl && policyRuleset ? await policyRuleset() : undefined;
      await this.#step("plug:after-move");
    } catch (err) {
      // The real layer rolls its own steps back before throwing.
      ns.links = ns.links.filter((l) => l !== link);
      link.ifname = nodeName;
      delete link.alias;
      this.#node.push(link);
      throw err;
    }
    link.up = true;
    link.addresses = p.addresses.map((a) => a.cidr);
    link.routes = clone(p.routes);
    if (p.mtu) link.mtu = p.mtu;
    if (hl) {
      try {
        await this.#step("hostLink");
      } catch (err) {
        ns.links = ns.links.filter((l) => l !== link);
        link.ifname = nodeName;
        delete link.alias;
        link.up = false;
        link.addresses = [];
        link.routes = [];
        this.#node.push(link);
        throw err;
      }
      ns.rules = podRulesOf(hl.podAddresses).map((r) => ({ ...r }));
      this.#node.push({
        ifindex: this.#nextIndex++,
        ifname: hl.nodeIfName,
        mac: hl.nodeMac,
        alias: hl.alias,
        up: true,
        mtu: 1500,
        addresses: [],
        routes: Object.values(hl.podAddresses).map((a) => ({
          dst: `${a}/${a.includes(":") ? 128 : 32}`,
        })),
        group: HOST_LINK_GROUP,
      });
      ns.links.push({
        ifindex: this.#nextIndex++,
        ifname: hl.podIfName,
        mac: hl.podMac,
        up: true,
        mtu: 1500,
        addresses: [],
        routes: resultRoutes(hl),
        peer: hl.nodeIfName,
      });
    }
    timing?.("move", 0);
    timing?.("configure", 0);
    if (policy) this.#loaded(p.netns, policy);
    if (isShaped(p.bandwidth)) {
      link.shaping = installedShaping(p.bandwidth, link.mtu);
      timing?.("shape", 0);
      return { nodeName, podIfindex: link.ifindex, shaping: clone(link.shaping) };
    }
    return { nodeName, podIfindex: link.ifindex };
  }

  async unplug(params: UnplugParams): Promise<UnplugOutcome> {
    const p = { ...params, netns: params.netns ? pathOf(params.netns) : params.netns };
    const { timing, ...args } = p;
    this.calls.push({ op: "unplug", args: clone(args) });
    timing?.("move", 0);
    await this.#step("unplug");
    if (p.hostLink) this.#dropHostLink(p.hostLink);
    let outcome: UnplugOutcome = "missing";
    let link: FakeLink | undefined;
    const ns = p.netns ? this.#ns.get(p.netns) : undefined;
    // As the real layer: by MAC, else by the alias set at plug, else by the pod name.
    const pick = (links: FakeLink[], podName?: string) =>
      links.find((l) => l.mac === p.mac) ??
        links.find((l) => l.alias === p.nodeName && l.ifname !== p.nodeName) ??
        (podName === undefined ? undefined : links.find((l) => l.ifname === podName));
    const trusted = params.netns ? namesOneNamespace(params.netns) : false;
    const inPod = ns ? pick(ns.links, trusted ? p.podName : undefined) : undefined;
    if (ns && inPod) {
      ns.links = ns.links.filter((l) => l !== inPod);
      this.#node.push(inPod);
      link = inPod;
      outcome = "pod";
    } else {
      link = pick(this.#node);
      if (link) outcome = "node";
    }
    if (link) {
      link.mac = p.mac;
      link.ifname = p.nodeName;
      delete link.alias;
      link.up = false;
      link.addresses = [];
      link.routes = [];
      // The kernel drops a device's qdiscs when it changes namespace.
      delete link.shaping;
    }
    return outcome;
  }

  async inspect(
    params: { netns: string | PinnedNetns; ifName: string },
  ): Promise<PodInterfaceState> {
    const p = { ...params, netns: pathOf(params.netns) };
    this.calls.push({ op: "inspect", args: clone(p) });
    await this.#step("inspect");
    const ns = this.#ns.get(p.netns);
    if (!ns) throw new DeviceError("inspect", "netns_invalid", `Netns "${p.netns}" does not exist`);
    const l = ns.links.find((x) => x.ifname === p.ifName);
    if (!l) return { link: null, addresses: [], routes: [] };
    // As the real layer: the namespace's routes, whatever link they use.
    const routes = ns.links.flatMap((x) => x.routes);
    return { link: this.#toLink(l), addresses: [...l.addresses], routes: clone(routes) };
  }

  /** Removes a host link's two ends, wherever they are; whether there was one. */
  #dropHostLink(ref: HostLinkRef): boolean {
    const had = this.#node.some((l) => l.ifname === ref.nodeIfName);
    this.#node = this.#node.filter((l) => l.ifname !== ref.nodeIfName);
    for (const ns of this.#ns.values()) {
      ns.links = ns.links.filter((l) => l.peer !== ref.nodeIfName);
    }
    return had;
  }

  async inspectHostLink(
    params: { netns: string | PinnedNetns; hostLink: HostLinkRef },
  ): Promise<HostLinkState> {
    const p = { ...params, netns: pathOf(params.netns) };
    this.calls.push({ op: "inspectHostLink", args: clone(p) });
    await this.#step("inspect");
    const ns = this.#ns.get(p.netns);
    if (!ns) throw new DeviceError("inspect", "netns_invalid", `Netns "${p.netns}" does not exist`);
    const pod = ns.links.find((l) => l.ifname === p.hostLink.podIfName);
    const node = this.#node.find((l) => l.ifname === p.hostLink.nodeIfName);
    return {
      podEnd: pod ? this.#toLink(pod) : null,
      nodeEnd: node ? this.#toLink(node) : null,
      nodeRoutes: node ? node.routes.map((r) => r.dst) : [],
      podRules: clone(ns.rules ?? []),
    };
  }

  async hostLinks(): Promise<Link[]> {
    this.calls.push({ op: "hostLinks", args: {} });
    await this.#step("findByMac");
    return this.#node.filter((l) => l.group === HOST_LINK_GROUP).map((l) => this.#toLink(l));
  }

  async removeHostLink(nodeIfName: string): Promise<boolean> {
    this.calls.push({ op: "removeHostLink", args: { nodeIfName } });
    await this.#step("hostLink");
    return this.#dropHostLink({ nodeIfName, podIfName: "" });
  }

  async nodeAddresses(): Promise<NodeAddresses> {
    this.calls.push({ op: "nodeAddresses", args: {} });
    await Promise.resolve();
    return clone(this.nodeAddrs);
  }

  readNodeFile(path: string): Promise<string | null> {
    return Promise.resolve(this.nodeFiles.get(path) ?? null);
  }

  async ensureHostLinkTable(
    legacy: string[] = [],
    _marks?: { node: number; kubeProxyMasquerade: number },
  ): Promise<void> {
    this.calls.push({ op: "ensureHostLinkTable", args: { legacy } });
    await this.#step("hostLink");
    this.tableLoads++;
    this.#deleted.delete(`${NODE} inet enim`);
  }

  #loaded(where: string, text: string): void {
    this.#deleted.delete(where);
    const list = this.rulesets.get(where) ?? [];
    list.push(text);
    this.rulesets.set(where, list);
  }

  async loadRuleset(netns: string | null, text: string): Promise<void> {
    this.calls.push({ op: "loadRuleset", args: { netns } });
    await this.#step("nft");
    if (netns !== null && !this.#ns.has(netns)) {
      throw new DeviceError("nft", "netns_invalid", `Netns "${netns}" does not exist`);
    }
    // The NetworkPolicy fence (`policy/fence.ts`'s FENCE_TABLE, named here: netns does not
    // import policy), a table of its own: kept apart.
    if (text.startsWith("table inet enim_fence {")) {
      this.fences.set(netns ?? NODE, text);
      return;
    }
    this.#loaded(netns ?? NODE, text);
  }

  /** The last text loaded for the NetworkPolicy fence, per namespace (`NODE` or a path). */
  readonly fences = new Map<string, string>();

  async listCounters(netns: string | null, table: string): Promise<string> {
    this.calls.push({ op: "listCounters", args: { netns, table } });
    await this.#step("nft");
    if (netns !== null && !this.#ns.has(netns)) {
      throw new DeviceError("nft", "netns_invalid", `Netns "${netns}" does not exist`);
    }
    return this.counters.get(netns ?? NODE) ?? '{"nftables":[]}';
  }

  /** Tables deleted by the test (`deleteTables`): namespaces, or `NODE inet enim`, until loaded again. */
  readonly #deleted = new Set<string>();

  /**
   * Deletes every table of a namespace (`NODE` or a path), as `nft flush ruleset` would
   * (on the node, the host-link table too).
   */
  deleteTables(where: string): void {
    this.#deleted.add(where);
    if (where === NODE) this.#deleted.add(`${NODE} inet enim`);
  }

  /**
   * A table as `listTable` answers. The host-link table (`inet enim` on the node): there
   * once `ensureHostLinkTable` ran (and not deleted since). Any other: there once anything
   * was loaded in its namespace (and not deleted since), its handle the count of loads
   * there (a load changes it).
   */
  async listTable(netns: string | null, table: string): Promise<string | null> {
    this.calls.push({ op: "listTable", args: { netns, table } });
    await this.#step("nft");
    const where = netns ?? NODE;
    if (netns !== null && !this.#ns.has(netns)) {
      throw new DeviceError("nft", "netns_invalid", `Netns "${netns}" does not exist`);
    }
    const [family, name] = table.split(" ");
    if (netns === null && table === "inet enim") {
      if (this.tableLoads === 0 || this.#deleted.has(`${NODE} inet enim`)) return null;
      return JSON.stringify({ nftables: [{ table: { family, name, handle: this.tableLoads } }] });
    }
    const loads = this.rulesets.get(where)?.length ?? 0;
    if (loads === 0 || this.#deleted.has(where)) return null;
    return JSON.stringify({ nftables: [{ table: { family, name, handle: loads } }] });
  }

  /** Every `flushConntrack`, in order: the namespace (`NODE` or a path) and addresses. */
  readonly conntrackFlushes: { netns: string; addresses: string[] }[] = [];

  async flushConntrack(
    netns: string | null,
    addresses: string[],
    opts: { listedOnly?: boolean } = {},
  ): Promise<void> {
    this.calls.push({
      op: "flushConntrack",
      args: { netns, addresses, ...(opts.listedOnly ? { listedOnly: true } : {}) },
    });
    await this.#step("nft");
    if (netns !== null && !this.#ns.has(netns)) {
      throw new DeviceError("conntrack", "netns_invalid", `Netns "${netns}" does not exist`);
    }
    this.conntrackFlushes.push({ netns: netns ?? NODE, addresses: [...addresses] });
  }

  async sweepHostLinkRules(): Promise<number> {
    this.calls.push({ op: "sweepHostLinkRules", args: {} });
    await this.#step("hostLink");
    return 0;
  }

  /** The shaping of the pod's interface, as `tc -j` would show it. */
  async inspectShaping(
    params: { netns: string | PinnedNetns; ifName: string },
  ): Promise<LiveShaping> {
    const p = { ...params, netns: pathOf(params.netns) };
    this.calls.push({ op: "inspectShaping", args: clone(p) });
    await this.#step("inspect");
    const ns = this.#ns.get(p.netns);
    if (!ns) throw new DeviceError("inspect", "netns_invalid", `Netns "${p.netns}" does not exist`);
    const l = ns.links.find((x) => x.ifname === p.ifName);
    return l?.shaping ? liveShapingOf(l.ifname, l.mac, l.shaping) : { qdiscs: [], filters: [] };
  }

  /** Like the real layer: the namespace's identity, held (nothing to hold here). */
  async pin(path: string): Promise<PinnedNetns> {
    this.calls.push({ op: "pin", args: { path } });
    await this.#step("pin");
    const ns = this.#ns.get(path);
    if (!ns) throw new DeviceError("netns", "netns_invalid", `Netns "${path}" does not exist`);
    // As the real layer: a /proc/<pid> path is used by path and keeps nothing alive.
    return {
      path,
      ref: path,
      identity: clone(ns.identity),
      keepsAlive: !path.startsWith("/proc/"),
      close() {},
    };
  }

  async netnsIdentity(path: string): Promise<NetnsIdentity | null> {
    this.calls.push({ op: "netnsIdentity", args: { path } });
    await this.#step("netnsIdentity");
    const ns = this.#ns.get(path);
    return ns ? clone(ns.identity) : null;
  }

  // ---- direct edits for CHECK tests ----

  /** Edits the pod link named `ifName` in `netns` (to make CHECK fail). */
  editPodLink(netns: string, ifName: string, edit: (l: FakeLink) => void): void {
    const l = this.#ns.get(netns)?.links.find((x) => x.ifname === ifName);
    if (!l) throw new Error(`No link "${ifName}" in "${netns}"`);
    edit(l);
  }
}
