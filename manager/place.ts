/**
 * Placing an ADD's ENI: moving its device into the pod and configuring it (interface
 * mode), or finding it where the calling plugin put it (IPAM mode), and recording
 * where it is. `add.ts` calls these under the ENI's lock.
 *
 * @module
 */
import type { Eni } from "../providers/contract.ts";
import {
  DeviceError,
  type HostLinkSpec,
  type InstalledShaping,
  type PinnedNetns,
  type PlugResult,
  type RouteSpec,
} from "../netns/types.ts";
import { type AddResponse, ApiError } from "../api/schema.ts";
import type { AddInput } from "./types.ts";
import type { AttachmentKey } from "../providers/schema.ts";
import type { ManagerContext } from "./context.ts";
import type { OpTimer } from "./op_timer.ts";
import { findDevice } from "./release.ts";

/**
 * Interface mode: moves the ENI's device into the pod and configures it (two spawns
 * when the device layer knows the device's node name). The ENI, its MAC and the
 * node name the move uses are recorded in one write just before the move, so a
 * crash after it leaves reconcile all it needs to bring the device back. A device
 * not on the node yet (a physical ENI returning from a pod, a simulated one being
 * re-created) is waited for up to 2 s, then the plug is tried once more.
 */
export async function plugIntoPod(
  ctx: ManagerContext,
  req: AddInput,
  pinned: PinnedNetns,
  key: AttachmentKey,
  eni: Eni,
  ips: AddResponse["ips"],
  routes: RouteSpec[],
  t: OpTimer,
  hostLink?: HostLinkSpec,
  policyRuleset?: () => Promise<string>,
): Promise<{ ifindex: number; nodeName: string; shaping?: InstalledShaping }> {
  // Recorded with the node name, before the link is made: what a rollback removes.
  const recorded = hostLink
    ? JSON.stringify({
      nodeIfName: hostLink.nodeIfName,
      podIfName: hostLink.podIfName,
      serviceCidrs: req.hostLink?.serviceCidrs ?? [],
      table: hostLink.table,
    })
    : undefined;
  const plug = (nodeName?: string) =>
    ctx.devices.plug({
      mac: eni.mac,
      netns: pinned,
      ifName: req.ifName,
      addresses: ips.map((i) => ({ cidr: i.address })),
      routes,
      mtu: req.mtu,
      nodeName,
      ...(req.bandwidth ? { bandwidth: req.bandwidth } : {}),
      ...(hostLink ? { hostLink } : {}),
      ...(hostLink && policyRuleset ? { policyRuleset } : {}),
      beforeMove: (name) =>
        t.sync("state_write", () =>
          ctx.state.update(key, {
            eniId: eni.id,
            mac: eni.mac,
            nodeName: name,
            ...(recorded ? { hostLink: recorded } : {}),
          })),
      timing: (phase, ms) => t.add(phase, ms),
    });
  let r: PlugResult;
  try {
    r = await plug();
  } catch (err) {
    if (!(err instanceof DeviceError) || err.reason !== "not_found") throw err;
    const found = await t.time("device_lookup", () => findDevice(ctx, eni.mac, null));
    if (!found) {
      throw new ApiError(
        "device_error",
        `No device with MAC "${eni.mac}" (ENI "${eni.id}") on the node`,
      );
    }
    r = await plug(found.link.ifname);
  }
  // The device is in the namespace held since the start. If the path names another one
  // now (deleted and re-created meanwhile), the pod the runtime knows is not that one:
  // bring the device back and refuse, rather than record a pod that has no device.
  const now = await ctx.devices.netnsIdentity(req.netns).catch(() => null);
  if (!now || now.dev !== pinned.identity.dev || now.ino !== pinned.identity.ino) {
    await ctx.devices.unplug({
      mac: eni.mac,
      nodeName: r.nodeName,
      netns: pinned,
      podName: req.ifName,
      shapedIngress: r.shaping?.ingress !== undefined,
      ...(hostLink ? { hostLink } : {}),
    });
    throw new ApiError(
      "netns_invalid",
      `Netns "${req.netns}" was replaced during the ADD (it named another namespace when the device was moved); nothing was kept`,
    );
  }
  const { podIfindex: ifindex, nodeName, shaping } = r;
  return shaping ? { ifindex, nodeName, shaping } : { ifindex, nodeName };
}

/**
 * IPAM mode: finds the ENI's device, on the node or (a device plugin such as
 * host-device moves it first) already in the pod, and records it; the calling
 * plugin moves it.
 */
export async function findForIpam(
  ctx: ManagerContext,
  req: AddInput,
  key: AttachmentKey,
  eni: Eni,
  podUsable: boolean,
  t: OpTimer,
): Promise<{ ifindex: number; nodeName: string }> {
  const found = await t.time(
    "device_lookup",
    () => findDevice(ctx, eni.mac, podUsable ? req : null),
  );
  if (!found) {
    throw new ApiError(
      "device_error",
      `No device with MAC "${eni.mac}" (ENI "${eni.id}") on the node${
        podUsable ? " or in the pod" : ""
      }`,
    );
  }
  const { link, inPod } = found;
  // A device plugin that moves the device before calling IPAM (host-device) keeps
  // the node-side name in the alias, as enim itself does.
  const nodeName = inPod ? (link.ifalias || link.ifname) : link.ifname;
  if (inPod) {
    ctx.log.info("The calling plugin has moved the device into the pod already", {
      eniId: eni.id,
      podName: link.ifname,
      nodeName,
    });
  }
  t.sync(
    "state_write",
    () => ctx.state.update(key, { eniId: eni.id, mac: eni.mac, nodeName, ifindex: link.ifindex }),
  );
  return { ifindex: link.ifindex, nodeName };
}
