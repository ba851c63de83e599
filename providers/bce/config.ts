/**
 * The `bce` provider's config schema and credential loading.
 *
 * Credentials come from a JSON file (`{accessKeyId, secretAccessKey,
 * sessionToken?}`) that must not be readable or writable by group or others,
 * or from `ENIM_BCE_ACCESS_KEY_ID` / `ENIM_BCE_SECRET_ACCESS_KEY` /
 * `ENIM_BCE_SESSION_TOKEN`. They are never logged and never in an error.
 *
 * @module
 */
import { z } from "zod";
import { ProviderError } from "../contract.ts";
import type { Credentials } from "./signer.ts";
import { DEFAULT_METADATA_URL } from "./metadata.ts";

/** The `provider.bce` object of the agent config. */
export const configSchema = z.object({
  /** The region (`bj`, `gz`, …): the endpoint is `https://bcc.<region>.baidubce.com`. From metadata when absent. */
  region: z.string().regex(/^[a-z0-9-]+$/).optional(),
  /** An endpoint override (`host[:port]` or a URL); https when no scheme is given. */
  endpoint: z.string().min(1).optional(),
  /** A JSON credentials file, mode 0600 or stricter. Env vars are used when absent. */
  credentialsFile: z.string().min(1).optional(),
  /** The VPC; from metadata when absent. */
  vpcId: z.string().min(1).optional(),
  /** The subnet new ENIs are created in; the primary NIC's subnet (metadata) when absent. */
  subnetId: z.string().min(1).optional(),
  /** The subnet's CIDR, to skip the subnet lookup (prefix length and gateway). */
  subnetCidr: z.string().optional(),
  securityGroupIds: z.array(z.string().min(1)).default([]),
  enterpriseSecurityGroupIds: z.array(z.string().min(1)).default([]),
  /** This node's instance id; from metadata when absent. */
  instanceId: z.string().min(1).optional(),
  metadataUrl: z.url().default(DEFAULT_METADATA_URL),
  /** ENIs kept attached and free. */
  warmPool: z.object({
    minIdle: z.number().int().min(0).default(0),
    maxIdle: z.number().int().min(0).default(2),
  }).default({ minIdle: 0, maxIdle: 2 }).refine((w) => w.minIdle <= w.maxIdle, {
    message: "warmPool.minIdle must not exceed warmPool.maxIdle",
  }),
  /**
   * The most ENIs this node may have attached (the primary NIC not counted). The
   * provider also asks BCE (`/v1/eni/quota`, else the instance's `eniQuota`) and uses
   * the smaller of the two; this value alone when BCE does not answer.
   */
  maxEnisPerNode: z.number().int().min(1).max(64).optional(),
  /** The name prefix marking ENIs this provider created; it never touches others. */
  namePrefix: z.string().regex(/^[A-Za-z][A-Za-z0-9\-_.]{0,23}$/).default("enim"),
  description: z.string().max(200).default("created by enim, do not modify"),
  /**
   * IPv6 on new ENIs: `auto` asks for an address when the subnet has an IPv6 range
   * (`ipv6Cidr` in its detail, or `subnetIpv6Cidr`), `always` asks in any case,
   * `never` never asks.
   */
  ipv6: z.enum(["auto", "always", "never"]).default("auto"),
  /** The subnet's IPv6 CIDR, to skip the subnet lookup. */
  subnetIpv6Cidr: z.string().optional(),
  timeouts: z.object({
    requestMs: z.number().int().min(1).default(20_000),
    totalMs: z.number().int().min(1).default(60_000),
    maxAttempts: z.number().int().min(1).max(20).default(5),
    baseDelayMs: z.number().int().min(0).default(1000),
    maxDelayMs: z.number().int().min(0).default(10_000),
    /** How long to wait for a new ENI to become `inuse` (CCE waits 60 s for a new ENI). */
    attachMs: z.number().int().min(1).default(60_000),
    /** How long to wait for a detach to finish before escalating. */
    detachMs: z.number().int().min(1).default(60_000),
    /** After the escalation's detach, how long to wait before deleting anyway. */
    escalateMs: z.number().int().min(1).default(15_000),
    /** How long a not-found on an ENI this provider has just created is retried. */
    createVisibilityMs: z.number().int().min(0).default(10_000),
    /** How long to wait for a new ENI's device to appear on the node. */
    deviceMs: z.number().int().min(1).default(30_000),
    /** The first poll interval while waiting for a status (doubling, capped at 5 s). */
    pollMs: z.number().int().min(1).default(1000),
    /** The warm pool loop's period while something changes. */
    poolIntervalMs: z.number().int().min(1).default(30_000),
    /** The longest period, reached by doubling while nothing changes. */
    idleIntervalMs: z.number().int().min(1).default(300_000),
    /** A pass lists the whole VPC (orphan scan) at most this often; other passes list this instance's ENIs. */
    orphanScanIntervalMs: z.number().int().min(1).default(3_600_000),
    /** How often a quarantined (stuck) ENI is tried again. */
    quarantineRetryMs: z.number().int().min(1).default(600_000),
    /** The shortest gap between two passes, even when an allocation asks for one. */
    minPassGapMs: z.number().int().min(0).default(5_000),
    /** Each period is multiplied by a random factor in [1 - jitter, 1 + jitter]. */
    jitter: z.number().min(0).max(0.9).default(0.2),
  }).prefault({}),
}).refine((c) => !(c.securityGroupIds.length && c.enterpriseSecurityGroupIds.length), {
  message: "Set securityGroupIds or enterpriseSecurityGroupIds, not both",
});
/** The `bce` provider config. */
export type BceConfig = z.infer<typeof configSchema>;

const CredentialsFileSchema = z.object({
  accessKeyId: z.string().min(1),
  secretAccessKey: z.string().min(1),
  sessionToken: z.string().min(1).optional(),
});

/** The API endpoint URL for a config: the override (https by default) or the region's BCC host. */
export function endpointFor(endpoint: string | undefined, region: string | undefined): string {
  if (endpoint) return /^[a-z]+:\/\//i.test(endpoint) ? endpoint : `https://${endpoint}`;
  if (!region) {
    throw new ProviderError("other", "Cannot tell the BCE endpoint: set region or endpoint");
  }
  return `https://bcc.${region}.baidubce.com`;
}

/**
 * Loads credentials from the file (refusing one that group or others can read
 * or write) or from the environment.
 */
export function loadCredentials(
  file: string | undefined,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): Credentials {
  if (file) {
    let info: Deno.FileInfo;
    try {
      info = Deno.statSync(file);
    } catch (e) {
      throw new ProviderError(
        "auth_failed",
        `Cannot read the BCE credentials file "${file}": ${(e as Error).message}`,
      );
    }
    const mode = info.mode ?? 0;
    if ((mode & 0o066) !== 0) {
      throw new ProviderError(
        "auth_failed",
        `Refusing the BCE credentials file "${file}": it is accessible by group or others (mode ${
          (mode & 0o777).toString(8).padStart(4, "0")
        }); run chmod 600 on it`,
      );
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(Deno.readTextFileSync(file));
    } catch {
      throw new ProviderError(
        "auth_failed",
        `The BCE credentials file "${file}" is not valid JSON`,
      );
    }
    const r = CredentialsFileSchema.safeParse(parsed);
    if (!r.success) {
      throw new ProviderError(
        "auth_failed",
        `The BCE credentials file "${file}" needs string fields accessKeyId and secretAccessKey (and optionally sessionToken)`,
      );
    }
    return r.data;
  }
  const accessKeyId = env("ENIM_BCE_ACCESS_KEY_ID");
  const secretAccessKey = env("ENIM_BCE_SECRET_ACCESS_KEY");
  const sessionToken = env("ENIM_BCE_SESSION_TOKEN") || undefined;
  if (!accessKeyId || !secretAccessKey) {
    throw new ProviderError(
      "auth_failed",
      "No BCE credentials: set credentialsFile or ENIM_BCE_ACCESS_KEY_ID and ENIM_BCE_SECRET_ACCESS_KEY",
    );
  }
  return { accessKeyId, secretAccessKey, ...(sessionToken ? { sessionToken } : {}) };
}
