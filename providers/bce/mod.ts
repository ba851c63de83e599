/**
 * The `bce` provider module: Baidu Cloud ENIs in exclusive mode.
 *
 * @example
 * ```ts ignore
 * import { bceModule } from "./providers/bce/mod.ts";
 * const provider = await bceModule.create(bceModule.configSchema.parse(raw), ctx);
 * ```
 *
 * @module
 */
import type { ProviderContext, ProviderModule } from "../contract.ts";
import {
  type BceConfig,
  configSchema,
  credentialsSource,
  endpointFor,
  loadCredentials,
} from "./config.ts";
import { BceClient } from "./client.ts";
import { MetadataClient } from "./metadata.ts";
import { type BceProfile, BceProvider } from "./provider.ts";
import { DEFAULT_PROFILE } from "../contract.ts";

export { configSchema };
export type { BceConfig };
export { BceProvider } from "./provider.ts";

/** Test seams for {@linkcode createBce}. */
export interface CreateOptions {
  /** Reads an environment variable (credentials); `Deno.env.get` by default. */
  env?: (name: string) => string | undefined;
  /** The clock used for signatures. */
  now?: () => Date;
}

/**
 * Creates the provider: resolves metadata and credentials, then the node limit
 * (never fatal: see `_limit.ts`), and syncs once.
 */
export async function createBce(
  config: BceConfig,
  ctx: ProviderContext,
  opts: CreateOptions = {},
): Promise<BceProvider> {
  const cfg = configSchema.parse(config);
  const credentials = credentialsSource(
    cfg.credentialsFile,
    opts.env,
    ctx.log.child({ component: "bce-credentials" }),
  );
  const meta = new MetadataClient({ baseUrl: cfg.metadataUrl });
  const instanceId = cfg.instanceId ?? await meta.instanceId();
  const vpcId = cfg.vpcId ?? await meta.vpcId();
  const subnetId = cfg.subnetId ?? await meta.subnetId();
  const region = cfg.endpoint ? cfg.region : cfg.region ?? await meta.region();
  const t = cfg.timeouts;
  const client = new BceClient({
    endpoint: endpointFor(
      cfg.endpoint,
      region,
      cfg.region ? "provider.bce.region" : "the metadata service's region",
    ),
    credentials,
    log: ctx.log.child({ component: "bce-client" }),
    now: opts.now,
    retry: {
      maxAttempts: t.maxAttempts,
      baseDelayMs: t.baseDelayMs,
      maxDelayMs: t.maxDelayMs,
      totalTimeoutMs: t.totalMs,
      requestTimeoutMs: t.requestMs,
    },
  });
  ctx.log.info("BCE provider configured", {
    endpoint: client.endpoint.origin,
    accessKeyId: credentials().accessKeyId,
    instanceId,
    vpcId,
    subnetId,
    profiles: Object.keys(cfg.profiles).sort(),
  });
  // The top-level settings are the default profile; the named ones follow by name.
  const profiles: BceProfile[] = [{
    name: DEFAULT_PROFILE,
    subnetId,
    securityGroupIds: cfg.securityGroupIds,
    enterpriseSecurityGroupIds: cfg.enterpriseSecurityGroupIds,
    warmPool: cfg.warmPool,
    namespaces: cfg.namespaces ?? null,
    allowedSecurityGroupIds: cfg.allowedSecurityGroupIds,
    sticky: cfg.sticky,
  }];
  const subnetCidrs: Record<string, string> = {};
  const subnetIpv6Cidrs: Record<string, string> = {};
  if (cfg.subnetCidr) subnetCidrs[subnetId] = cfg.subnetCidr;
  if (cfg.subnetIpv6Cidr) subnetIpv6Cidrs[subnetId] = cfg.subnetIpv6Cidr;
  for (const [name, p] of Object.entries(cfg.profiles).sort(([a], [b]) => a < b ? -1 : 1)) {
    profiles.push({
      name,
      subnetId: p.subnetId,
      securityGroupIds: p.securityGroupIds,
      enterpriseSecurityGroupIds: p.enterpriseSecurityGroupIds,
      warmPool: p.warmPool,
      namespaces: p.namespaces ?? null,
      allowedSecurityGroupIds: p.allowedSecurityGroupIds,
      sticky: p.sticky,
    });
    if (p.subnetCidr) subnetCidrs[p.subnetId] = p.subnetCidr;
    if (p.subnetIpv6Cidr) subnetIpv6Cidrs[p.subnetId] = p.subnetIpv6Cidr;
  }
  const provider = new BceProvider({
    client,
    instanceId,
    vpcId,
    profiles,
    subnetCidrs,
    subnetIpv6Cidrs,
    namePrefix: cfg.namePrefix,
    description: cfg.description,
    clusterId: cfg.clusterId ?? null,
    maxEnisPerNode: cfg.maxEnisPerNode,
    ipv6: cfg.ipv6,
    timings: {
      attachMs: t.attachMs,
      detachMs: t.detachMs,
      escalateMs: t.escalateMs,
      createVisibilityMs: t.createVisibilityMs,
      deviceMs: t.deviceMs,
      pollMs: t.pollMs,
      poolIntervalMs: t.poolIntervalMs,
      idleIntervalMs: t.idleIntervalMs,
      orphanScanIntervalMs: t.orphanScanIntervalMs,
      quarantineRetryMs: t.quarantineRetryMs,
      minPassGapMs: t.minPassGapMs,
      jitter: t.jitter,
      parkedExpiryGraceMs: t.parkedExpiryGraceMs,
      stickyIndexTtlMs: t.stickyIndexTtlMs,
      limitRefreshMs: t.limitRefreshMs,
    },
  }, ctx);
  try {
    await provider.init();
  } catch (e) {
    await provider.close();
    throw e;
  }
  return provider;
}

/** The registry's entry point: creates the provider from its parsed config. */
export function create(config: BceConfig, ctx: ProviderContext): Promise<BceProvider> {
  return createBce(config, ctx);
}

/**
 * `enim agent --check-config`: the credentials must be there and usable (a file
 * readable by its owner only, with both keys; or the `ENIM_BCE_*` variables).
 */
export function check(config: BceConfig): void {
  loadCredentials(configSchema.parse(config).credentialsFile);
}

/** The `bce` provider module. */
export const bceModule: ProviderModule<BceConfig> = { configSchema, create, check };

export default bceModule;
