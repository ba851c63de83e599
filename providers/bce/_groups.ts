/**
 * An ENI's security groups while a pod owns it, and after.
 *
 * A pod may name inline groups (the manager checked them against its profile's
 * `allowedSecurityGroupIds`): a free ENI of its profile gets them with one
 * `bindSg` (regular groups) or `bindEsg` (enterprise groups) call, each of which
 * *replaces* every group the ENI had, of either kind (BCE docs "弹性网卡更新普通安全组"
 * and "…企业安全组"). A new ENI is created with them directly. When the pod frees
 * the ENI, its profile's groups are put back the same way before it rejoins the
 * pool, so the next pod never inherits someone else's groups.
 *
 * No call is made when the ENI has the wanted groups already: a pod without
 * inline groups that takes a free ENI of its profile costs no API call.
 *
 * Failures: when BCE refuses the groups (a 4xx: nothing changed) the ENI goes
 * back to the pool and the allocation fails with a ProviderError. When the
 * outcome is unknown (the call failed after its retries) the ENI leaves the
 * pool: it is detached and deleted rather than risk the wrong groups on the
 * next pod. An ENI whose profile's groups cannot be put back leaves it too.
 *
 * @module
 */
import { type Owner, ProviderError } from "../contract.ts";
import { BceApiError } from "./errors.ts";
import type { EniRow, Groups } from "./_store.ts";
import type { BceCore, BceProfile } from "./_core.ts";
import { groupsToRecord, profileGroups, rowGroups, sameGroups } from "./_convert.ts";
import { release } from "./_lifecycle.ts";
import { releaseOwned } from "./_slots.ts";

/** The groups a pod's ENI should have: its inline ones, else its profile's (null: any). */
export function wantedGroups(profile: BceProfile, inline: Groups | null): Groups | null {
  return inline ?? profileGroups(profile);
}

/** Replaces the ENI's groups in BCE (`bindSg` or `bindEsg`) and records them. */
async function bind(core: BceCore, row: EniRow, groups: Groups): Promise<void> {
  const token = crypto.randomUUID();
  if (groups.enterpriseSecurityGroupIds.length > 0) {
    await core.client.bindEnterpriseSecurityGroups(
      row.eni_id,
      groups.enterpriseSecurityGroupIds,
      token,
    );
  } else {
    await core.client.bindSecurityGroups(row.eni_id, groups.securityGroupIds, token);
  }
  core.store.setGroups(row.eni_id, groupsToRecord(core, row.profile, groups), Date.now());
}

/** Whether BCE refused the call outright (a 4xx that is not retried: nothing changed). */
function refused(e: unknown): boolean {
  return e instanceof BceApiError && !e.retryable && e.status >= 400 && e.status < 500;
}

/**
 * Gives the ENI `row` (just assigned to `owner`) the `wanted` groups. On failure
 * the ENI goes back to the pool (BCE refused) or leaves it (outcome unknown), and
 * a ProviderError says so.
 */
export async function claimGroups(
  core: BceCore,
  row: EniRow,
  owner: Owner,
  wanted: Groups | null,
): Promise<void> {
  if (wanted === null || sameGroups(rowGroups(core, row), wanted)) return;
  const ids = [...wanted.securityGroupIds, ...wanted.enterpriseSecurityGroupIds];
  try {
    await bind(core, row, wanted);
    core.log.info("Security groups of the ENI replaced for its pod", {
      eniId: row.eni_id,
      owner,
      securityGroupIds: ids,
    });
  } catch (e) {
    if (refused(e)) {
      core.store.unassign(row.eni_id, Date.now());
      throw new ProviderError(
        "other",
        `BCE refused the security groups ${
          ids.map((g) => `"${g}"`).join(", ")
        } on ENI "${row.eni_id}"; the ENI went back to the pool: ${(e as Error).message}`,
        { cause: e, requestId: (e as BceApiError).requestId },
      );
    }
    leavePool(core, row.eni_id, "its security groups are unknown after a failed change", e);
    throw new ProviderError(
      "unavailable",
      `Cannot set the security groups ${
        ids.map((g) => `"${g}"`).join(", ")
      } on ENI "${row.eni_id}"; the ENI is released: ${(e as Error).message}`,
      { cause: e },
    );
  }
}

/**
 * Puts the profile's groups back on an ENI its owner frees. False when they
 * could not be (the caller takes the ENI out of the pool).
 */
export async function restoreGroups(core: BceCore, row: EniRow): Promise<boolean> {
  const profile = core.profiles.get(row.profile);
  const own = profile ? profileGroups(profile) : null;
  if (own === null || sameGroups(rowGroups(core, row), own)) return true;
  try {
    await bind(core, row, own);
    core.log.info("Security groups of the profile put back on the freed ENI", {
      eniId: row.eni_id,
      profile: row.profile,
    });
    return true;
  } catch (e) {
    core.log.warn("Cannot put the profile's security groups back on a freed ENI", {
      eniId: row.eni_id,
      profile: row.profile,
      error: e,
    });
    return false;
  }
}

/** Takes an ENI out of the pool for good: detached and deleted in the background. */
export function leavePool(core: BceCore, eniId: string, why: string, cause?: unknown): void {
  const intent = releaseOwned(core, eniId);
  core.log.warn("An ENI leaves the pool; it is detached and deleted", { eniId, why, error: cause });
  if (!intent) return;
  core.track(
    release(core, intent).catch((e) =>
      core.log.warn("Releasing the ENI failed; the pool loop will retry", { eniId, error: e })
    ),
  );
  core.kick();
}
