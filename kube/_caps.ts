/**
 * What a pod's containers may do to its network namespace beyond its NetworkPolicy (issue
 * 48): the `securityContext` parts a Pod keeps (`kube/objects.ts`), and whether the pod
 * holds `NET_RAW` and `NET_ADMIN` (`agent/policy/_raw.ts` reads them).
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";

/** `v1.SecurityContext` of a container, the parts that say what it may do to its network. */
export const SecurityContextSchema = z.object({
  privileged: z.optional(z.nullable(z.boolean())),
  capabilities: z.optional(z.nullable(z.object({
    add: z.optional(z.nullable(z.array(z.string()))),
    drop: z.optional(z.nullable(z.array(z.string()))),
  }))),
});

/** A container's `securityContext`, as kept. */
export type SecurityContext = z.infer<typeof SecurityContextSchema>;

/**
 * Whether a pod's containers hold a capability: `yes` (one is privileged or adds it, or
 * `ALL`), `no` (every container drops it, or `ALL`), `default` (one neither adds nor drops
 * it: it holds it when the runtime's default set has it; containerd's has `NET_RAW`,
 * CRI-O's not).
 */
export type CapHolding = "yes" | "no" | "default";

/** What a pod's containers hold of the two capabilities that reach past its policy. */
export interface NetCaps {
  /** `CAP_NET_RAW`: packet sockets. */
  raw: CapHolding;
  /** `CAP_NET_ADMIN`: the pod's own nftables tables. */
  admin: CapHolding;
}

/** A capability's name as Kubernetes and the runtimes take it (`net_raw`, `CAP_NET_RAW`). */
const capName = (c: string) => c.toUpperCase().replace(/^CAP_/, "");

/** The frozen {@linkcode NetCaps} of each combination: most pods share a few. */
const NET_CAPS = new Map<string, NetCaps>();

/** What a pod's containers (`securityContext` each, as the API sends it) hold, shared frozen. */
export function netCapsOf(containers: { securityContext?: SecurityContext | null }[]): NetCaps {
  const holding = (cap: string): CapHolding => {
    let out: CapHolding = "no";
    for (const c of containers) {
      const sc = c.securityContext;
      const add = (sc?.capabilities?.add ?? []).map(capName);
      const drop = (sc?.capabilities?.drop ?? []).map(capName);
      if (sc?.privileged || add.includes(cap) || add.includes("ALL")) return "yes";
      if (!drop.includes(cap) && !drop.includes("ALL")) out = "default";
    }
    return out;
  };
  const raw = holding("NET_RAW"), admin = holding("NET_ADMIN");
  const key = `${raw}/${admin}`;
  let caps = NET_CAPS.get(key);
  if (!caps) NET_CAPS.set(key, caps = Object.freeze({ raw, admin }));
  return caps;
}

/**
 * Whether a pod holds `NET_RAW` and `NET_ADMIN`, given the runtime's default set
 * (`defaults`, capability names as Kubernetes writes them).
 */
export function podHolds(
  caps: NetCaps,
  defaults: readonly string[],
): { netRaw: boolean; netAdmin: boolean } {
  const d = new Set(defaults.map(capName));
  const held = (h: CapHolding, cap: string) => h === "yes" || (h === "default" && d.has(cap));
  return { netRaw: held(caps.raw, "NET_RAW"), netAdmin: held(caps.admin, "NET_ADMIN") };
}
