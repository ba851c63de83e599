/**
 * What the next ADDs can get, as the device plugin advertises it: the provider's
 * slots for pods (`Provider.capacity()`: the limit less the ENIs that are not enim's,
 * the quarantined ones and those being parked) less the ENIs that attachments take
 * without kubelet counting an `enim.dev/eni` device for them.
 *
 * kubelet counts one device per pod that asks for one (the admission policy adds the
 * request), from its admission until the pod is gone; the scheduler places a pod only
 * while the node's healthy devices exceed the devices pods hold. So every ENI taken
 * by something kubelet does not count must be taken off the healthy devices, or the
 * scheduler places a pod the node cannot serve (its ADD fails with code 100):
 *
 * - `sticky_hold`: a sticky pod's ENI held after its DEL (up to `stickyHoldSeconds`,
 *   or the node hold of a zone profile): kubelet freed the pod's device at its delete;
 * - `no_device`: an attachment of a pod kubelet gives no device (a namespace without
 *   the admission policy, podman, a pod whose plugin calls enim in IPAM mode without
 *   the request), a pod's second interface, an older container's ENI still recycling,
 *   one being released after its DEL.
 *
 * Which pods hold devices comes from kubelet's pod-resources API (`podresources.ts`).
 * A pod's devices cover its live attachments (adding, ready) first, then a sticky
 * hold it will take back (a re-created sticky pod admitted before its ADD), then its
 * older ones. When kubelet cannot be asked, each pod with a live attachment is taken
 * to hold one device (what the admission policy gives it) and the capacity says so
 * (`note`): attachments of pods without the request are then not subtracted.
 *
 * @module
 */
import type { AttachmentState } from "../../api/schema.ts";
import type { CapacityHold, NodeCapacity } from "../../providers/contract.ts";

/** An attachment as the accounting sees it: whose it is and what state it is in. */
export interface Consumer {
  /** The pod, `namespace/name`. */
  pod: string;
  state: AttachmentState;
}

/**
 * The order in which a pod's devices cover its attachments (lower first): its live
 * ones, then a hold it will take back, then an older container's or one being released.
 */
const COVER_ORDER: Record<AttachmentState, number> = {
  adding: 0,
  ready: 0,
  held: 1,
  recycling: 2,
  deleting: 2,
};

/**
 * The slots attachments take that kubelet counts no device for, by reason (see the
 * module doc). `devices` maps a pod to the number of `enim.dev/eni` devices kubelet
 * gave it; null when kubelet could not be asked.
 */
export function uncountedConsumers(
  consumers: readonly Consumer[],
  devices: ReadonlyMap<string, number> | null,
): CapacityHold[] {
  const byPod = new Map<string, Consumer[]>();
  for (const c of consumers) byPod.set(c.pod, [...(byPod.get(c.pod) ?? []), c]);
  let held = 0;
  let noDevice = 0;
  for (const [pod, rows] of byPod) {
    rows.sort((a, b) => COVER_ORDER[a.state] - COVER_ORDER[b.state]);
    const live = rows.some((r) => r.state === "adding" || r.state === "ready");
    const covered = devices ? devices.get(pod) ?? 0 : live ? 1 : 0;
    for (const r of rows.slice(covered)) {
      if (r.state === "held") held++;
      else noDevice++;
    }
  }
  const holds: CapacityHold[] = [];
  if (held > 0) holds.push({ reason: "sticky_hold", count: held, eniIds: [] });
  if (noDevice > 0) holds.push({ reason: "no_device", count: noDevice, eniIds: [] });
  return holds;
}

/**
 * The provider's capacity less `holds`: each takes as many of the slots left for pods
 * as it can, and is listed with what it took.
 */
export function lessConsumers(
  cap: NodeCapacity,
  holds: readonly CapacityHold[],
  note?: string,
): NodeCapacity {
  let forPods = cap.forPods;
  const unavailable = [...cap.unavailable];
  for (const h of holds) {
    const n = Math.min(h.count, forPods);
    if (n <= 0) continue;
    forPods -= n;
    unavailable.push({ ...h, count: n });
  }
  return { ...cap, forPods, unavailable, ...(note ? { note } : {}) };
}
