/**
 * The node's routes to its pods, kept (issue 33 item 12). Each host link gives the node
 * a host route to each of the pod's addresses over its node end, with the node's
 * primary address as the preferred source, and a permanent neighbour entry. When that
 * address leaves the node (`netplan apply`, a DHCP client that drops and re-adds it,
 * an operator's `ip addr del`), the kernel deletes every IPv4 route that names it as
 * source and strips it from the IPv6 ones, and nothing brings them back when the
 * address returns: kubelet's probes and hostPorts to running pods stop.
 *
 * How it is noticed: the agent watches the node's addresses (`ip -o monitor address`,
 * one long-lived child; `DeviceLayer.watchNodeAddresses`) and, shortly after a global
 * address came or went, compares every ready attachment's node routes and neighbours
 * with the kernel's (one listing) and sets again those that differ (one batch, under
 * the locks of the attachments it repairs). Chosen over a periodic re-check because
 * the routes come back within a fraction of a second of the address, where a probe
 * fails after seconds (kubelet's default: 3 failures 10 s apart restart a container),
 * and it costs nothing while the node's addresses do not change; ADD and DEL are
 * untouched. Because a watch can miss what happened while it was down, a pass also
 * runs when the watch (re)starts, and on every GC pass (one listing, only while some
 * attachment has a host link). Renewals of an address it knows (DHCP, router
 * advertisements refreshing lifetimes) trigger nothing.
 *
 * The source is the node's primary address now (listed again after a change), so a
 * node whose address changed gets routes from its new one; the node's address cache
 * that ADD uses is dropped at each change too, so an ADD right after it does not name
 * a source that is gone.
 *
 * @module
 */
import { AddResponseSchema } from "../api/schema.ts";
import { normalizeIp } from "../lib/ip.ts";
import type { Logger } from "../lib/log.ts";
import { userMessage } from "../lib/message.ts";
import type {
  AddressEvent,
  AddressWatch,
  DeviceLayer,
  HostLinkNodeSide,
  HostLinkNodeState,
  NodeAddresses,
} from "../netns/types.ts";
import { KUBE_IPVS_LINK } from "../netns/types.ts";
import { keyOf } from "../providers/schema.ts";
import type { HostLinks } from "./host_link.ts";
import { linkMacs } from "./host_link.ts";
import type { KeyedMutex } from "./mutex.ts";
import { type AttachmentRow, hostLinkOf, type StateStore } from "./state.ts";

/** One attachment's node side as it should be. */
export interface WantedNodeSide {
  /** The attachment key (`containerId/ifName`). */
  key: string;
  side: HostLinkNodeSide;
}

/** The states whose host link exists: what a ready pod and an older container of it have. */
const LINKED: AttachmentRow["state"][] = ["ready", "recycling"];

/**
 * What the node side of each attachment with a host link should be: its node end, the
 * pod's addresses (from the answered result), the pod end's MAC, and the node's primary
 * address per family as source.
 */
export function wantedNodeSides(
  rows: AttachmentRow[],
  primary: NodeAddresses["primary"],
): WantedNodeSide[] {
  const out: WantedNodeSide[] = [];
  for (const r of rows) {
    if (!LINKED.includes(r.state) || r.result === null) continue;
    const link = hostLinkOf(r);
    if (!link) continue;
    const parsed = AddResponseSchema.safeParse(JSON.parse(r.result));
    if (!parsed.success) continue;
    const podAddresses: HostLinkNodeSide["podAddresses"] = {};
    for (const ip of parsed.data.ips) {
      const a = normalizeIp(ip.address.split("/")[0]);
      if (a.includes(":")) podAddresses.ipv6 ??= a;
      else podAddresses.ipv4 ??= a;
    }
    out.push({
      key: keyOf(r),
      side: {
        nodeIfName: link.nodeIfName,
        podMac: (parsed.data.hostLink?.podMac ?? linkMacs(r).podMac).toLowerCase(),
        podAddresses,
        nodeSource: { ...primary },
      },
    });
  }
  return out;
}

/**
 * The wanted node sides the kernel does not have whole: a route missing, over another
 * link, or without the source wanted (the kernel strips it); a neighbour missing or at
 * another MAC. A side whose node end is gone is left out (CHECK reports it; only a new
 * ADD makes the link again).
 */
export function nodeSidesToRepair(
  wanted: WantedNodeSide[],
  live: HostLinkNodeState,
): WantedNodeSide[] {
  const ends = new Set(live.nodeEnds);
  const route = new Map(
    live.routes.map((r) => [`${r.dev} ${normalizeIp(r.dst.split("/")[0])}`, r]),
  );
  const neigh = new Map(live.neighbours.map((n) => [`${n.dev} ${normalizeIp(n.dst)}`, n]));
  return wanted.filter(({ side }) => {
    if (!ends.has(side.nodeIfName)) return false;
    for (const fam of ["ipv4", "ipv6"] as const) {
      const addr = side.podAddresses[fam];
      if (!addr) continue;
      const at = `${side.nodeIfName} ${addr}`;
      const r = route.get(at);
      const src = side.nodeSource[fam];
      if (!r || (src !== undefined && normalizeIp(r.prefsrc ?? "") !== normalizeIp(src))) {
        return true;
      }
      if (neigh.get(at)?.lladdr !== side.podMac) return true;
    }
    return false;
  });
}

/** What {@linkcode NodeRouteKeeper} works with: the manager's shared parts it needs. */
export interface KeeperContext {
  readonly state: Pick<StateStore, "all">;
  readonly devices: Pick<
    DeviceLayer,
    "hostLinkNodeState" | "restoreHostLinkNodeSide" | "watchNodeAddresses"
  >;
  readonly locks: KeyedMutex;
  readonly log: Logger;
  readonly hostLinks: Pick<HostLinks, "nodeAddresses" | "forgetNodeAddresses">;
}

/** Timings of {@linkcode NodeRouteKeeper} (tests shorten them). */
export interface KeeperOptions {
  /** How long after the last address change a pass starts (changes come in bursts). */
  settleMs?: number;
  /** The first wait before a watch that ended is started again (doubling up to a minute). */
  restartMs?: number;
}

/**
 * Restores the node's routes to its pods after the node's addresses changed: the
 * address watch, the passes it triggers (one at a time, one more when asked during
 * one), and the pass GC runs.
 */
export class NodeRouteKeeper {
  readonly #ctx: KeeperContext;
  readonly #settleMs: number;
  readonly #restartMs: number;
  /** The node's global addresses seen by the watch (a renewal of one is no change). */
  readonly #known = new Set<string>();
  #watch: AddressWatch | null = null;
  #closed = false;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #running: Promise<void> | null = null;
  #again = false;
  #restartTimer: ReturnType<typeof setTimeout> | undefined;
  #backoff: number;

  constructor(ctx: KeeperContext, opts: KeeperOptions = {}) {
    this.#ctx = ctx;
    this.#settleMs = opts.settleMs ?? 200;
    this.#restartMs = opts.restartMs ?? 1_000;
    this.#backoff = this.#restartMs;
  }

  /** Starts watching the node's addresses (when the device layer can); idempotent. */
  start(): void {
    if (this.#closed || this.#watch || !this.#ctx.devices.watchNodeAddresses) return;
    const started = performance.now();
    const watch = this.#ctx.devices.watchNodeAddresses((e) => this.#event(e));
    this.#watch = watch;
    // What changed while no watch ran (the agent was down, the watch restarted).
    this.request();
    watch.ended.then((why) => {
      if (this.#watch !== watch || this.#closed) return;
      this.#watch = null;
      // A watch that ran a while had no trouble starting: begin the backoff again.
      if (performance.now() - started > 60_000) this.#backoff = this.#restartMs;
      this.#ctx.log.warn("The watch of the node's addresses ended; starting it again", {
        reason: why,
        inMs: this.#backoff,
      });
      this.#restartTimer = setTimeout(() => this.start(), this.#backoff);
      this.#backoff = Math.min(this.#backoff * 2, 60_000);
    });
  }

  #event(e: AddressEvent): void {
    // kube-ipvs0's addresses are kube-proxy's ClusterIPs (IPVS mode), not the node's.
    if (e.scope !== "global" || e.ifName === KUBE_IPVS_LINK) return;
    const id = `${e.ifName} ${e.address}`;
    if (e.deleted) this.#known.delete(id);
    else if (this.#known.has(id)) return;
    else this.#known.add(id);
    this.#ctx.log.debug("The node's addresses changed", { ...e });
    // ADD must not name a source that is gone: the next one lists them again.
    this.#ctx.hostLinks.forgetNodeAddresses();
    this.request();
  }

  /** Asks for a pass once changes have settled (one more if one is running). */
  request(): void {
    if (this.#closed) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.pass().catch(() => {});
    }, this.#settleMs);
  }

  /**
   * One pass: repairs every attachment's node side that differs from what it should be.
   * Passes run one at a time; a pass asked for while one runs runs after it. Returns how
   * many attachments were repaired. Never throws for a device failure: it logs it.
   */
  async pass(): Promise<number> {
    if (this.#running) {
      this.#again = true;
      await this.#running;
      return 0;
    }
    let repaired = 0;
    const run = (async () => {
      do {
        this.#again = false;
        repaired += await this.#passOnce();
      } while (this.#again && !this.#closed);
    })();
    this.#running = run;
    try {
      await run;
    } finally {
      this.#running = null;
    }
    return repaired;
  }

  async #passOnce(): Promise<number> {
    const { state, devices, locks, log, hostLinks } = this.#ctx;
    if (!devices.hostLinkNodeState || !devices.restoreHostLinkNodeSide) return 0;
    if (!state.all().some((r) => LINKED.includes(r.state) && hostLinkOf(r) !== null)) return 0;
    try {
      hostLinks.forgetNodeAddresses();
      const { primary } = await hostLinks.nodeAddresses();
      const live = await devices.hostLinkNodeState();
      const broken = nodeSidesToRepair(wantedNodeSides(state.all(), primary), live);
      if (broken.length === 0) return 0;
      return await locks.runAll(broken.map((b) => `att:${b.key}`), async () => {
        // Under the locks: a DEL or a new ADD of one of them may have run meanwhile.
        const now = new Map(wantedNodeSides(state.all(), primary).map((w) => [w.key, w]));
        const still = broken.filter((b) => now.get(b.key)?.side.nodeIfName === b.side.nodeIfName);
        if (still.length === 0) return 0;
        const failed = await devices.restoreHostLinkNodeSide!(still.map((s) => s.side));
        log.info("Restored the node's routes to pods after the node's addresses changed", {
          attachments: still.map((s) => s.key),
          source: primary,
          ...(failed.length > 0 ? { failed } : {}),
        });
        return still.length;
      });
    } catch (err) {
      log.error("Cannot restore the node's routes to pods", { error: userMessage(err) });
      return 0;
    }
  }

  /** Stops the watch (by its child's PID) and waits for a running pass. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    clearTimeout(this.#restartTimer);
    const watch = this.#watch;
    this.#watch = null;
    await watch?.close();
    await this.#running;
  }
}
