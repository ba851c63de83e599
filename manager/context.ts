/**
 * What the manager's parts share: the stores, the provider, the device layer, the
 * locks and the clock. Each operation's module (add.ts, release.ts, reconcile.ts,
 * status.ts, check.ts) is a set of functions over it; `manager.ts` builds it once
 * and orchestrates.
 *
 * @module
 */
import type { Owner, Provider } from "../providers/contract.ts";
import type { DeviceLayer } from "../netns/types.ts";
import type { Logger } from "../lib/log.ts";
import type { PhaseRecorder } from "../lib/metrics.ts";
import { userMessage } from "../lib/message.ts";
import type { ApiError } from "../api/schema.ts";
import type { AttachmentRow, StateStore } from "./state.ts";
import type { KeyedMutex } from "./mutex.ts";
import type { Describer, DescriptionRecorder } from "./descriptions.ts";
import type { AddAnswered } from "./gc.ts";
import type { HostLinks } from "./host_link.ts";
import type { PolicyHook } from "./types.ts";

/** The manager's shared parts. */
export interface ManagerContext {
  readonly state: StateStore;
  readonly provider: Provider;
  readonly devices: DeviceLayer;
  readonly log: Logger;
  /**
   * Serializes operations on one attachment (`att:<containerId>/<ifName>`) and one ENI
   * (`eni:<id>`), always taken in that order.
   */
  readonly locks: KeyedMutex;
  /** The clock, epoch milliseconds. */
  readonly now: () => number;
  readonly metrics: (PhaseRecorder & Partial<DescriptionRecorder>) | undefined;
  /** Sets ENI descriptions in the cloud after the fact; null when they are off. */
  readonly describer: Describer | null;
  /** How long a sticky pod's ENI is held after its DEL. */
  readonly holdMs: number;
  /** Maps what a step threw to the error a client sees (naming the state's path). */
  apiError(err: unknown): ApiError;
  /**
   * When an ADD last answered success for each attachment key, retries from the record
   * included: a GC pass asked for before it works from older facts than the runtime's,
   * and leaves that attachment alone; a CNI GC's list alone does not take it within the
   * grace period. Dropped at release.
   */
  readonly addAnswered: Map<string, AddAnswered>;
  /** The host links' upkeep: the node's addresses, its nftables table, warnings. */
  readonly hostLinks: HostLinks;
  /** NetworkPolicy enforcement (`policy.ts`); null when it is off. */
  readonly policy: PolicyHook | null;
  /** Aborted when the manager closes: waits that may end early do (a freed ENI's reuse wait). */
  readonly stopping: AbortSignal;
  /**
   * How long, in all, an ADD that finds no free ENI waits for the DELs of `releasing`
   * (add.ts `allocate`; `timeouts.delWaitSeconds`).
   */
  readonly delWaitMs: number;
  /**
   * DELs that have answered and are still bringing their device home (release.ts), by
   * attachment key: the pod's namespace path and the rest (it never rejects). An ADD in
   * that namespace, or one that needs their ENI, waits for them, so a DEL then an ADD
   * finds the ENI free and the names unused; a second DEL of the key answers at once.
   * `answeredAt` (the clock) and `answeredMono` (`performance.now()`): when it answered.
   */
  readonly releasing: Map<
    string,
    { netns: string; rest: Promise<void>; answeredAt: number; answeredMono: number }
  >;
}

/** The provider-level owner of an attachment row. */
export const ownerOf = (r: AttachmentRow): Owner => ({
  pod: r.pod,
  containerId: r.containerId,
  ifName: r.ifName,
});

/** An error's message for a user (no runtime hints). */
export const message = userMessage;

/**
 * The node hold of a zone-scoped profile, in ms (null: node scope, or a provider
 * that cannot park): how long a sticky pod's ENI stays on the node before it is
 * parked in the VPC.
 */
export function zoneHoldMs(ctx: ManagerContext, profile: string): number | null {
  if (!ctx.provider.parkENI) return null;
  const p = ctx.provider.profiles().find((x) => x.name === profile);
  return p?.sticky?.scope === "zone" ? p.sticky.nodeHoldSeconds * 1000 : null;
}
