/**
 * How many ENIs this node may have attached besides its primary NIC, and where that
 * figure came from.
 *
 * Sources, tried in order, none of them fatal:
 * 1. the instance detail's `eniQuota` (`GET /v2/instance/{id}`), which is what CCE
 *    uses (cce-network-v2/pkg/bce/vpceni/node_bcc.go refreshENIQuota; when that is 0,
 *    CCE's rule min(CPU count, 8) on the detail's `cpuCount`,
 *    cce-network-v2/pkg/bce/vpceni/resource_quota_manager.go calculateMaxENIPerNode).
 *    It does not count the primary NIC: CCE compares it with the ENIs the VPC API lists
 *    for the instance (`AvailableInterfaces = eniQuota - eniCount`, node_bcc.go
 *    __prepareIPAllocation), an API that cannot see the primary NIC (CCE's
 *    pkg/bce/api/cloud/types.go, ListBCCInstanceEni's comment); an eniQuota of 0
 *    means the instance takes no ENI at all and CCE falls back to the primary NIC's
 *    secondary IPs (node_bcc.go refreshBCCInfo; release notes 2.12.10); and CCE fixed
 *    as a bug that pre-attaching `eniQuota` ENIs attached one fewer (release notes
 *    2.12.15, cce-network-v2/docs/release.md). enim lists the node's ENIs with the same
 *    VPC API, so this figure is compared with them as it is;
 * 2. `GET /v1/eni/quota?instanceId=…` `totalQuantity` (bce-sdk-go only, no doc page;
 *    whether it counts the primary NIC is unverified, and CCE never calls it): only
 *    when the instance detail cannot be read or says 0;
 * 3. then CCE's CPU rule above, when the detail gave a CPU count;
 * 4. the configured `maxEnisPerNode`.
 *
 * A configured value caps what BCE reports (it is also the fallback). With no
 * answer and no configured value the limit is 0, "unresolved": the agent still
 * starts, serves the ENIs it already has, and the provider tries again later.
 *
 * @module
 */
import type { BceClient } from "./client.ts";

/** Where the node limit came from. */
export type LimitSource =
  | "config"
  | "eni-quota-api"
  | "instance-eni-quota"
  | "instance-cpu-rule"
  | "unresolved";

/** The node limit and the figures it was chosen from. */
export interface NodeLimit {
  max: number;
  source: LimitSource;
  configured: number | null;
  /** `/v1/eni/quota` totalQuantity, null when not asked or the call failed. */
  quotaApi: number | null;
  /** The instance detail's eniQuota, null when the call failed. */
  instanceEniQuota: number | null;
  instanceCpuCount: number | null;
  /** Why a source gave nothing (messages carry no secret). */
  errors: string[];
}

/** The CCE rule for an instance whose eniQuota is 0: min(CPU count, 8), 0 without CPUs. */
export function cpuRule(cpuCount: number): number {
  return cpuCount <= 0 ? 0 : Math.min(cpuCount, 8);
}

/** Resolves the node limit; never throws. */
export async function resolveNodeLimit(
  client: BceClient,
  instanceId: string,
  configured: number | undefined,
): Promise<NodeLimit> {
  const out: NodeLimit = {
    max: 0,
    source: "unresolved",
    configured: configured ?? null,
    quotaApi: null,
    instanceEniQuota: null,
    instanceCpuCount: null,
    errors: [],
  };
  let found: { value: number; source: LimitSource } | null = null;
  let cpuCount = 0;
  try {
    const inst = await client.getInstance(instanceId);
    out.instanceEniQuota = inst.eniQuota ?? null;
    out.instanceCpuCount = inst.cpuCount ?? null;
    cpuCount = inst.cpuCount ?? 0;
    if ((inst.eniQuota ?? 0) > 0) found = { value: inst.eniQuota!, source: "instance-eni-quota" };
    else out.errors.push(`instance "${instanceId}" reports eniQuota 0`);
  } catch (e) {
    out.errors.push(`instance detail: ${message(e)}`);
  }
  if (!found) {
    try {
      const q = await client.eniQuota(instanceId);
      out.quotaApi = q.totalQuantity;
      if (q.totalQuantity > 0) found = { value: q.totalQuantity, source: "eni-quota-api" };
      else out.errors.push(`/v1/eni/quota says totalQuantity ${q.totalQuantity}`);
    } catch (e) {
      out.errors.push(`/v1/eni/quota: ${message(e)}`);
    }
  }
  if (!found && cpuRule(cpuCount) > 0) {
    found = { value: cpuRule(cpuCount), source: "instance-cpu-rule" };
  }
  if (configured && found) {
    out.max = Math.min(configured, found.value);
    out.source = configured <= found.value ? "config" : found.source;
  } else if (configured) {
    out.max = configured;
    out.source = "config";
  } else if (found) {
    out.max = found.value;
    out.source = found.source;
  }
  return out;
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
