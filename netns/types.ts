/**
 * The device layer's contract: everything the agent asks of Linux networking.
 *
 * The real implementation (`netns/mod.ts`, spawning through `netns/ip.ts`) drives
 * `ip -j`/`ip -batch` through Deno.Command; `netns/fake.ts` records calls for unit tests that need no root.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import type { InstalledShaping, LiveShaping, Shaping } from "./bandwidth.ts";
import type { HostLinkRef, HostLinkSpec } from "./host_link.ts";
import type { RuleEntry } from "./ip.ts";

export type { InstalledShaping, LiveShaping, Shaping, ShapingLimit } from "./bandwidth.ts";
export type { HostLinkRef, HostLinkSpec } from "./host_link.ts";

/** A link as `ip -j link show` reports it (the fields enim uses). */
export const LinkSchema = z.looseObject({
  ifindex: z.number().check(z.int()),
  ifname: z.string(),
  address: z.optional(z.string()),
  ifalias: z.optional(z.string()),
  altnames: z.optional(z.array(z.string())),
  operstate: z.optional(z.string()),
  flags: z._default(z.array(z.string()), []),
  link_type: z.optional(z.string()),
  /** The link's group, as `ip -j` prints it ("default" or a number). */
  group: z.optional(z.string()),
});
/** A link as `ip -j link show` reports it. */
export type Link = z.infer<typeof LinkSchema>;

/**
 * An address to configure, in CIDR form (`10.0.1.5/24`, `fd00::5/64`). Routes are
 * never derived from addresses: the caller lists every route (`manager/result.ts`
 * owns the route policy).
 */
export interface AddressSpec {
  cidr: string;
}

/** A route to configure; `gw` absent means on-link. */
export interface RouteSpec {
  dst: string;
  gw?: string;
}

/** The identity of a network namespace file: device and inode of its nsfs inode. */
export const NetnsIdentitySchema = z.object({
  dev: z.number().check(z.int()),
  ino: z.number().check(z.int()),
});
/** The identity of a network namespace file. */
export type NetnsIdentity = z.infer<typeof NetnsIdentitySchema>;

/** A device-layer step, for per-phase timing. */
export type DevicePhase = "device_lookup" | "move" | "configure" | "shape";

/** Receives how long each device-layer step took (ms); optional on every call. */
export type DeviceTiming = (phase: DevicePhase, ms: number) => void;

/** What `plug` did, for the attachment record and the CNI result. */
export interface PlugResult {
  /** The device's name on the node before the move (kept in the link's alias). */
  nodeName: string;
  /** The device's ifindex inside the pod namespace. */
  podIfindex: number;
  /** The bandwidth shaping installed (`PlugParams.bandwidth`), every burst resolved. */
  shaping?: InstalledShaping;
}

/** Where `unplug` found the device. */
export type UnplugOutcome = "pod" | "node" | "missing";

/** What CHECK reads back from the pod's namespace. */
export interface PodInterfaceState {
  link: Link | null;
  /** Addresses on the interface, CIDR form, global scope only. */
  addresses: string[];
  /** The namespace's unicast routes of the main table, both families (dst in CIDR, gw when set). */
  routes: RouteSpec[];
}

/** A device error with the step that failed. */
export class DeviceError extends Error {
  readonly step: string;
  /**
   * `ifname_exists`: the pod already has an interface by that name; `netns_invalid`:
   * the path is no usable network namespace; `netns_node`: it is the node's own (or
   * the host's initial) network namespace.
   */
  readonly reason: "ifname_exists" | "not_found" | "netns_invalid" | "netns_node" | "failed";
  constructor(
    step: string,
    reason: DeviceError["reason"],
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "DeviceError";
    this.step = step;
    this.reason = reason;
  }
}

/** What {@linkcode DeviceLayer.plug} takes. */
export interface PlugParams {
  mac: string;
  /** The pod's namespace: pinned for the operation (`pin`), or a path checked first. */
  netns: string | PinnedNetns;
  ifName: string;
  addresses: AddressSpec[];
  routes: RouteSpec[];
  mtu?: number;
  /**
   * The device's current name on the node, when the caller has just looked it up
   * by MAC (saves a lookup spawn); plug fails cleanly if it is stale.
   */
  nodeName?: string;
  /**
   * Called with the device's node name just before it is moved (again, should a
   * stale name make the layer look the device up and retry), so the caller can
   * record it first: after a crash, that name is what the device is brought back as.
   */
  beforeMove?: (nodeName: string) => void;
  /** Called with the duration of each step (lookup, move, configure, shape). */
  timing?: DeviceTiming;
  /**
   * Bandwidth limits to enforce on the interface in the pod (`./bandwidth.ts`), set
   * up in the same plug and rolled back with it.
   */
  bandwidth?: Shaping;
  /**
   * The host link to create with the ENI (`netns/host_link.ts`): its node-side
   * commands run in the same `ip -batch` as the move, its pod-side commands in the
   * ENI's configure batch; any failure removes it with the ENI's rollback.
   */
  hostLink?: HostLinkSpec;
  /**
   * With a host link: more nftables text (the pod's NetworkPolicy table) loaded in the
   * pod's namespace with the host link's own ruleset, by the same `nft -f`, before the
   * device is configured (it is down until then): the ENI is filtered from its first
   * packet. Called once, when the move's processes have started, so that making the
   * text overlaps the move; a rejection fails the plug with that error (the device
   * brought back).
   */
  policyRuleset?: () => Promise<string>;
}

/** What {@linkcode DeviceLayer.unplug} takes. */
export interface UnplugParams {
  mac: string;
  /** The name the device gets back on the node (the one it had before the move). */
  nodeName: string;
  /** The pod's namespace, when it may still hold the device (pinned, or a path). */
  netns?: string | PinnedNetns | null;
  /**
   * The name enim gave the device in the pod (interface mode): found by it when
   * neither its MAC nor its alias identify it any more.
   */
  podName?: string;
  timing?: DeviceTiming;
  /**
   * The plug shaped the interface's ingress: its ifb device (named after the MAC,
   * `./bandwidth.ts`) is removed from the pod with the device. (The device's own
   * qdiscs leave with it: the kernel drops them when it changes namespace.)
   */
  shapedIngress?: boolean;
  /** The attachment's host link, removed with the device's return (idempotent). */
  hostLink?: HostLinkRef;
}

/**
 * The link kube-proxy's IPVS mode binds every ClusterIP to (a dummy): its addresses are
 * the cluster's Services, never the node's own.
 */
export const KUBE_IPVS_LINK = "kube-ipvs0";

/** The node's own addresses, as the host link routes them (`DeviceLayer.nodeAddresses`). */
export interface NodeAddresses {
  /**
   * Every global-scope address of the node's links, without prefix; node ends and
   * {@linkcode KUBE_IPVS_LINK} (the ClusterIPs of kube-proxy's IPVS mode) excluded.
   */
  addresses: string[];
  /**
   * Per family, the address the node's traffic prefers: the default route's preferred
   * source, else the first global address of the default route's link, else of any link.
   */
  primary: { ipv4?: string; ipv6?: string };
}

/** What CHECK reads of a host link: its two ends and the node's routes over the node end. */
export interface HostLinkState {
  podEnd: Link | null;
  nodeEnd: Link | null;
  /** The node's routes through the node end (destinations, CIDR). */
  nodeRoutes: string[];
  /** The pod's policy-routing rules, both families (`ip -j rule list`). */
  podRules: RuleEntry[];
}

/** A route of the node over a host link's node end, as the kernel has it now. */
export interface NodeRoute {
  /** Destination in CIDR (a host route as `/32` or `/128`). */
  dst: string;
  dev: string;
  /** Its preferred source; absent when it has none (the kernel strips it with the address). */
  prefsrc?: string;
}

/** A permanent neighbour entry of the node on a host link's node end. */
export interface NodeNeighbour {
  /** The address (no prefix). */
  dst: string;
  dev: string;
  /** Its MAC, lower case. */
  lladdr?: string;
}

/** The node side of every host link, as the kernel has it now (`DeviceLayer.hostLinkNodeState`). */
export interface HostLinkNodeState {
  /** The node ends present. */
  nodeEnds: string[];
  /** The node's main-table routes over the node ends. */
  routes: NodeRoute[];
  /** The node's permanent neighbours on the node ends. */
  neighbours: NodeNeighbour[];
}

/** What restores one host link's node side: its node end, the pod's addresses and MAC, the source. */
export type HostLinkNodeSide = Pick<
  HostLinkSpec,
  "nodeIfName" | "podMac" | "podAddresses" | "nodeSource"
>;

/** One change of the node's addresses, as `ip -o monitor address` reports it. */
export interface AddressEvent {
  /** The address went (`Deleted …`); else it came, or its lifetimes were renewed. */
  deleted: boolean;
  ifName: string;
  family: 4 | 6;
  /** The address, without its prefix length. */
  address: string;
  /** `global`, `link`, `host`, … */
  scope: string;
}

/** A running watch of the node's addresses (`DeviceLayer.watchNodeAddresses`). */
export interface AddressWatch {
  /** Settles when the watch has ended, by itself (with why) or by {@linkcode AddressWatch.close}. */
  readonly ended: Promise<string>;
  /** Ends it and waits for it. */
  close(): Promise<void>;
}

/**
 * Everything the agent does to devices. The agent runs in the node's namespace;
 * "node" below means the agent's own network namespace.
 */
export interface DeviceLayer {
  /** Finds a link by MAC in the node namespace, or in `netns` when given. */
  findByMac(mac: string, netns?: string): Promise<Link | null>;
  /** The node namespace's links, in one listing (reconcile's look at the kernel). */
  nodeLinks(): Promise<Link[]>;
  /**
   * Moves the node device with `mac` into `netns` renamed to `ifName` (the node-side
   * name kept in its alias), brings it up and configures addresses and routes.
   * Rolls its own steps back before throwing. Throws {@linkcode DeviceError} with
   * reason `ifname_exists` when `ifName` is taken in the pod.
   */
  plug(p: PlugParams): Promise<PlugResult>;
  /**
   * Brings the device with `mac` back to the node from `netns` (when given and still
   * there) or finds it on the node under any name (the kernel returns devices of a
   * destroyed namespace), renames it `nodeName`, sets it down, removes its addresses
   * and routes and gives it back its MAC when that was changed. Idempotent.
   */
  unplug(p: UnplugParams): Promise<UnplugOutcome>;
  /** Reads the interface `ifName` in `netns` for CHECK. */
  inspect(p: { netns: string | PinnedNetns; ifName: string }): Promise<PodInterfaceState>;
  /** Reads a host link for CHECK: its pod end in `netns`, its node end and the node's routes. */
  inspectHostLink(
    p: { netns: string | PinnedNetns; hostLink: HostLinkRef },
  ): Promise<HostLinkState>;
  /** The node ends of host links on the node (links of the host-link group). */
  hostLinks(): Promise<Link[]>;
  /** Removes a host link by its node end (the pair goes with it); false when it was not there. */
  removeHostLink(nodeIfName: string): Promise<boolean>;
  /** The node's own addresses (one listing). */
  nodeAddresses(): Promise<NodeAddresses>;
  /**
   * Loads enim's nftables table on the node (idempotent: it replaces the table);
   * `legacy`: node ends of links made before issue 34, whose pods' traffic the node
   * still masquerades.
   */
  ensureHostLinkTable(
    legacy?: string[],
    marks?: { node: number; kubeProxyMasquerade: number },
  ): Promise<void>;
  /**
   * Reads a file as the node's namespace shows it (`/proc/net/ip_vs`); null when it does
   * not exist. Optional: without it the caller reads the file itself.
   */
  readNodeFile?(path: string): Promise<string | null>;
  /** Deletes the node's host-link rules whose node end is gone; returns how many. */
  sweepHostLinkRules(): Promise<number>;
  /**
   * Reads the node side of every host link (one listing): the node ends, the node's
   * routes and permanent neighbours over them. Optional: a layer without it never has
   * its node routes restored.
   */
  hostLinkNodeState?(): Promise<HostLinkNodeState>;
  /**
   * Sets again the node's routes and permanent neighbours of `links` (one batch that
   * goes on past a failed line); returns what failed, one sentence each.
   */
  restoreHostLinkNodeSide?(links: HostLinkNodeSide[]): Promise<string[]>;
  /**
   * Watches the node's addresses until closed, handing each change to `onEvent`.
   * Optional: without it, only the GC pass restores node routes.
   */
  watchNodeAddresses?(onEvent: (e: AddressEvent) => void): AddressWatch;
  /**
   * Reads the bandwidth shaping of the interface `ifName` in `netns` for CHECK (the
   * namespace's qdiscs, the interface's ingress filters); compare with
   * `shapingProblems` of `./bandwidth.ts`.
   */
  inspectShaping(p: { netns: string | PinnedNetns; ifName: string }): Promise<LiveShaping>;
  /**
   * Validates a netns reference (absolute path to an nsfs file: a bind mount such
   * as /run/netns/x or /proc/<pid>/ns/net) and returns its identity; null when it
   * does not exist or is not a network namespace.
   */
  netnsIdentity(path: string): Promise<NetnsIdentity | null>;
  /**
   * Proves that `path` names a network namespace other than the node's and holds it
   * open for one operation; throws `netns_invalid` naming the path and what it is.
   */
  pin(path: string): Promise<PinnedNetns>;
  /**
   * Loads an nftables ruleset (`nft -f`, one transaction; `nft -j -f` when the text is
   * JSON, starting with `{`) in the namespace at `netns`
   * (a path), or on the node when it is null. Throws {@linkcode DeviceError} with the
   * namespace and nft's words.
   */
  loadRuleset(netns: string | null, text: string): Promise<void>;
  /**
   * Checks an nftables ruleset on the node without loading it (`nft -c`); `nft -j` JSON
   * when it starts with `{`. Throws {@linkcode DeviceError} when the kernel refuses it.
   * Optional: a layer without it has no kernel to ask.
   */
  checkRuleset?(text: string): Promise<void>;
  /**
   * The named counters of one nftables table (`family name`, e.g. `inet enim_policy`)
   * in the namespace at `netns` (null: the node), as `nft -j list counters table` prints
   * them (JSON text). Throws {@linkcode DeviceError}.
   */
  listCounters(netns: string | null, table: string): Promise<string>;
  /**
   * One nftables table (`family name`) in the namespace at `netns` (null: the node) as
   * `nft -t -j list table` prints it (JSON text; terse: its sets' elements left out), or
   * null when the namespace has no such table. Throws {@linkcode DeviceError}.
   */
  listTable(netns: string | null, table: string): Promise<string | null>;
  /**
   * Deletes the connections tracked in the namespace at `netns` (null: the node) to or
   * from any of `addresses`, either direction, NAT'd or not (`conntrack -D`): they were
   * another pod's. With `listedOnly`, `conntrack` runs only for the addresses the
   * namespace's `/proc/net/nf_conntrack` lists (read by the shell that would run it: one
   * process, where most namespaces track none of them; the node's with `grep`, its table
   * may be large), and for all of them when that file cannot be read. Throws
   * {@linkcode DeviceError} (an invalid address, no `conntrack`).
   */
  flushConntrack(
    netns: string | null,
    addresses: string[],
    opts?: { listedOnly?: boolean },
  ): Promise<void>;
}

/** A network namespace held open for one operation (see `netns/pin.ts`). */
export interface PinnedNetns {
  /** The path the request named (for messages and the record). */
  readonly path: string;
  /** What `ip` and `nsenter` are given: `/proc/<pid>/fd/<n>`, or the /proc path itself. */
  readonly ref: string;
  /** The identity of the namespace held. */
  readonly identity: NetnsIdentity;
  /**
   * Whether this pin keeps the namespace alive and the same until it is closed (an open
   * file of it). False for a `/proc/<pid>/ns/net` path used by path: the process may
   * exit, its namespace go and its PID name another process's namespace meanwhile.
   */
  readonly keepsAlive: boolean;
  /** Lets it go (idempotent). */
  close(): void;
}
