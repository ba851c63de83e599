/**
 * The node limit: resolving it (`_limit.ts`, never fatal), counting the slots in
 * use, reserving one for a new ENI and handing one back.
 *
 * ENIs in the table (lost ones excepted) + intents + other ENIs attached to the
 * node (seen at the last list) never exceed the limit. The check and the
 * reservation (inserting the intent) run in one synchronous section, so no
 * interleaving of parallel allocations can overshoot. Quarantined ENIs do not
 * count: their slot is freed, and should BCE still count them, the attach that
 * overshoots fails with a quota error and new ENIs wait.
 *
 * @module
 */
import type { IntentRow } from "./_store.ts";
import { resolveNodeLimit } from "./_limit.ts";
import type { BceCore } from "./_core.ts";

/** ENIs counted against the node limit now (lost and quarantined ones are not). */
export function slotsUsed(core: BceCore): number {
  return core.store.slotRows() + core.store.intentCount() + core.foreign.size;
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
 * Checks the node limit and reserves a slot by recording a create intent with
 * a fresh clientToken, in one synchronous section. Null when at the limit.
 */
export function reserve(
  core: BceCore,
  purpose: "owner" | "pool",
  requestedIp: string | null,
): IntentRow | null {
  if (core.closed.signal.aborted) return null;
  if (slotsUsed(core) >= core.limit.max) return null;
  const token = crypto.randomUUID();
  const suffix = Array.from(
    crypto.getRandomValues(new Uint8Array(3)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  const intent: IntentRow = {
    id: token,
    kind: "create",
    client_token: token,
    name: `${core.o.namePrefix}/${core.o.instanceId}/${suffix}`.slice(0, 65),
    eni_id: null,
    requested_ip: requestedIp,
    purpose,
    phase: "active",
    created_ms: Date.now(),
  };
  core.store.insertIntent(intent);
  core.active.add(intent.id);
  return intent;
}

/** Moves one free ENI into a release intent (synchronous); null when none is free. */
export function takeFreeForRelease(core: BceCore): IntentRow | null {
  const token = crypto.randomUUID();
  const intent = core.store.takeFreeForRelease({
    id: token,
    kind: "release",
    client_token: token,
    name: "",
    requested_ip: null,
    purpose: "pool",
    phase: "active",
    created_ms: Date.now(),
  });
  if (intent) core.active.add(intent.id);
  return intent;
}
