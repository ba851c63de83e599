/**
 * Bandwidth shaping of a pod's ENI, by enim itself: the device is the pod's `eth0`
 * and its traffic never crosses a node-side veth, so the reference `bandwidth`
 * plugin (which shapes the host end of a veth) cannot shape it. Everything happens
 * in the pod's network namespace:
 *
 * - **egress** (out of the pod): a token bucket filter (`tbf`) as the root qdisc of
 *   the interface;
 * - **ingress** (into the pod): an `ingress` qdisc on the interface whose one `u32`
 *   filter (matching every packet) redirects to an `ifb` device, named after the
 *   ENI's MAC (`ifb` + 12 hex digits), whose root qdisc is a `tbf`. The ifb sends the
 *   packets on into the pod's stack at the shaped rate.
 *
 * Why ifb and tbf rather than a `police` action on ingress: a policer has no queue,
 * it drops whatever exceeds the bucket at once, and TCP reads each burst of drops as
 * congestion and backs off well below the rate (and this kernel has no `act_police`
 * built in at all). The tbf on the ifb queues up to {@linkcode LATENCY_MS} of traffic
 * instead, so TCP converges on the rate as it does on the egress side. `matchall`
 * would be the natural classifier but `cls_matchall` is not built into every kernel
 * either; `u32 match u32 0 0` matches every packet everywhere.
 *
 * This module is pure: names, the `ip` and `tc` lines, and how the live qdiscs are
 * compared with what was installed. `./mod.ts` runs them (`ip` through `./ip.ts`,
 * `tc` through `./tc.ts`).
 *
 * Kernel behaviour this relies on (6.18, measured): moving a device to another
 * namespace drops its qdiscs and filters (`dev_shutdown`), so a device that comes
 * back to the node, by a DEL or because its namespace was deleted, carries none;
 * an ifb dies with the namespace it is in.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";

/** One direction's limit: `rate` in bits per second, `burst` (the bucket) in bits. */
export interface ShapingLimit {
  rate: number;
  /** Absent: {@linkcode DEFAULT_BURST_MS} of the rate. */
  burst?: number;
}

/**
 * What to shape: `ingress` is traffic into the pod (arriving on its ENI), `egress`
 * traffic out of it, as the CNI `bandwidth` capability and the Kubernetes
 * annotations name them.
 */
export interface Shaping {
  ingress?: ShapingLimit;
  egress?: ShapingLimit;
}

/** What was installed: every burst resolved. */
export interface InstalledShaping {
  ingress?: Required<ShapingLimit>;
  egress?: Required<ShapingLimit>;
}

/** How long traffic may wait in a tbf's queue before it is dropped (as the reference plugin). */
export const LATENCY_MS = 25;
/** The default bucket: this many milliseconds of the rate. */
export const DEFAULT_BURST_MS = 25;
/** Ethernet header and one VLAN tag: a frame is this much longer than the MTU. */
const FRAME_OVERHEAD = 18;

/** The ifb device that shapes the ingress of the ENI with `mac` (15 bytes, unique per ENI). */
export function ifbName(mac: string): string {
  return `ifb${mac.trim().toLowerCase().replaceAll(":", "")}`;
}

/**
 * The bucket actually installed for `limit` on a device of `mtu`, in bits: the
 * requested burst, or {@linkcode DEFAULT_BURST_MS} of the rate, and never less than
 * one full frame (tbf drops a frame larger than its bucket).
 */
export function effectiveBurst(limit: ShapingLimit, mtu: number): number {
  const wanted = limit.burst ?? Math.ceil(limit.rate * DEFAULT_BURST_MS / 1000);
  return 8 * Math.max(Math.ceil(wanted / 8), mtu + FRAME_OVERHEAD);
}

/** Every burst resolved for a device of `mtu`. */
export function installedShaping(s: Shaping, mtu: number): InstalledShaping {
  const one = (l: ShapingLimit | undefined) =>
    l ? { rate: l.rate, burst: effectiveBurst(l, mtu) } : undefined;
  const ingress = one(s.ingress), egress = one(s.egress);
  return { ...(ingress ? { ingress } : {}), ...(egress ? { egress } : {}) };
}

/** Whether anything is shaped. */
export function isShaped(s: Shaping | undefined): s is Shaping {
  return s?.ingress !== undefined || s?.egress !== undefined;
}

/**
 * The `ip` lines (run in the pod, in the configure batch) that create the ifb for
 * ingress shaping; none when ingress is not shaped.
 */
export function shapingLinkCommands(mac: string, s: Shaping | undefined): string[][] {
  if (!s?.ingress) return [];
  const ifb = ifbName(mac);
  return [["link", "add", "dev", ifb, "type", "ifb"], ["link", "set", "dev", ifb, "up"]];
}

/** Words of one command line (the device names are checked interface names: no spaces). */
const words = (line: string) => line.split(" ");

function tbf(dev: string, l: Required<ShapingLimit>): string[] {
  return words(
    `qdisc add dev ${dev} root handle 1: tbf rate ${l.rate}bit burst ${
      l.burst / 8
    } latency ${LATENCY_MS}ms`,
  );
}

/** The `tc` lines (one `tc -batch` in the pod) that shape `ifName`. */
export function shapingTcCommands(ifName: string, mac: string, s: InstalledShaping): string[][] {
  const lines: string[][] = [];
  if (s.egress) lines.push(tbf(ifName, s.egress));
  if (s.ingress) {
    const ifb = ifbName(mac);
    lines.push(
      words(`qdisc add dev ${ifName} handle ffff: ingress`),
      // Every packet (u32 matching 0 under mask 0) to the ifb, whose tbf shapes it.
      words(
        `filter add dev ${ifName} parent ffff: protocol all prio 1 u32 match u32 0 0 ` +
          `action mirred egress redirect dev ${ifb}`,
      ),
      tbf(ifb, s.ingress),
    );
  }
  return lines;
}

/** The `tc` lines whose JSON output {@linkcode shapingProblems} reads. */
export function inspectTcCommands(ifName: string): string[][] {
  return [["qdisc", "show"], ["filter", "show", "dev", ifName, "ingress"]];
}

/** A qdisc as `tc -j qdisc show` reports it (the fields enim reads). */
export const QdiscSchema = z.looseObject({
  kind: z.string(),
  handle: z.optional(z.string()),
  dev: z.optional(z.string()),
  root: z.optional(z.boolean()),
  options: z.optional(z.looseObject({
    /** Bytes per second. */
    rate: z.optional(z.number()),
    /** Bytes, as tc computes it back from the kernel's time-based bucket. */
    burst: z.optional(z.number()),
  })),
});
/** A qdisc of `tc -j qdisc show`. */
export type Qdisc = z.infer<typeof QdiscSchema>;

/** A filter as `tc -j filter show` reports it (the fields enim reads). */
export const FilterSchema = z.looseObject({
  kind: z.optional(z.string()),
  options: z.optional(z.looseObject({
    actions: z.optional(z.array(z.looseObject({
      kind: z.string(),
      mirred_action: z.optional(z.string()),
      to_dev: z.optional(z.string()),
    }))),
  })),
});
/** A filter of `tc -j filter show`. */
export type Filter = z.infer<typeof FilterSchema>;

/** What CHECK reads back from the pod: every qdisc of the namespace, the interface's ingress filters. */
export interface LiveShaping {
  qdiscs: Qdisc[];
  filters: Filter[];
}

/**
 * The differences between the shaping installed at ADD and the pod's qdiscs now;
 * empty when they match. A rate must match to the byte per second (tc keeps
 * `rate / 8`, rounded down); the burst tc reports is computed back from the
 * kernel's time-based bucket, so it is compared within 1% (and within what 2 µs
 * of the rate carries, the rounding of that computation at high rates).
 */
export function shapingProblems(
  want: InstalledShaping,
  live: LiveShaping,
  where: { ifName: string; netns: string; mac: string },
): string[] {
  const problems: string[] = [];
  const name = `Interface "${where.ifName}" in "${where.netns}"`;
  const check = (dev: string, l: Required<ShapingLimit>, what: string) => {
    const q = live.qdiscs.find((q) => q.dev === dev && q.root === true);
    const rate = Math.floor(l.rate / 8), burst = l.burst / 8;
    if (q?.kind !== "tbf") {
      problems.push(
        `${name} lacks its ${what} shaping: no tbf at ${l.rate} bit/s on "${dev}" (found ${
          q ? q.kind : "no root qdisc"
        })`,
      );
      return;
    }
    const shownRate = q.options?.rate, shownBurst = q.options?.burst ?? -1;
    if (shownRate !== rate) {
      problems.push(
        `${name} has ${what} shaping at ${
          shownRate === undefined ? "an unknown rate" : `${shownRate * 8} bit/s`
        }, not ${l.rate} bit/s`,
      );
    }
    const slack = Math.max(burst / 100, rate * 2e-6) + 1;
    if (Math.abs(shownBurst - burst) > slack) {
      problems.push(
        `${name} has an ${what} bucket of ${shownBurst} bytes, not ${burst} bytes`,
      );
    }
  };
  if (want.egress) check(where.ifName, want.egress, "egress");
  if (want.ingress) {
    const ifb = ifbName(where.mac);
    const ingressQdisc = live.qdiscs.some((q) => q.dev === where.ifName && q.kind === "ingress");
    const redirect = live.filters.some((f) =>
      f.options?.actions?.some((a) =>
        a.kind === "mirred" && a.mirred_action === "redirect" && a.to_dev === ifb
      )
    );
    if (!ingressQdisc || !redirect) {
      problems.push(
        `${name} lacks its ingress shaping: ${
          ingressQdisc ? "no filter redirects" : "no ingress qdisc redirects"
        } its traffic to "${ifb}"`,
      );
    } else check(ifb, want.ingress, "ingress");
  }
  return problems;
}

/**
 * What `tc -j` shows for `installed` on `ifName` (the fake device layer's view of a
 * shaped pod; {@linkcode shapingProblems} finds nothing in it).
 */
export function liveShapingOf(
  ifName: string,
  mac: string,
  installed: InstalledShaping,
): LiveShaping {
  const tbfQdisc = (dev: string, l: Required<ShapingLimit>): Qdisc => ({
    kind: "tbf",
    handle: "1:",
    dev,
    root: true,
    options: { rate: Math.floor(l.rate / 8), burst: l.burst / 8 },
  });
  const qdiscs: Qdisc[] = [];
  const filters: Filter[] = [];
  if (installed.egress) qdiscs.push(tbfQdisc(ifName, installed.egress));
  if (installed.ingress) {
    const ifb = ifbName(mac);
    qdiscs.push(
      { kind: "ingress", handle: "ffff:", dev: ifName },
      tbfQdisc(ifb, installed.ingress),
    );
    filters.push({
      kind: "u32",
      options: { actions: [{ kind: "mirred", mirred_action: "redirect", to_dev: ifb }] },
    });
  }
  return { qdiscs, filters };
}
