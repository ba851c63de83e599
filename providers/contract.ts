/**
 * The provider contract: what every cloud (BCE, mock) implements for the ENI manager.
 *
 * The zod schemas are the one source of the types (`z.infer`). Every value a
 * provider returns is parsed through {@linkcode EniSchema} by the manager, so a
 * provider bug or a malformed cloud response cannot corrupt the agent's state.
 *
 * @module
 */
import type * as z from "zod/mini";
import { inRange, normalizeIp } from "../lib/ip.ts";
import { DEFAULT_PROFILE } from "./schema.ts";
import type {
  AllocationRequest,
  AllocationRequestInput,
  Eni,
  IpRange,
  NodeCapacityInput,
  Owner,
  ProfileInfo,
  ProviderStatus,
} from "./schema.ts";

export * from "./schema.ts";
import type { DatabaseSync } from "node:sqlite";
import type { Logger } from "../lib/log.ts";

/**
 * One ingress rule of a simulated cloud's security group: `group` admits `from` (a
 * group id, or a CIDR) on `protocol` port `port`; the replies of what it admits pass
 * back (a cloud's groups are stateful).
 */
export interface SimulatedGroupRule {
  group: string;
  from: string;
  protocol: "tcp" | "udp";
  port: number;
}

/**
 * A hook that makes an attached ENI appear as a network device with the ENI's MAC
 * on the node (the simulated VPC in tests and the demo), and disappear when detached.
 * `plug` gives the ENI's port the ENI's groups; `setSecurityGroups` applies the groups
 * the ENI has now (a pod's inline groups, the profile's again); `setSecurityGroupRules`
 * replaces the simulated cloud's rules.
 */
export interface DeviceSimulator {
  plug(eni: Eni): Promise<void>;
  unplug(eni: Eni): Promise<void>;
  setSecurityGroups?(eni: Eni): Promise<void>;
  setSecurityGroupRules?(rules: SimulatedGroupRule[]): Promise<void>;
  close?(): Promise<void>;
}

/** The zone-wide sticky events the agent counts (`enim_sticky_zone_events_total`). */
export type StickyEvent = "park" | "claim" | "claim_conflict" | "expiry";

/** What the agent hands a provider when it creates it. */
export interface ProviderContext {
  /** The agent's state database: a provider keeps its own tables in it, prefixed with its name. */
  db: DatabaseSync;
  log: Logger;
  /** Waits until a device with this MAC exists on the node (used after attaching a new ENI). */
  waitForDevice?(mac: string, timeoutMs: number): Promise<void>;
  /** Set by tests and the demo; absent in production. */
  deviceSimulator?: DeviceSimulator;
  /** Counts a zone-wide sticky event of a profile (the agent's metrics). Optional. */
  stickyEvent?(event: StickyEvent, profile: string): void;
}

/**
 * The seed's ENIProvider.
 *
 * @example
 * ```ts ignore
 * const eni = await provider.allocateNextENI(
 *   { pod: "default/web-0", containerId: "c1", ifName: "eth0" },
 *   { ips: [], ranges: [] },
 * );
 * await provider.deallocateENI({ pod: "default/web-0", containerId: "c1", ifName: "eth0" });
 * ```
 */
export interface Provider {
  readonly name: string;
  /** A consistent snapshot of every ENI attached to this node. */
  list(): Promise<Eni[]>;
  /**
   * Picks an available ENI (attaching a new one if the provider can) and assigns
   * it to `owner`. If `owner` already holds one, returns it. Never hands one ENI
   * to two owners, whatever runs concurrently. Throws {@linkcode ProviderError}
   * with reason `no_eni_available` or `requested_ip_unavailable` when it cannot.
   */
  allocateNextENI(owner: Owner, request: AllocationRequestInput): Promise<Eni>;
  /** Frees what `owner` holds; succeeds when it holds nothing. */
  deallocateENI(owner: Owner): Promise<void>;
  /** Pool counts for STATUS and `enim status`. */
  status(): Promise<ProviderStatus>;
  /**
   * The profiles this provider runs (`default` first): their subnets, groups and
   * who may use them. Read at each ADD to check the pod's choice before anything
   * is allocated; resolved when the provider is created.
   */
  profiles(): ProfileInfo[];
  /**
   * Shows who owns an ENI in the cloud (its description): `text` names the pod and
   * the node while one owns it; null restores the provider's own description.
   * Called after an ADD has answered (never delaying it). Optional.
   */
  describeENI?(eniId: string, text: string | null): Promise<void>;
  /**
   * Parks the ENI `owner` holds (a zone-wide sticky pod's, after its DEL and its
   * node hold): it leaves this node's pool at once and is detached into the VPC,
   * recorded in the cloud for the pod until `until` (epoch ms), so that the pod's
   * next ADD on any node of the zone finds and claims it (`AllocationRequest.sticky`).
   * Resolves once the park is recorded (a restart finishes it); succeeds when
   * `owner` holds nothing. Optional: only providers with zone-wide stickiness.
   */
  parkENI?(owner: Owner, park: { until: number }): Promise<void>;
  /**
   * Makes the device of an attached ENI reappear on the node after it vanished
   * (the manager calls it when a released device is found nowhere). Optional: the
   * mock re-plugs its simulated device; a cloud provider may detach and re-attach.
   */
  repairDevice?(eniId: string): Promise<void>;
  /**
   * How many ENIs pods can get on this node, and what holds the other slots of its
   * limit (ENIs that are not enim's, quarantined ones). Optional: without it the
   * device plugin counts the free, owned and attachable ENIs of `status()`. Throws
   * {@linkcode ProviderError} `unavailable` while the cloud cannot be asked.
   */
  capacity?(): Promise<NodeCapacityInput>;
  /**
   * Gives a free ENI of this node back to the cloud: detached from the node (and deleted
   * when the provider created it), for `enim uninstall --release-enis`. Throws
   * {@linkcode ProviderError} when the ENI is owned or not this node's. Optional: without
   * it uninstall keeps the ENIs and says so.
   */
  releaseENI?(eniId: string): Promise<void>;
  /** Starts background work (warm pool upkeep). Optional. */
  start?(): Promise<void>;
  /** Stops background work and releases resources. */
  close(): Promise<void>;
}

/** A provider's factory module (`providers/<name>/mod.ts`). */
export interface ProviderModule<C = unknown> {
  /**
   * The provider's own config schema (the `provider.<name>` object of the agent
   * config): any zod v4 schema, classic or mini, whose output is `C`; parse it
   * with `z.parse(schema, value)` or `z.safeParse(schema, value)`.
   */
  configSchema: z.core.$ZodType<C>;
  create(config: C, ctx: ProviderContext): Promise<Provider>;
  /**
   * Checks what the parsed config points at without starting the provider (its
   * credentials, say), for `enim agent --check-config`; throws what is wrong.
   */
  check?(config: C): void | Promise<void>;
}

/** A profile with no subnet known and no rules: what a provider without profiles runs. */
export function defaultProfile(over: Partial<ProfileInfo> = {}): ProfileInfo {
  return {
    name: DEFAULT_PROFILE,
    subnets: {},
    securityGroupIds: [],
    enterpriseSecurityGroupIds: [],
    namespaces: null,
    allowedSecurityGroupIds: [],
    ...over,
  };
}

/** Whether an IP lies in `subnet` (CIDR) and, when given, between rangeStart and rangeEnd. */
export function ipInRange(ip: string, range: IpRange): boolean {
  return inRange(ip, range);
}

/** The ENI's addresses, canonical text form. */
function eniAddresses(eni: Eni): string[] {
  return [eni.ipv4?.address, eni.ipv6?.address].filter((a): a is string => !!a).map(normalizeIp);
}

/** The requested IPs the ENI does not carry (canonical text form). */
export function missingIps(eni: Eni, request: Pick<AllocationRequest, "ips">): string[] {
  const have = new Set(eniAddresses(eni));
  return [...new Set(request.ips.map(normalizeIp))].filter((ip) => !have.has(ip));
}

/**
 * Whether an ENI satisfies an allocation request: it carries *every* requested IP
 * (an ENI has one address per family, so two IPv4 addresses can never be served),
 * and for each range set one of its addresses falls in one of the set's ranges.
 */
export function eniMatches(eni: Eni, request: AllocationRequest): boolean {
  if (missingIps(eni, request).length > 0) return false;
  const addrs = eniAddresses(eni);
  for (const set of request.ranges) {
    if (!addrs.some((a) => set.some((r) => ipInRange(a, r)))) return false;
  }
  return true;
}

/**
 * Why no ENI among `enis` carries all of `request.ips`, naming the IPs: the ones no
 * ENI carries, or, when each is on some ENI, that they are on different ENIs.
 */
export function unmatchedIps(request: Pick<AllocationRequest, "ips">, enis: Eni[]): string {
  const wanted = [...new Set(request.ips.map(normalizeIp))];
  const carried = new Set(enis.flatMap(eniAddresses));
  const nowhere = wanted.filter((ip) => !carried.has(ip));
  if (nowhere.length > 0) {
    return `no ENI carries ${nowhere.join(", ")}`;
  }
  return `${wanted.join(", ")} are on different ENIs (an ENI has one address per family)`;
}

/** The canonical text form of an IP (IPv6 compressed, lower case); the input when it is no IP. */
export { normalizeIp };
