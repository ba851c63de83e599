/**
 * What the device plugin advertises, decided from the agent's own state: one
 * device per ENI slot of the node (the provider's {@linkcode NodeCapacity}), the
 * first `forPods` of them Healthy and the rest Unhealthy with the reason why
 * (slots taken by ENIs enim does not own, quarantined ENIs, ENIs being parked, and
 * those attachments take that kubelet counts no device for: `accounting.ts`), or every one
 * Unhealthy while the provider has not answered past a threshold or the agent is
 * not ready.
 *
 * Nothing here is remembered between runs: the same capacity gives the same
 * device IDs (`eni-0`, `eni-1`, …) and health after a restart, so kubelet's
 * checkpointed allocations stay valid.
 *
 * @module
 */
import {
  type CapacityHold,
  type NodeCapacity,
  NodeCapacitySchema,
  type Provider,
  ProviderStatusSchema,
} from "../../providers/contract.ts";
import { type Device, HEALTHY, UNHEALTHY } from "./v1beta1.ts";
import type { UNHEALTHY_REASONS } from "../../lib/metrics.ts";

/** Why a device is Unhealthy. */
export type UnhealthyReason = typeof UNHEALTHY_REASONS[number];

/** Some Unhealthy devices and why. */
export interface UnhealthyGroup {
  reason: UnhealthyReason;
  devices: number;
  /** A sentence for `enim status` and the logs. */
  message: string;
}

/** The provider's answers so far, and the agent's state, that the devices follow. */
export interface HealthInputs {
  /** The provider's last capacity (null: it never answered). */
  capacity: NodeCapacity | null;
  /** Since when the provider has been failing to tell its capacity, and why (null: it answers). */
  failing: { sinceMs: number; message: string } | null;
  /** Whether the agent is ready to serve pods (false while it shuts down). */
  ready: boolean;
  /** Now, epoch milliseconds. */
  nowMs: number;
  /** How long the provider may fail before every device is Unhealthy. */
  unreachableAfterMs: number;
}

/** The device list and the reasons behind it. */
export interface Advertised {
  devices: Device[];
  /** The node's ENI limit the devices stand for (null: not known yet). */
  limit: number | null;
  healthy: number;
  unhealthy: UnhealthyGroup[];
  /** Why there is no list yet, when there is none. */
  note: string | null;
}

/** The ID of the device that stands for slot `i` of the node's ENI limit. */
export function deviceId(i: number): string {
  return `eni-${i}`;
}

function plural(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

function named(ids: string[]): string {
  if (ids.length === 0) return "";
  const shown = ids.slice(0, 5).map((id) => `"${id}"`).join(", ");
  return ` (${shown}${ids.length > 5 ? `, ${ids.length - 5} more` : ""})`;
}

/** The sentence for slots pods cannot get, by its reason. */
function holdMessage(hold: CapacityHold): string {
  const n = hold.count;
  switch (hold.reason) {
    case "foreign":
      return `${plural(n, "slot")} of the node's ENI limit taken by ${
        plural(n, "ENI")
      } enim does not own${named(hold.eniIds)}`;
    case "quarantined":
      return `${plural(n, "ENI")} stuck attaching or detaching, quarantined${named(hold.eniIds)}`;
    case "parking":
      return `${plural(n, "ENI")} of zone-sticky pods being detached into the VPC${
        named(hold.eniIds)
      }`;
    case "sticky_hold":
      return `${
        plural(n, "ENI")
      } held for sticky pods that are gone, until they come back or their hold ends`;
    case "no_device":
      return `${
        plural(n, "ENI")
      } taken by attachments kubelet counts no enim.dev/eni device for (pods without the request, podman, an older container's, one being released)`;
  }
}

/** Decides the advertised devices (see the module doc). */
export function advertise(h: HealthInputs): Advertised {
  const cap = h.capacity;
  if (!cap) {
    return {
      devices: [],
      limit: null,
      healthy: 0,
      unhealthy: [],
      note: h.failing
        ? `The provider has not told the node's ENI capacity yet: ${h.failing.message}`
        : "The node's ENI capacity is not known yet",
    };
  }
  const limit = cap.limit;
  let healthy = Math.min(cap.forPods, limit);
  let unhealthy: UnhealthyGroup[] = [];
  const downFor = h.failing ? h.nowMs - h.failing.sinceMs : 0;
  if (!h.ready) {
    healthy = 0;
    unhealthy = [{
      reason: "agent_not_ready",
      devices: limit,
      message: "The enim agent is not ready (it is shutting down)",
    }];
  } else if (h.failing && downFor >= h.unreachableAfterMs) {
    healthy = 0;
    unhealthy = [{
      reason: "provider_unreachable",
      devices: limit,
      message: `The provider has not answered for ${
        Math.round(downFor / 1000)
      } s: ${h.failing.message}`,
    }];
  } else {
    let left = limit - healthy;
    for (const hold of cap.unavailable) {
      const n = Math.min(hold.count, left);
      if (n <= 0) continue;
      left -= n;
      unhealthy.push({ reason: hold.reason, devices: n, message: holdMessage(hold) });
    }
  }
  const devices: Device[] = [];
  for (let i = 0; i < limit; i++) {
    devices.push({ ID: deviceId(i), health: i < healthy ? HEALTHY : UNHEALTHY });
  }
  return { devices, limit, healthy, unhealthy, note: cap.note ?? null };
}

/** A key that is equal for equal device lists (ListAndWatch sends a list only when it changes). */
export function listKey(devices: readonly Device[]): string {
  return devices.map((d) => `${d.ID}=${d.health}`).join(",");
}

/**
 * The provider's capacity, parsed: its `capacity()` when it has one, else what
 * its pool counts imply (the ENIs it has and can still attach, all for pods).
 */
export async function readCapacity(
  provider: Pick<Provider, "status" | "capacity">,
): Promise<NodeCapacity> {
  if (provider.capacity) return NodeCapacitySchema.parse(await provider.capacity());
  const s = ProviderStatusSchema.parse(await provider.status());
  const limit = s.free + s.owned + s.attachable;
  return { limit, forPods: limit, unavailable: [], source: "status" };
}
