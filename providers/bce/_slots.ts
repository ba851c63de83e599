/**
 * The node limit, shared by every profile: resolving it (`_limit.ts`, never
 * fatal), counting the slots in use, reserving one for a new ENI and handing
 * one back.
 *
 * ENIs in the table (lost ones excepted) + intents + other ENIs attached to the
 * node (seen at the last list) never exceed the limit. The check and the
 * reservation (inserting the intent) run in one synchronous section, so no
 * interleaving of parallel allocations can overshoot. Quarantined ENIs do not
 * count: their slot is freed, and should BCE still count them, the attach that
 * overshoots fails with a quota error and new ENIs wait.
 *
 * **Pods go before warm pools.** The rule, in three parts:
 *
 * 1. A pod that needs a new ENI when the node is at its limit makes room: an
 *    idle (free) ENI of *another* profile is detached and deleted first (an ENI
 *    of no configured profile before any; then the profile with the most free
 *    ENIs above its `minIdle`; then the most recently freed). Only for a fixed IP
 *    or range, which no free ENI of the pod's own profile matched, may one of
 *    those go instead. The eviction and the pod's reservation are one
 *    synchronous section: the new ENI's create intent shares the evicted ENI's
 *    slot (`after_release`) until its release is done, and the attach waits for
 *    it. So a pod never starves because of another profile's warm pool.
 * 2. A warm pool refill never takes the slots pending pods need: from the moment
 *    an allocation finds no free ENI until it has reserved its slot (or failed),
 *    it counts as demand, and a refill reserves a slot only when one is left
 *    after that demand ({@linkcode reserveForPool}).
 * 3. Refills never evict. The slots left over are shared round-robin among the
 *    profiles whose pool is below its `minIdle` (`default` first), so one
 *    profile's pool cannot take them all (`_pool.ts`).
 *
 * A refill already in flight when a pod comes is not undone; the ENI it makes
 * is free, so it is the first a later pod at the limit evicts.
 *
 * @module
 */
import { transaction } from "../../lib/sqlite.ts";
import { DEFAULT_PROFILE, type Owner } from "../contract.ts";
import type { Groups, IntentRow } from "./_store.ts";
import { fillIntent, newIntent } from "./_tables.ts";
import { resolveNodeLimit } from "./_limit.ts";
import type { BceCore, BceProfile } from "./_core.ts";

/** ENIs counted against the node limit now (lost and quarantined ones are not). */
export function slotsUsed(core: BceCore): number {
  return core.store.slotRows() + core.store.intentSlots() + core.foreign.size;
}

/** Resolves the node limit; when `retry`, at most once a minute. Resolves to whether it changed. */
export async function resolveLimit(core: BceCore, retry = false): Promise<boolean> {
  if (retry && Date.now() - core.limitTriedAt < 60_000) return false;
  core.limitTriedAt = Date.now();
  const before = core.limit.max;
  const limit = await resolveNodeLimit(core.client, core.o.instanceId, core.o.maxEnisPerNode);
  core.limit = limit;
  const fields = {
    maxEnisPerNode: limit.max,
    source: limit.source,
    configured: limit.configured,
    eniQuotaApi: limit.quotaApi,
    instanceEniQuota: limit.instanceEniQuota,
    instanceCpuCount: limit.instanceCpuCount,
    ...(limit.errors.length ? { problems: limit.errors } : {}),
  };
  if (limit.source === "unresolved") {
    core.log.error(
      "Cannot tell this node's ENI limit: BCE did not answer and maxEnisPerNode is not set; no new ENI until it is known (set provider.bce.maxEnisPerNode, or check the credentials' BCC read access)",
      fields,
    );
  } else {
    core.log.info(`Node ENI limit ${limit.max}, from ${limit.source}`, fields);
  }
  return limit.max !== before;
}

/**
 * Asks BCE for the node limit again (an instance's quota can change); a failure
 * keeps the limit in force. Resolves to whether it changed.
 */
export async function refreshLimit(core: BceCore): Promise<boolean> {
  core.limitTriedAt = Date.now();
  const before = core.limit;
  const limit = await resolveNodeLimit(core.client, core.o.instanceId, core.o.maxEnisPerNode);
  if (limit.source === "unresolved") {
    core.log.warn("Cannot ask BCE for the node's ENI limit again; keeping the one in force", {
      maxEnisPerNode: before.max,
      source: before.source,
      problems: limit.errors,
    });
    return false;
  }
  core.limit = limit;
  if (limit.max === before.max) return false;
  core.log.info(`Node ENI limit now ${limit.max} (was ${before.max}), from ${limit.source}`, {
    maxEnisPerNode: limit.max,
    before: before.max,
    source: limit.source,
  });
  return true;
}

/** What a new ENI is to be. */
export interface CreateSpec {
  profile: BceProfile;
  /** A fixed primary IPv4. */
  ip4?: string | null;
  /** A fixed IPv6. */
  ip6?: string | null;
  /** Groups other than the profile's (a pod's inline groups). */
  groups?: Groups | null;
}

/** A create intent with a fresh clientToken and name (not recorded yet). */
function createIntent(
  core: BceCore,
  purpose: "owner" | "pool",
  spec: CreateSpec,
  afterRelease: string | null,
): IntentRow {
  const suffix = Array.from(
    crypto.getRandomValues(new Uint8Array(3)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  return fillIntent({
    ...newIntent("create"),
    name: `${core.o.namePrefix}/${core.o.instanceId}/${suffix}`.slice(0, 65),
    eni_id: null,
    requested_ip: spec.ip4 ?? null,
    purpose,
    profile: spec.profile.name,
    requested_ip6: spec.ip6 ?? null,
    security_groups: spec.groups?.securityGroupIds ?? null,
    enterprise_security_groups: spec.groups?.enterpriseSecurityGroupIds ?? null,
    after_release: afterRelease,
  });
}

/** Reserves a slot for a warm pool ENI of `profile` when one is left after pending pods. */
export function reserveForPool(core: BceCore, profile: BceProfile): IntentRow | null {
  if (core.closed.signal.aborted) return null;
  if (slotsUsed(core) + core.demand >= core.limit.max) return null;
  const intent = createIntent(core, "pool", { profile }, null);
  core.store.insertIntent(intent);
  core.active.add(intent.id);
  return intent;
}

/** A pod's reservation: the create intent, and the release intent of the ENI it evicted. */
export interface OwnerReservation {
  intent: IntentRow;
  evicted: IntentRow | null;
}

/**
 * Reserves a slot for a pod's new ENI; at the limit, makes room by evicting an
 * idle ENI (rule 1 of the module doc). Null when there is no slot and no room.
 * `specific`: the pod asked for a fixed IP or range.
 */
export function reserveForOwner(
  core: BceCore,
  spec: CreateSpec,
  specific: boolean,
): OwnerReservation | null {
  return reserve(
    core,
    spec.profile,
    specific,
    (afterRelease) => createIntent(core, "owner", spec, afterRelease),
  );
}

/**
 * Reserves a slot for a zone-sticky pod's parked ENI that this node claims (a
 * `claim` intent), making room as for a pod's new ENI. Null when there is none.
 */
export function reserveClaim(
  core: BceCore,
  profile: BceProfile,
  eniId: string,
  owner: Owner,
): OwnerReservation | null {
  return reserve(core, profile, false, (afterRelease) => {
    return fillIntent({
      ...newIntent("claim"),
      name: "",
      eni_id: eniId,
      requested_ip: null,
      purpose: "owner",
      profile: profile.name,
      after_release: afterRelease,
      owner_pod: owner.pod,
      owner_container: owner.containerId,
      owner_if: owner.ifName,
    });
  });
}

/** The reservation of one slot for a pod (rule 1): a free one, else an idle ENI's. */
function reserve(
  core: BceCore,
  profile: BceProfile,
  specific: boolean,
  make: (afterRelease: string | null) => IntentRow,
): OwnerReservation | null {
  if (core.closed.signal.aborted) return null;
  return transaction(core.ctx.db, () => {
    if (slotsUsed(core) < core.limit.max) {
      const intent = make(null);
      core.store.insertIntent(intent);
      core.active.add(intent.id);
      return { intent, evicted: null };
    }
    // With the limit unknown nothing is replaced either (no new ENI until it is known).
    if (core.limit.source === "unresolved") return null;
    const victim = pickVictim(core, profile, specific);
    if (!victim) return null;
    const evicted = takeFreeForRelease(core, { eniId: victim }, "owner");
    if (!evicted) return null;
    const intent = make(evicted.id);
    core.store.insertIntent(intent);
    core.active.add(intent.id);
    return { intent, evicted };
  });
}

/** The idle ENI a pod of `profile` at the limit evicts (rule 1), null when none may go. */
function pickVictim(core: BceCore, profile: BceProfile, specific: boolean): string | null {
  const free = core.store.freeRows();
  const count = new Map<string, number>();
  for (const r of free) count.set(r.profile, (count.get(r.profile) ?? 0) + 1);
  const surplus = (name: string) => {
    const p = core.profiles.get(name);
    return p ? (count.get(name) ?? 0) - p.warmPool.minIdle : Infinity;
  };
  const others = free.filter((r) => r.profile !== profile.name).sort((a, b) =>
    surplus(b.profile) - surplus(a.profile) || b.updated_ms - a.updated_ms
  );
  if (others.length > 0) return others[0].eni_id;
  if (!specific) return null;
  const own = free.filter((r) => r.profile === profile.name)
    .sort((a, b) => b.updated_ms - a.updated_ms);
  return own[0]?.eni_id ?? null;
}

/**
 * Moves one free ENI into a release intent (synchronous): the one named, else the
 * most recently freed (of a profile, when given). Null when there is none.
 */
export function takeFreeForRelease(
  core: BceCore,
  which: { eniId?: string; profile?: string } = {},
  purpose: "owner" | "pool" = "pool",
): IntentRow | null {
  const intent = core.store.takeFreeForRelease({
    ...newIntent("release"),
    name: "",
    requested_ip: null,
    purpose,
  }, which);
  if (intent) core.active.add(intent.id);
  return intent;
}

/**
 * Moves an owned ENI out of the pool into a release intent (synchronous): it
 * must serve no other pod (its groups could not be put back). Null when it is
 * not tracked any more.
 */
export function releaseOwned(core: BceCore, eniId: string): IntentRow | null {
  const intent = core.store.releaseOwned(eniId, {
    ...newIntent("release"),
    name: "",
    requested_ip: null,
    purpose: "owner",
  });
  if (intent) core.active.add(intent.id);
  return intent;
}

/**
 * Records a release intent for an attached ENI of ours that is in no table (it
 * holds a slot until released). Null when something tracks it already.
 */
export function releaseUntracked(core: BceCore, eniId: string): IntentRow | null {
  return transaction(core.ctx.db, () => {
    if (core.store.row(eniId) || core.store.intents().some((i) => i.eni_id === eniId)) {
      return null;
    }
    const intent: IntentRow = fillIntent({
      ...newIntent("release"),
      name: "",
      eni_id: eniId,
      requested_ip: null,
      purpose: "pool",
      profile: DEFAULT_PROFILE,
      requested_ip6: null,
      security_groups: null,
      enterprise_security_groups: null,
      after_release: null,
    });
    core.store.insertIntent(intent);
    core.active.add(intent.id);
    return intent;
  });
}
