/**
 * Releasing an attachment (DEL, an ADD's rollback, GC's reclaim, reconcile): the
 * device back to the node, then the provider, then the record, with the intent
 * (`deleting`) recorded first so a crash in between is finished at start-up.
 *
 * An ENI is never freed while its device is unaccounted for: a device found
 * neither in the pod nor on the node is asked back from the provider
 * (`repairDevice`) and waited for; if it stays missing the record stays
 * `deleting` with the reason and GC tries again. Only an ENI the cloud no longer
 * has is forgotten.
 *
 * @module
 */
import { ProviderError } from "../providers/contract.ts";
import { AddResponseSchema } from "../api/schema.ts";
import { DeviceError, type Link, type PinnedNetns } from "../netns/types.ts";
import type { Phase } from "../lib/metrics.ts";
import { type AttachmentRow, hostLinkOf } from "./state.ts";
import { type AttachmentKey, keyOf } from "../providers/schema.ts";
import { type ManagerContext, message, ownerOf } from "./context.ts";
import { OpTimer } from "./op_timer.ts";
import { poll } from "../lib/async.ts";
import { policyRemoved } from "./policy.ts";

/**
 * Finds an ENI's device on the node or, for an IPAM ADD with a usable pod namespace,
 * in the pod (a device plugin such as host-device moves the device into the pod before
 * it calls IPAM). A device released a moment ago may still be on its way back to the
 * node (the calling plugin moves it out after IPAM DEL; a physical ENI returns
 * asynchronously), so a missing device is looked for again for up to 2 s.
 */
export async function findDevice(
  ctx: ManagerContext,
  mac: string,
  pod: { netns: string } | null,
): Promise<{ link: Link; inPod: boolean } | null> {
  return await poll(async () => {
    const onNode = await ctx.devices.findByMac(mac);
    if (onNode) return { link: onNode, inPod: false };
    const inPod = pod ? await ctx.devices.findByMac(mac, pod.netns).catch(() => null) : null;
    return inPod ? { link: inPod, inPod: true } : null;
  }, { timeoutMs: 2000, intervalMs: 50 });
}

/**
 * Releases an attachment; the caller holds its `att:` key. Intent (`deleting`) first,
 * then the device back to the node, then the provider, then the row is deleted. On
 * failure the row stays `deleting` with the error recorded (GC finishes it).
 *
 * `leaveCallerDevice` (DEL and ADD rollback): in IPAM mode the device belongs to the
 * calling plugin. When it sits in the pod under the attachment's interface name, that
 * plugin put it there and moves it out itself after IPAM DEL (host-device does: IPAM
 * DEL first, then it moves the device back under the name kept in its alias; if enim
 * had moved it already, host-device's DEL would fail for good, "failed to find eth0").
 * GC passes no such flag: a device left in a leftover namespace is moved back.
 */
export async function release(
  ctx: ManagerContext,
  row: AttachmentRow,
  o: {
    netnsUsable: boolean;
    skipProvider?: boolean;
    leaveCallerDevice?: boolean;
    /** A sticky pod's DEL: the device comes back, the ENI stays its pod's until then. */
    holdUntil?: number;
    /** With `holdUntil` (zone scope): after the node hold, parked in the VPC until then. */
    parkUntil?: number;
    /**
     * A zone-sticky pod's DEL (no node hold), or its node hold's end: the device
     * comes back and the provider parks the ENI in the VPC for the pod until then.
     */
    park?: { until: number };
    /**
     * A sticky pod's DEL: the host link is left to the caller, which removes it once the
     * DEL has answered (`del.ts`); a veth pair's removal costs the kernel more than the
     * rest of the DEL. Any other release removes it with the device.
     */
    deferHostLink?: boolean;
    /**
     * DEL, GC: the ENI goes back to the pool only once no pod the cluster shows holds its
     * addresses, bounded (the enforcer's `reuseWait`; without NetworkPolicy, at once):
     * other nodes know whose an address is only from the API. A DEL answers before it
     * waits. Reconcile does not wait (the agent's start would).
     */
    reuseWait?: boolean;
    /**
     * DEL: called once the rest cannot be lost, so the DEL may answer: the intent is
     * recorded and the pod's namespace is held open by the agent (it outlives its path,
     * so the runtime removing it cannot take the device), just before the device is
     * moved home. Not called for a namespace named by `/proc/<pid>/ns/net` (its pin
     * holds nothing open: `PinnedNetns.keepsAlive`), nor on the other ways.
     */
    answer?: () => void;
  },
  t: OpTimer = new OpTimer(),
): Promise<void> {
  const key: AttachmentKey = { containerId: row.containerId, ifName: row.ifName };
  let answered = false;
  const answer = () => {
    if (!answered) o.answer?.();
    answered = true;
  };
  // From the start: the pod's next ADD may come while its device is still going home.
  let mine: Map<string, { pod: string; uid: string | null; skip: AbortController }> | undefined;
  if (o.reuseWait) {
    mine = releasing.get(ctx);
    if (!mine) releasing.set(ctx, mine = new Map());
    mine.set(keyOf(key), { pod: row.pod, uid: row.podUid, skip: new AbortController() });
  }
  if (row.state !== "deleting") {
    t.sync("state_write", () => ctx.state.update(key, { state: "deleting" }));
  }
  try {
    if (row.mac) {
      const mac = row.mac;
      const since = performance.now();
      await ctx.locks.run(`eni:${row.eniId}`, async () => {
        t.waited(since);
        if (
          o.leaveCallerDevice && o.netnsUsable && row.mode === "ipam" && row.netnsIno !== null
        ) {
          const inPod = await ctx.devices.findByMac(mac, row.netns).catch(() => null);
          if (inPod && inPod.ifname === row.ifName) {
            ctx.log.info("Leaving the device in the pod to the calling plugin", {
              eniId: row.eniId,
              mac,
              netns: row.netns,
              ifName: row.ifName,
            });
            return;
          }
        }
        // Recorded with the MAC before any move; looked up only for rows of older agents.
        const nodeName = row.nodeName ??
          (await t.time("device_lookup", () => ctx.devices.findByMac(mac)))?.ifname ??
          // Its alias in the pod is its node name (a later unplug renames it to that).
          (row.eniId ? `enim${row.eniId.replace(/[^A-Za-z0-9]/g, "").slice(-11)}` : "enim-eni");
        // An IPAM attachment with a non-nsfs netns (CNI_NETNS=/dev/null) has no pod side.
        const podSide = row.mode === "interface" || row.netnsIno !== null;
        // Held for this release; a path that names another namespace than the one the
        // ADD recorded leads to someone else's pod, not to the device.
        let pinned = o.netnsUsable && podSide
          ? await t.time("netns_check", () => ctx.devices.pin(row.netns)).catch(() => null)
          : null;
        if (
          pinned && row.netnsIno !== null &&
          (pinned.identity.ino !== row.netnsIno || pinned.identity.dev !== row.netnsDev)
        ) {
          pinned.close();
          pinned = null;
        }
        // Early only while the pin keeps the namespace alive: a /proc/<pid> path keeps
        // nothing, and a runtime stops the sandbox as soon as its DEL is answered.
        if (pinned?.keepsAlive && row.mode === "interface") answer();
        // The pod's NetworkPolicy goes while its device goes home, not after: its edits of
        // the other pods' tables and the node's (its address leaves their sets) then run
        // beside the move home, before the runtime's next ADD comes, instead of beside that
        // ADD. Its containers stopped before the runtime called DEL. They are done before
        // the ENI (and its address) can go to another pod. (The call after this step covers
        // every other way out of it; a second call does nothing.)
        const rules = policyRemoved(ctx, key);
        try {
          await returnDevice(ctx, row, mac, nodeName, pinned, t, o.deferHostLink);
        } finally {
          pinned?.close();
          await rules;
        }
      }).finally(() => policyRemoved(ctx, key));
    }
    if (o.holdUntil !== undefined && row.eniId && row.result) {
      t.sync("state_write", () => ctx.state.markHeld(key, o.holdUntil!, o.parkUntil ?? null));
      return;
    }
    const parking = o.park !== undefined && !o.skipProvider && ctx.provider.parkENI !== undefined;
    if (o.reuseWait && !parking && !o.skipProvider) await reuseWait(ctx, row, answer, t);
    if (parking) {
      // The provider records the park before it answers; its cloud record replaces
      // the description, so no "freed" description follows.
      await t.time("provider", () => ctx.provider.parkENI!(ownerOf(row), o.park!));
    } else if (!o.skipProvider) {
      await t.time("provider", () => ctx.provider.deallocateENI(ownerOf(row)));
    }
    t.sync("state_write", () => ctx.state.delete(key));
    ctx.addAnswered.delete(keyOf(key));
    if (row.eniId && !o.skipProvider && !parking) ctx.describer?.freed(row.eniId);
  } catch (err) {
    t.sync("state_write", () => ctx.state.recordFailure(key, message(err)));
    throw err;
  } finally {
    mine?.delete(keyOf(key));
  }
}

/** The releases that may wait for reuse, by attachment key, of each manager. */
const releasing = new WeakMap<
  ManagerContext,
  Map<string, { pod: string; uid: string | null; skip: AbortController }>
>();

/**
 * An ADD of `pod` (its uid, when the runtime passed it) looks for an ENI: a release of
 * that same pod's earlier sandbox (kubelet DELs the old one before it ADDs the new)
 * does not wait for the API to stop showing the pod with its address, or stops
 * waiting: whether that address comes back to the pod or not, it is the same pod's.
 * Without a uid nothing changes (a pod re-created under its name is another pod).
 */
export function podReturns(ctx: ManagerContext, pod: string, uid: string | undefined): void {
  if (!uid) return;
  for (const r of releasing.get(ctx)?.values() ?? []) {
    if (r.pod === pod && r.uid === uid) r.skip.abort();
  }
}

/**
 * The reuse wait of a release: once the device is home, the ENI goes back to the pool
 * when the enforcer says no pod the cluster shows holds the addresses `row`'s ADD gave
 * (`PolicyHook.reuseWait`), or when the manager stops, or when the same pod's next ADD
 * comes ({@linkcode podReturns}). The DEL answers before it waits.
 */
async function reuseWait(
  ctx: ManagerContext,
  row: AttachmentRow,
  answer: () => void,
  t: OpTimer,
): Promise<void> {
  if (!ctx.policy?.reuseWait || row.result === null) return;
  let addresses: string[];
  try {
    addresses = AddResponseSchema.parse(JSON.parse(row.result)).ips.map((i) =>
      i.address.split("/")[0]
    );
  } catch {
    return;
  }
  const own = releasing.get(ctx)?.get(keyOf(row));
  if (own?.skip.signal.aborted) return;
  const wait = ctx.policy.reuseWait(
    addresses,
    own ? AbortSignal.any([ctx.stopping, own.skip.signal]) : ctx.stopping,
  );
  if (!wait) return;
  // The device is home and the intent recorded: the runtime need not wait with us.
  answer();
  await t.time("reuse_wait", () => wait);
}

/**
 * Brings an attachment's device back to the node (`unplug`), or makes sure it is
 * there; throws when it is found nowhere, unless the cloud says the ENI is gone.
 */
export async function returnDevice(
  ctx: ManagerContext,
  row: AttachmentRow,
  mac: string,
  nodeName: string,
  netns: PinnedNetns | null,
  t: OpTimer,
  deferHostLink = false,
): Promise<void> {
  const timing = (phase: Phase, ms: number) => t.add(phase, ms);
  // The pod name identifies the device only once the ADD placed it (a later plugin
  // may then have changed its MAC); a failed ADD's pod name may be another device's.
  const podName = row.mode === "interface" && row.result !== null ? row.ifName : undefined;
  const shapedIngress = shapedIngressOf(row);
  // Its host link goes with the device (recorded before it was made, so a rollback finds it).
  const link = deferHostLink ? null : hostLinkOf(row);
  const hostLink = link
    ? { hostLink: { nodeIfName: link.nodeIfName, podIfName: link.podIfName } }
    : {};
  let outcome;
  try {
    outcome = await ctx.devices.unplug({
      mac,
      nodeName,
      netns,
      podName,
      timing,
      shapedIngress,
      ...hostLink,
    });
  } catch (err) {
    if (!(err instanceof DeviceError) || err.reason !== "netns_invalid" || !netns) {
      throw err;
    }
    // The netns is gone: the kernel returned the device to the node.
    outcome = await ctx.devices.unplug({ mac, nodeName, netns: null, timing, ...hostLink });
  }
  if (outcome === "missing") {
    const repaired = row.eniId ? await repairDevice(ctx, row.eniId, mac) : "missing";
    // An ENI the cloud no longer has is forgotten: there is nothing left to hold.
    if (repaired === "gone") return;
    if (repaired === "missing") {
      // Never free an ENI whose device is unaccounted for: the next one to get it
      // would find no device, or the device would turn up in use. The row stays
      // `deleting` with this error and GC tries again.
      throw new DeviceError(
        "unplug",
        "not_found",
        `The device of ENI "${row.eniId}" (MAC ${mac}) is neither in the pod nor on the node; the ENI stays held until it is found`,
      );
    }
    // It may come back under another name (and, physical, up): rename and scrub it.
    await ctx.devices.unplug({ mac, nodeName, netns: null, ...hostLink });
  }
}

/**
 * Whether the ADD recorded in `row` shaped the pod's ingress (then an ifb device in
 * the pod goes with the ENI's device). A record it cannot read says no: the device
 * layer still finds and removes an ifb left in the pod (`netns/mod.ts`, `unplug`).
 */
export function shapedIngressOf(row: AttachmentRow): boolean {
  if (row.result === null) return false;
  try {
    return AddResponseSchema.parse(JSON.parse(row.result)).bandwidth?.ingress !== undefined;
  } catch {
    return false;
  }
}

/**
 * A released device was found nowhere (a veth dies with its namespace; a physical
 * ENI returns to the node asynchronously): ask the provider to bring it back and
 * wait for it on the node, so the ENI is usable when it returns to the pool.
 * Says whether the device is back, the ENI is gone from the cloud, or the device is missing.
 */
export async function repairDevice(
  ctx: ManagerContext,
  eniId: string,
  mac: string,
): Promise<"back" | "gone" | "missing"> {
  const outcome = await poll(async (): Promise<"back" | "gone" | null> => {
    try {
      await ctx.provider.repairDevice?.(eniId);
    } catch (err) {
      if (err instanceof ProviderError && err.reason === "not_found") {
        // The cloud no longer has the ENI (deleted out of band): no device will return.
        ctx.log.warn("The ENI is gone from the cloud; its device will not return", {
          eniId,
          mac,
          error: message(err),
        });
        return "gone";
      }
      ctx.log.warn("Repairing a vanished device failed", { eniId, error: message(err) });
    }
    return (await ctx.devices.findByMac(mac).catch(() => null)) ? "back" : null;
  }, { timeoutMs: 3000, intervalMs: 100 });
  if (outcome === "back") ctx.log.info("A vanished ENI device is back on the node", { eniId, mac });
  if (outcome) return outcome;
  ctx.log.warn("The ENI's device is missing from the node", { eniId, mac });
  return "missing";
}
