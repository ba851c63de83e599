/**
 * The ADD result, built once in the canonical (1.1.0) shape from the agent's
 * {@linkcode AddResponse}, then converted to the negotiated version by
 * `convertResult` in `version.ts`.
 *
 * Interface mode (spec-exact): `interfaces[0]` is the pod's interface
 * (`name` = CNI_IFNAME, the ENI's `mac`, `sandbox` = CNI_NETNS, `mtu` when
 * configured); every `ips[].interface` is `0`, an index into `interfaces`.
 * When a `prevResult` is given (enim chained after another plugin) enim's
 * interface, addresses and routes are appended to it and the index points at
 * enim's interface.
 *
 * With a host link (issue 27) its node end (no `sandbox`) and pod end follow the
 * ENI's interface, and its routes (via the link-local gateway) follow the ENI's.
 *
 * IPAM mode (the seed's format): `interfaces` is `[{mac}]` and
 * `ips[].interface` is the ENI device's Linux ifindex on the node, as an
 * integer. The seed's README printed it as the string "10", but CNI consumers
 * (libcni's Go types, containerd, the reference plugins) unmarshal
 * `interface` into an int, and a string makes them fail; so enim writes a
 * number. The spec lets delegated plugins omit `interfaces` and
 * `ips[].interface`; enim keeps them because the calling plugin uses them to
 * find the device fast.
 *
 * @module
 */
import type { AddResponse, Mode } from "../api/schema.ts";
import type { CniResult } from "./negotiate.ts";

/** What the result needs beyond the agent's answer. */
export interface ResultContext {
  mode: Mode;
  /** CNI_IFNAME. */
  ifName: string;
  /** CNI_NETNS. */
  netns: string;
  /** The configured MTU, reported on the interface (1.1.0 only). */
  mtu?: number;
  /** The parsed `prevResult`, when chained (interface mode only). */
  prevResult?: CniResult;
}

/** Builds the canonical ADD result. */
export function buildAddResult(res: AddResponse, ctx: ResultContext): CniResult {
  const routes = res.routes.map((r) => (r.gw === undefined ? { dst: r.dst } : { ...r }));
  if (ctx.mode === "ipam") {
    return {
      interfaces: [{ mac: res.mac }],
      ips: res.ips.map((ip) => ({
        address: ip.address,
        gateway: ip.gateway,
        interface: res.ifindex,
      })),
      routes,
      dns: {},
    };
  }
  const prev = ctx.prevResult ?? { interfaces: [], ips: [], routes: [], dns: {} };
  const index = prev.interfaces.length;
  return {
    interfaces: [
      ...prev.interfaces,
      {
        name: ctx.ifName,
        mac: res.mac,
        ...(ctx.mtu !== undefined ? { mtu: ctx.mtu } : {}),
        sandbox: ctx.netns,
      },
      // The host link's two ends, after the ENI's interface (whose index the ips keep).
      ...(res.hostLink
        ? [
          { name: res.hostLink.nodeIfName, mac: res.hostLink.nodeMac },
          { name: res.hostLink.podIfName, mac: res.hostLink.podMac, sandbox: ctx.netns },
        ]
        : []),
    ],
    ips: [
      ...prev.ips,
      ...res.ips.map((ip) => ({ address: ip.address, gateway: ip.gateway, interface: index })),
    ],
    routes: [...prev.routes, ...routes],
    dns: prev.dns,
  };
}
