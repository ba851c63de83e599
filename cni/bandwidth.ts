/**
 * A pod's bandwidth limits, read from the two places a runtime can carry them:
 *
 * 1. **`runtimeConfig.bandwidth`**, the CNI `bandwidth` capability
 *    (CONVENTIONS.md): `{ingressRate, ingressBurst, egressRate, egressBurst}`,
 *    rates in bits per second, bursts in bits; a rate of 0 (or absent) leaves that
 *    direction unshaped. containerd and CRI-O fill it from the pod's annotations
 *    for a plugin that declares the capability.
 * 2. **The pod annotations** `kubernetes.io/ingress-bandwidth` and
 *    `kubernetes.io/egress-bandwidth`, in kubelet's own format (a Kubernetes
 *    quantity of bits per second: `10M`, `1G`, `500k`; parsed exactly as
 *    Kubernetes does, `lib/quantity.ts`), when the runtime hands enim the pod's
 *    annotations (`io.kubernetes.cri.pod-annotations`).
 *
 * Each direction is taken from the first source that sets it: the capability,
 * then the annotation. The capability is the runtime's own explicit request in
 * the channel the CNI conventions define for it (as `runtimeConfig.ips` wins over
 * `enim.dev/ip`), and where a runtime fills both they say the same: containerd
 * derives the capability from these very annotations. A lower source that
 * disagrees is named in the call's log line.
 *
 * **Limits** (kubelet's, `validateBandwidthIsReasonable`): a rate from 1 kbit/s to
 * 1 Pbit/s; anything else, or a value of the wrong form, is refused with code 7
 * naming the source and the value, before the agent is asked for anything. Every
 * source present is checked, the overridden one too.
 *
 * **Bursts.** Kubernetes has no burst annotation, and runtimes pass a placeholder
 * when they fill the capability from the annotations: containerd `2^32−1` bits,
 * kubelet's dockershim `2^31−1`, CRI-O just under 4 GB. Taken literally that is a
 * bucket of 256–512 MB that lets the first hundreds of megabytes through unshaped
 * (kubernetes/kubernetes#90838, "Default bandwidth burst is too large"), so a burst
 * of 2^31−1 bits or more, or 0, means "none given": enim then uses 25 ms of the
 * rate (`netns/bandwidth.ts`). A smaller explicit burst is used as given, but no
 * bucket may take longer than {@linkcode MAX_BURST_SECONDS} to fill at its rate
 * (tc keeps the bucket as a 32-bit count of 64 ns ticks: 274 s).
 *
 * **Field names** are matched as Go's `encoding/json` matches them, ignoring case (an
 * exact match first): containerd 1.6's go-cni sends the capability as
 * `{"IngressRate": …, "IngressBurst": …}` (its struct has no JSON tags), which every
 * plugin written in Go reads as `ingressRate`.
 *
 * `unshapedSubnets` / `shapedSubnets` (the reference plugin's per-subnet
 * exceptions) are refused with code 2: enim shapes all of the ENI's traffic.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { parseQuantity } from "../lib/quantity.ts";
import { CNI_CODES, CniError } from "./errors.ts";
import type { NetworkConfig } from "./config.ts";
import type { Bandwidth } from "../api/schema.ts";

type ShapingLimit = NonNullable<Bandwidth["ingress"]>;

/** The pod annotations kubelet defines for bandwidth (bits per second). */
export const BANDWIDTH_ANNOTATIONS = {
  ingress: "kubernetes.io/ingress-bandwidth",
  egress: "kubernetes.io/egress-bandwidth",
} as const;

/** The lowest rate kubelet accepts: 1 kbit/s. */
export const MIN_RATE = 1_000;
/** The highest rate kubelet accepts: 1 Pbit/s. */
export const MAX_RATE = 1_000_000_000_000_000;
/** A burst at or above this (bits) is a runtime's "no burst given" placeholder. */
export const PLACEHOLDER_BURST = 2 ** 31 - 1;
/** The longest a bucket may take to fill at its rate. */
export const MAX_BURST_SECONDS = 250;

const Bits = z.number().check(z.int("Expected a whole number"), z.nonnegative());

/** `runtimeConfig.bandwidth`: the CNI `bandwidth` capability. */
export const BandwidthCapabilitySchema = z.looseObject({
  ingressRate: z.optional(Bits),
  ingressBurst: z.optional(Bits),
  egressRate: z.optional(Bits),
  egressBurst: z.optional(Bits),
  unshapedSubnets: z.optional(z.nullable(z.array(z.string()))),
  shapedSubnets: z.optional(z.nullable(z.array(z.string()))),
});

/** Whether `b` limits either direction. */
export function limitsAny(b: Bandwidth): boolean {
  return b.ingress !== undefined || b.egress !== undefined;
}

const FIELDS = [
  "ingressRate",
  "ingressBurst",
  "egressRate",
  "egressBurst",
  "unshapedSubnets",
  "shapedSubnets",
] as const;

/**
 * The capability's object with its field names as Go would match them: a key that
 * differs from a field only in case (`IngressRate`) counts as that field, unless the
 * exact name is there too.
 */
function goFieldNames(raw: unknown): unknown {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return raw;
  const out: Record<string, unknown> = { ...raw };
  for (const [k, v] of Object.entries(raw)) {
    const field = FIELDS.find((f) => f !== k && f.toLowerCase() === k.toLowerCase());
    if (field && !(field in raw)) {
      out[field] = v;
      delete out[k];
    }
  }
  return out;
}

/** What {@linkcode podBandwidth} found. */
export interface PodBandwidth {
  /** What to shape; empty when nothing is. */
  shaping: Bandwidth;
  /** Lower-precedence values that were overridden, for the log. */
  overridden: string[];
}

type Direction = "ingress" | "egress";

const invalid = (msg: string) => new CniError(CNI_CODES.INVALID_CONFIG, msg);

/** Why a rate (bits per second) is out of kubelet's range, or undefined when it is in it. */
function rateProblem(rate: number | bigint): string | undefined {
  if (rate < MIN_RATE) return `${rate} bit/s is below the smallest rate, 1 kbit/s ("1k")`;
  if (rate > MAX_RATE) return `${rate} bit/s is above the largest rate, 1 Pbit/s ("1P")`;
  return undefined;
}

/** One direction of the capability, or undefined when it leaves it unshaped. */
function fromCapability(
  cap: z.infer<typeof BandwidthCapabilitySchema>,
  dir: Direction,
): ShapingLimit | undefined {
  const rate = cap[`${dir}Rate`] ?? 0, burst = cap[`${dir}Burst`] ?? 0;
  const where = `runtimeConfig.bandwidth.${dir}`;
  if (rate === 0) {
    if (burst !== 0) {
      throw invalid(`Invalid ${where}Burst ${burst}: a burst needs a rate (${where}Rate)`);
    }
    return undefined;
  }
  const bad = rateProblem(rate);
  if (bad) throw invalid(`Invalid ${where}Rate ${rate}: ${bad}`);
  if (burst === 0 || burst >= PLACEHOLDER_BURST) return { rate };
  if (burst / rate > MAX_BURST_SECONDS) {
    throw invalid(
      `Invalid ${where}Burst ${burst}: at ${rate} bit/s the bucket would take ${
        Math.round(burst / rate)
      } s to fill; at most ${MAX_BURST_SECONDS} s`,
    );
  }
  return { rate, burst };
}

/** One direction's annotation, or undefined when absent. */
function fromAnnotation(ann: Record<string, string>, dir: Direction): ShapingLimit | undefined {
  const key = BANDWIDTH_ANNOTATIONS[dir];
  const text = ann[key];
  if (text === undefined) return undefined;
  const shown = JSON.stringify(text.slice(0, 100));
  const q = parseQuantity(text);
  if (!q.ok) {
    throw invalid(`Invalid annotation "${key}" ${shown}: ${q.reason}`);
  }
  const bad = rateProblem(q.value);
  if (bad) throw invalid(`Invalid annotation "${key}" ${shown}: ${bad}`);
  return { rate: Number(q.value) };
}

/**
 * The pod's bandwidth limits (see the module doc for the sources and their order).
 * `annotations` are the pod's, already parsed by `cni/selection.ts`.
 *
 * @throws {CniError} 7 for a value of the wrong form or out of range, 2 for subnet exceptions
 */
export function podBandwidth(
  config: Pick<NetworkConfig, "runtimeConfig">,
  annotations: Record<string, string>,
): PodBandwidth {
  const raw = goFieldNames(config.runtimeConfig?.bandwidth);
  let cap: z.infer<typeof BandwidthCapabilitySchema> | undefined;
  if (raw !== undefined && raw !== null) {
    const r = BandwidthCapabilitySchema.safeParse(raw);
    if (!r.success) {
      const i = r.error.issues[0];
      const field = i.path.length > 0 ? `.${i.path.join(".")}` : "";
      const value = i.path.length > 0 ? (raw as Record<PropertyKey, unknown>)[i.path[0]] : raw;
      throw invalid(
        `Invalid runtimeConfig.bandwidth${field} ${
          JSON.stringify(value)?.slice(0, 100)
        }: ${i.message} (rates in bits per second, bursts in bits)`,
      );
    }
    cap = r.data;
    for (const k of ["unshapedSubnets", "shapedSubnets"] as const) {
      if ((cap[k]?.length ?? 0) > 0) {
        throw new CniError(
          CNI_CODES.UNSUPPORTED_FIELD,
          `Unsupported field "runtimeConfig.bandwidth.${k}": enim shapes all of the ENI's traffic`,
        );
      }
    }
  }
  const shaping: Bandwidth = {};
  const overridden: string[] = [];
  for (const dir of ["ingress", "egress"] as const) {
    const fromCap = cap ? fromCapability(cap, dir) : undefined;
    const fromAnn = fromAnnotation(annotations, dir);
    const chosen = fromCap ?? fromAnn;
    if (chosen) shaping[dir] = chosen;
    if (fromCap && fromAnn && fromCap.rate !== fromAnn.rate) {
      overridden.push(
        `${dir} bandwidth: runtimeConfig.bandwidth ${fromCap.rate} bit/s wins over ${
          BANDWIDTH_ANNOTATIONS[dir]
        } ${fromAnn.rate} bit/s`,
      );
    }
  }
  return { shaping, overridden };
}
