/**
 * A pod's ENI choice: its profile, inline security groups, fixed IPs and
 * stickiness, read from the three places a runtime can carry them.
 *
 * 1. **Pod annotations**, which containerd (and CRI-O) pass to a plugin that
 *    declares the `io.kubernetes.cri.pod-annotations` capability, as
 *    `runtimeConfig["io.kubernetes.cri.pod-annotations"]`:
 *    `enim.dev/profile`, `enim.dev/security-group-ids` (comma-separated),
 *    `enim.dev/ip` (one IPv4 and/or one IPv6 address, comma-separated) and
 *    `enim.dev/sticky` (`"true"` or `"false"`). Any other `enim.dev/` key is
 *    refused: a misspelt annotation would otherwise be ignored silently.
 * 2. **`args.cni`** in the network config (libcni callers, podman's
 *    `--network name:…` options do not reach it, but a conflist or Multus does):
 *    `profile`, `securityGroupIds` (array), `sticky` (boolean), `ips`.
 * 3. **`CNI_ARGS`** (every runtime passes it; podman via
 *    `CONTAINERS_CNI_ARGS`-style settings, cnitool via `CAP_ARGS`/`CNI_ARGS`):
 *    `ENIM_PROFILE`, `ENIM_SECURITY_GROUP_IDS` (comma-separated),
 *    `ENIM_STICKY` (`true`/`false`/`1`/`0`) and `IP`.
 *
 * Each choice is taken from the first source that sets it, in the order above:
 * the annotation is the pod's own declaration, written with the pod and
 * delivered by the runtime only where the operator enabled the capability;
 * CONVENTIONS.md makes `args` win over the equivalent `CNI_ARGS` key ("plugins
 * that understand args must ignore CNI_ARGS"), which is the runtime-wide,
 * least specific channel. Fixed IPs keep today's order with the annotation
 * slotted in: `runtimeConfig.ips` (the `ips` capability: the runtime's own
 * explicit request) → `enim.dev/ip` → `args.cni.ips` → `IP=`. A lower source
 * that disagrees is named in the call's log line as overridden.
 *
 * Values of the wrong form are refused here, before the agent is asked for
 * anything: code 7 for an annotation or `args.cni` (they arrive in the network
 * config), code 4 for a `CNI_ARGS` key. Whether the pod may have what it asks
 * for (the profile exists, admits its namespace, allows the groups; the IP lies
 * in the profile's subnet) the agent decides, also before allocating.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { DEFAULT_PROFILE, ProfileNameSchema, SecurityGroupIdSchema } from "../providers/schema.ts";
import { isIp, parseIp } from "../lib/ip.ts";
import { CNI_CODES, CniError } from "./errors.ts";
import type { CniArgs } from "./args.ts";
import { requestedIps } from "./args.ts";
import type { NetworkConfig } from "./config.ts";

/** The capability key under which containerd passes the pod's annotations. */
export const POD_ANNOTATIONS_KEY = "io.kubernetes.cri.pod-annotations";

/** The annotations enim reads. */
export const ANNOTATIONS = {
  profile: "enim.dev/profile",
  securityGroupIds: "enim.dev/security-group-ids",
  ip: "enim.dev/ip",
  sticky: "enim.dev/sticky",
} as const;

/** Where a choice came from. */
export type ChoiceSource = "annotation" | "args.cni" | "CNI_ARGS" | "runtimeConfig.ips" | "none";

/** A pod's choice, with where each part came from. */
export interface PodChoice {
  profile: string;
  /** Inline groups; absent: the profile's. */
  securityGroupIds?: string[];
  ips: string[];
  sticky: boolean;
  sources: {
    profile: ChoiceSource;
    securityGroupIds: ChoiceSource;
    ips: ChoiceSource;
    sticky: ChoiceSource;
  };
  /** Lower-precedence values that were overridden, for the log. */
  overridden: string[];
}

/** A comma-separated list: items trimmed, empty ones dropped. */
const commaList = (s: string) => s.split(",").map((x) => x.trim()).filter((x) => x !== "");

const GroupList = z.array(SecurityGroupIdSchema).check(
  z.minLength(1, "Expected at least one security group id"),
  z.maxLength(10, "Expected at most 10 security groups (an ENI has no more)"),
);

/** One IPv4 and/or one IPv6 address. */
const FixedIps = z.array(
  z.string().check(z.refine(isIp, "Expected an IPv4 or IPv6 address without a prefix length")),
).check(
  z.minLength(1, "Expected an IPv4 and/or an IPv6 address"),
  z.refine(
    (ips) => new Set(ips.map((ip) => parseIp(ip)?.family)).size === ips.length,
    "Expected at most one IPv4 and one IPv6 address (an ENI has one primary address of each)",
  ),
);

const Bool = z.enum(["true", "false"], 'Expected "true" or "false"');

function issue(e: z.core.$ZodError): string {
  return e.issues.map((i) => i.message).join("; ");
}

/** Parses one value with `schema`, or throws `code` naming `where`. */
function parse<T>(schema: z.ZodMiniType<T>, value: unknown, where: string, code: number): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const shown = JSON.stringify(typeof value === "string" ? value.slice(0, 200) : value);
  throw new CniError(code, `Invalid ${where} ${shown}: ${issue(r.error)}`);
}

const annotationWhere = (key: string) => `annotation "${key}"`;

/** Annotations as CRI passes them: a string map; a Go nil map arrives as null. */
const AnnotationsSchema = z.nullable(z.optional(z.record(z.string(), z.string())));

/** The pod's annotations as the runtime passed them (empty when it passed none). */
export function annotationsOf(
  config: Pick<NetworkConfig, "runtimeConfig">,
): Record<string, string> {
  return parse(
    AnnotationsSchema,
    config.runtimeConfig?.[POD_ANNOTATIONS_KEY],
    `runtimeConfig "${POD_ANNOTATIONS_KEY}"`,
    CNI_CODES.INVALID_CONFIG,
  ) ?? {};
}

/**
 * The pod's choice (see the module doc for the sources and their order).
 *
 * @throws {CniError} 7 for a bad annotation or `args.cni` value, 4 for a bad `CNI_ARGS` value
 */
export function podChoice(
  config: Pick<NetworkConfig, "args" | "runtimeConfig">,
  args: CniArgs,
): PodChoice {
  const ann = annotationsOf(config);
  const known = new Set<string>(Object.values(ANNOTATIONS));
  const unknown = Object.keys(ann).filter((k) => k.startsWith("enim.dev/") && !known.has(k));
  if (unknown.length > 0) {
    throw new CniError(
      CNI_CODES.INVALID_CONFIG,
      `Unknown annotation${unknown.length > 1 ? "s" : ""} ${
        unknown.map((k) => `"${k.slice(0, 100)}"`).join(", ")
      }: enim reads ${[...known].map((k) => `"${k}"`).join(", ")}`,
    );
  }
  const cniArgsCfg = config.args?.cni as Record<string, unknown> | undefined;
  const overridden: string[] = [];
  const INVALID_CONFIG = CNI_CODES.INVALID_CONFIG, INVALID_ENV = CNI_CODES.INVALID_ENV;

  /** The first source that sets a choice; the others that set it differently are noted. */
  const pick = <T>(
    name: string,
    candidates: { source: ChoiceSource; label: string; get: () => T | undefined }[],
  ): { value: T | undefined; source: ChoiceSource } => {
    let chosen: { value: T; source: ChoiceSource; label: string } | undefined;
    for (const c of candidates) {
      const v = c.get();
      if (v === undefined) continue;
      if (!chosen) chosen = { value: v, source: c.source, label: c.label };
      else if (JSON.stringify(v) !== JSON.stringify(chosen.value)) {
        overridden.push(
          `${name}: ${chosen.label} ${JSON.stringify(chosen.value)} wins over ${c.label} ${
            JSON.stringify(v)
          }`,
        );
      }
    }
    return chosen ? chosen : { value: undefined, source: "none" };
  };

  const profile = pick<string>("profile", [
    {
      source: "annotation",
      label: ANNOTATIONS.profile,
      get: () =>
        ann[ANNOTATIONS.profile] === undefined ? undefined : parse(
          ProfileNameSchema,
          ann[ANNOTATIONS.profile],
          annotationWhere(ANNOTATIONS.profile),
          INVALID_CONFIG,
        ),
    },
    {
      source: "args.cni",
      label: "args.cni.profile",
      get: () =>
        cniArgsCfg?.profile === undefined
          ? undefined
          : parse(ProfileNameSchema, cniArgsCfg.profile, "args.cni.profile", INVALID_CONFIG),
    },
    {
      source: "CNI_ARGS",
      label: "ENIM_PROFILE",
      get: () =>
        args.ENIM_PROFILE === undefined || args.ENIM_PROFILE === ""
          ? undefined
          : parse(ProfileNameSchema, args.ENIM_PROFILE, "CNI_ARGS ENIM_PROFILE", INVALID_ENV),
    },
  ]);

  const groups = pick<string[]>("security groups", [
    {
      source: "annotation",
      label: ANNOTATIONS.securityGroupIds,
      get: () => {
        const v = ann[ANNOTATIONS.securityGroupIds];
        return v === undefined ? undefined : parse(
          GroupList,
          commaList(v),
          annotationWhere(ANNOTATIONS.securityGroupIds),
          INVALID_CONFIG,
        );
      },
    },
    {
      source: "args.cni",
      label: "args.cni.securityGroupIds",
      get: () =>
        cniArgsCfg?.securityGroupIds === undefined ? undefined : parse(
          GroupList,
          cniArgsCfg.securityGroupIds,
          "args.cni.securityGroupIds",
          INVALID_CONFIG,
        ),
    },
    {
      source: "CNI_ARGS",
      label: "ENIM_SECURITY_GROUP_IDS",
      get: () => {
        const v = args.ENIM_SECURITY_GROUP_IDS;
        return v === undefined || v === "" ? undefined : parse(
          GroupList,
          commaList(v),
          "CNI_ARGS ENIM_SECURITY_GROUP_IDS",
          INVALID_ENV,
        );
      },
    },
  ]);

  const sticky = pick<boolean>("sticky", [
    {
      source: "annotation",
      label: ANNOTATIONS.sticky,
      get: () => {
        const v = ann[ANNOTATIONS.sticky];
        return v === undefined
          ? undefined
          : parse(Bool, v, annotationWhere(ANNOTATIONS.sticky), INVALID_CONFIG) === "true";
      },
    },
    {
      source: "args.cni",
      label: "args.cni.sticky",
      get: () =>
        cniArgsCfg?.sticky === undefined
          ? undefined
          : parse(z.boolean(), cniArgsCfg.sticky, "args.cni.sticky", INVALID_CONFIG),
    },
    {
      source: "CNI_ARGS",
      label: "ENIM_STICKY",
      get: () => {
        const v = args.ENIM_STICKY;
        if (v === undefined || v === "") return undefined;
        const b = parse(
          z.enum(["true", "false", "1", "0"], "Expected true, false, 1 or 0"),
          v.toLowerCase(),
          "CNI_ARGS ENIM_STICKY",
          INVALID_ENV,
        );
        return b === "true" || b === "1";
      },
    },
  ]);

  const annotatedIps = ann[ANNOTATIONS.ip] === undefined ? undefined : parse(
    FixedIps,
    commaList(ann[ANNOTATIONS.ip]),
    annotationWhere(ANNOTATIONS.ip),
    INVALID_CONFIG,
  );
  const others = requestedIps(config, args);
  let ips: { ips: string[]; source: ChoiceSource };
  if (others.source === "runtimeConfig.ips") {
    ips = { ips: others.ips, source: "runtimeConfig.ips" };
    if (annotatedIps && JSON.stringify(annotatedIps) !== JSON.stringify(others.ips)) {
      overridden.push(
        `ips: runtimeConfig.ips ${JSON.stringify(others.ips)} wins over ${ANNOTATIONS.ip} ${
          JSON.stringify(annotatedIps)
        }`,
      );
    }
  } else if (annotatedIps) {
    ips = { ips: annotatedIps, source: "annotation" };
    if (others.source !== "none" && JSON.stringify(others.ips) !== JSON.stringify(annotatedIps)) {
      overridden.push(
        `ips: ${ANNOTATIONS.ip} ${JSON.stringify(annotatedIps)} wins over ${others.source} ${
          JSON.stringify(others.ips)
        }`,
      );
    }
  } else {
    ips = {
      ips: others.ips,
      source: others.source === "args.cni.ips"
        ? "args.cni"
        : others.source === "CNI_ARGS IP"
        ? "CNI_ARGS"
        : "none",
    };
  }

  return {
    profile: profile.value ?? DEFAULT_PROFILE,
    ...(groups.value ? { securityGroupIds: groups.value } : {}),
    ips: ips.ips,
    sticky: sticky.value ?? false,
    sources: {
      profile: profile.source,
      securityGroupIds: groups.source,
      ips: ips.source,
      sticky: sticky.source,
    },
    overridden,
  };
}
