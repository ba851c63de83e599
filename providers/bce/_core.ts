/**
 * The BCE provider's shared state: what every room of the provider reads and
 * writes (the options, the store, the node limit, the work in flight), and the
 * few helpers they all use. {@linkcode BceProvider} owns one; the rooms are
 * functions that take it:
 *
 * - `_slots.ts`: the node limit shared by the profiles, counting slots, reserving
 *   one (making room for a pod), handing one back;
 * - `_allocate.ts`: giving an owner an ENI (its sticky one, a free one, or a new one);
 * - `_groups.ts`: a pod's inline security groups, and its profile's put back;
 * - `_lifecycle.ts`: create, attach, detach, delete, escalation and quarantine;
 * - `_reconcile.ts`: the list, ENIs that left the node, adoption, resuming intents;
 * - `_orphans.ts`: the whole-VPC scan for leftovers of this node;
 * - `_pool.ts`: the pool pass (each profile's warm pool grows or shrinks);
 * - `_status.ts`: the status counts and details;
 * - `_convert.ts`: subnets, groups compared, and BCE's ENI to the contract's;
 * - `_store.ts` (queries) and `_tables.ts` (DDL, migrations, row schemas): the tables.
 *
 * @module
 */
import {
  DEFAULT_PROFILE,
  type ProviderContext,
  ProviderError,
  type StickyEvent,
  type StickyPolicy,
} from "../contract.ts";
import type { BceEni } from "./client.ts";
import type { Logger } from "../../lib/log.ts";
import type { BceClient } from "./client.ts";
import { BceStore } from "./_store.ts";
import type { NodeLimit } from "./_limit.ts";

/** Timings of the BCE provider (config `timeouts`, in milliseconds). */
export interface BceTimings {
  attachMs: number;
  detachMs: number;
  escalateMs: number;
  createVisibilityMs: number;
  deviceMs: number;
  pollMs: number;
  poolIntervalMs: number;
  idleIntervalMs: number;
  orphanScanIntervalMs: number;
  quarantineRetryMs: number;
  minPassGapMs: number;
  jitter: number;
  /** Other nodes delete an expired parked ENI only this long after its expiry (clock skew). */
  parkedExpiryGraceMs: number;
  /** How long the shared index of zone-sticky ENIs serves lookups (BCE ignoring the name filter). */
  stickyIndexTtlMs: number;
  /** How often the node's ENI limit is asked again (BCE may change an instance's quota). */
  limitRefreshMs: number;
}

/** A profile as the provider runs it: where its ENIs live, their groups, its warm pool. */
export interface BceProfile {
  name: string;
  /** The subnet its ENIs are created in. */
  subnetId: string;
  /** The groups its ENIs have (one kind; both empty: whatever BCE gives, never replaced). */
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
  /** Its free ENIs: refilled up to minIdle, released down to maxIdle. */
  warmPool: { minIdle: number; maxIdle: number };
  /** The namespaces whose pods may use it; null: every namespace. */
  namespaces: string[] | null;
  /** The groups a pod may name inline (empty: inline groups are off). */
  allowedSecurityGroupIds: string[];
  /** How far its sticky pods keep their ENI (`zone`: parked in the VPC, claimed by any node). */
  sticky: StickyPolicy;
}

/** Settings of the BCE provider (resolved from the config). */
export interface BceProviderOptions {
  client: BceClient;
  instanceId: string;
  vpcId: string;
  /** The profiles, `default` first. */
  profiles: BceProfile[];
  /** Known subnet CIDRs (id → CIDR); others are looked up. */
  subnetCidrs?: Record<string, string>;
  /** Known subnet IPv6 CIDRs (id → CIDR). */
  subnetIpv6Cidrs?: Record<string, string>;
  namePrefix: string;
  description: string;
  /** The cluster's id in zone-sticky records; null: no profile has zone scope. */
  clusterId: string | null;
  /** A cap on the node limit, and its fallback when BCE does not tell. */
  maxEnisPerNode?: number;
  /** IPv6 on new ENIs. */
  ipv6: "auto" | "always" | "never";
  timings: BceTimings;
  /** The jitter source (tests seed it). */
  random?: () => number;
}

/** An ENI did not reach a status in time: stuck in `attaching` or `detaching`. */
export class BceStuckError extends ProviderError {
  readonly eniId: string;
  /** The status it stayed in. */
  readonly status: string;
  constructor(eniId: string, status: string, message: string) {
    super("unavailable", message);
    this.name = "BceStuckError";
    this.eniId = eniId;
    this.status = status;
  }
}

/** How disposing of an ENI ended. */
export type Disposal = "deleted" | "gone" | "not-ours" | "elsewhere" | "quarantined";

/** The provider's shared state (see the module doc). */
export class BceCore {
  readonly o: BceProviderOptions;
  readonly t: BceTimings;
  readonly client: BceClient;
  readonly store: BceStore;
  readonly log: Logger;
  readonly ctx: ProviderContext;
  /** The node limit in force. */
  limit: NodeLimit;
  /** When the limit was last resolved. */
  limitTriedAt = 0;
  /** Other ENIs attached (or attaching) to this node at the last list: not ours, or untracked. */
  foreign = new Set<string>();
  /** ENIs attached to this node at the last list (any owner), to notice slots freeing up. */
  attachedCount = 0;
  /** The node's ENIs and statuses at the last list (a pass changed something when it differs). */
  lastSnapshot = "";
  /** Whether one sync with the cloud has completed. */
  synced = false;
  /** Since when syncs have failed, and the last failure (null: the last one worked). */
  syncFailure: { sinceMs: number; message: string } | null = null;
  /** The sync running now. */
  syncing: Promise<boolean> | null = null;
  /** Intent ids and quarantined ENI ids some task is working on now. */
  readonly active = new Set<string>();
  /** Background tasks (awaited at close). */
  readonly bg = new Set<Promise<unknown>>();
  /** Aborted at close. */
  readonly closed = new AbortController();
  /** When the last whole-VPC list ran. */
  lastOrphanScan = 0;
  /** New ENIs wait until then after BCE refused an attach with a quota error. */
  quotaBlockedUntil = 0;
  /** Known subnet CIDRs, by subnet id. */
  readonly cidrs = new Map<string, string>();
  /** Known subnet IPv6 CIDRs (null: the subnet has none), by subnet id. */
  readonly cidrs6 = new Map<string, string | null>();
  /**
   * Allocations that found no free ENI and are on their way to reserve a slot for
   * a new one: warm pool refills leave that many slots to them (`_slots.ts`).
   */
  demand = 0;
  /** The profiles, by name (`default` first). */
  readonly profiles: ReadonlyMap<string, BceProfile>;
  /** Asks for a pool pass soon (set by the provider once its loop runs). */
  kick: () => void = () => {};
  /** Known subnet zones (null: the subnet's detail did not say), by subnet id. */
  readonly zones = new Map<string, string | null>();
  /** The park or claim (rollback) running on an ENI, by ENI id: a claim of it waits for it. */
  readonly eniTasks = new Map<string, Promise<void>>();
  /** Whether BCE was seen ignoring the list's name filter (lookups then use the index). */
  nameFilterIgnored = false;
  /** The shared index of this VPC's zone-sticky ENIs, by name (when the name filter is ignored). */
  stickyIndex: { at: number; map: Map<string, BceEni[]> } | null = null;
  /** The whole-VPC list that refreshes the index now. */
  stickyIndexLoading: Promise<Map<string, BceEni[]>> | null = null;
  /** Counts a zone-wide sticky event (the agent's metrics). */
  readonly events: { sticky(event: StickyEvent, profile: string | null): void };

  constructor(opts: BceProviderOptions, ctx: ProviderContext) {
    this.o = opts;
    this.t = opts.timings;
    this.client = opts.client;
    this.ctx = ctx;
    this.log = ctx.log.child({ provider: "bce", instanceId: opts.instanceId });
    for (const [k, v] of Object.entries(opts.subnetCidrs ?? {})) this.cidrs.set(k, v);
    for (const [k, v] of Object.entries(opts.subnetIpv6Cidrs ?? {})) this.cidrs6.set(k, v);
    this.store = new BceStore(ctx.db);
    this.events = {
      sticky: (event, profile) => ctx.stickyEvent?.(event, profile ?? DEFAULT_PROFILE),
    };
    this.profiles = new Map(opts.profiles.map((p) => [p.name, p]));
    if (!this.profiles.has(DEFAULT_PROFILE)) {
      throw new Error(`The BCE provider needs a "${DEFAULT_PROFILE}" profile`);
    }
    this.limit = {
      max: opts.maxEnisPerNode ?? 0,
      source: opts.maxEnisPerNode ? "config" : "unresolved",
      configured: opts.maxEnisPerNode ?? null,
      quotaApi: null,
      instanceEniQuota: null,
      instanceCpuCount: null,
      errors: [],
    };
  }

  /** The default profile (the top-level settings). */
  get defaultProfile(): BceProfile {
    return this.profiles.get(DEFAULT_PROFILE)!;
  }

  /** A profile by name; a ProviderError when it is not configured. */
  profile(name: string): BceProfile {
    const p = this.profiles.get(name);
    if (!p) {
      throw new ProviderError(
        "other",
        `The BCE provider has no profile "${name}" (configured: ${
          [...this.profiles.keys()].map((n) => `"${n}"`).join(", ")
        })`,
      );
    }
    return p;
  }

  /**
   * Runs `fn` after every earlier cloud-record write of the ENI (its name and
   * description): an owned record written after the ADD never lands after the
   * parked record of the DEL that followed.
   */
  serialRecord<T>(eniId: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.#records.get(eniId) ?? Promise.resolve();
    const next = prev.then(fn);
    const tail = next.then(() => {}, () => {});
    this.#records.set(eniId, tail);
    tail.then(() => {
      if (this.#records.get(eniId) === tail) this.#records.delete(eniId);
    });
    return next;
  }
  readonly #records = new Map<string, Promise<void>>();

  /** Runs `p` in the background; `close()` waits for it. */
  track(p: Promise<unknown>): void {
    this.bg.add(p);
    p.finally(() => this.bg.delete(p));
  }

  /** Whether an ENI carries this provider's marker (its name prefix). */
  isOurs(e: { name: string }): boolean {
    return e.name.startsWith(`${this.o.namePrefix}/`);
  }
}
