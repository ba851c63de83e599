/**
 * Raw sockets (issue 48 point 1): whether the kernel has the raw-socket guard
 * (`policy/raw_guard.ts`), and for each pod a policy isolates whether it can still reach
 * past its policy with the capabilities it holds.
 *
 * - `CAP_NET_ADMIN` in the pod's namespace: it can delete its own tables (the policy's and
 *   the guard's). Nothing in its namespace holds against it.
 * - `CAP_NET_RAW` (packet sockets): held back by the guard where the kernel has it; where
 *   it does not, its frames leave by its ENI unjudged.
 *
 * Such a pod is flagged (`enim status`, `enim policy`, the metric
 * `enim_policy_pods_unenforced`, a log line) or, with `networkPolicy.rawCapablePods:
 * refuse`, its ADD fails. What the pod holds is read from its spec (every container,
 * init and ephemeral ones too: they share its namespace) and the runtime's default set
 * (`networkPolicy.runtimeDefaultCapabilities`).
 *
 * @module
 */
import { type NetCaps, podHolds } from "../../kube/objects.ts";
import type { DeviceLayer } from "../../netns/types.ts";
import type { Logger } from "../../lib/log.ts";
import { guardProbe } from "../../policy/mod.ts";
import { userMessage } from "../../lib/message.ts";

/** The kernel's raw-socket guard, as the agent found it at start. */
export interface RawGuardState {
  /** Each isolated pod gets the guard. */
  on: boolean;
  /** Why (or why not), in words. */
  why: string;
}

/** The first Linux release whose `netdev` egress hook also sees `PACKET_QDISC_BYPASS` frames. */
export const GUARD_MIN_KERNEL: readonly [number, number] = [5, 17];

/** Whether a kernel release (`uname -r`) is at least {@linkcode GUARD_MIN_KERNEL}; null: unreadable. */
export function kernelHasGuard(release: string): boolean | null {
  const m = /^(\d+)\.(\d+)/.exec(release);
  if (!m) return null;
  const [maj, min] = [Number(m[1]), Number(m[2])];
  return maj > GUARD_MIN_KERNEL[0] || (maj === GUARD_MIN_KERNEL[0] && min >= GUARD_MIN_KERNEL[1]);
}

/**
 * Finds out at start whether this node can guard pods' ENIs: the option on, the kernel's
 * release at least 5.17, and the kernel takes the guard's tables (`nft -c`, nothing loaded).
 */
export async function probeRawGuard(
  option: "auto" | false,
  devices: Pick<DeviceLayer, "checkRuleset">,
  release: string | null,
  log: Logger,
): Promise<RawGuardState> {
  const state = await (async (): Promise<RawGuardState> => {
    if (option === false) return { on: false, why: "networkPolicy.rawSocketGuard is false" };
    if (release === null) return { on: false, why: "the kernel's release cannot be read" };
    if (!kernelHasGuard(release)) {
      return {
        on: false,
        why: `Linux ${release} is older than ${
          GUARD_MIN_KERNEL.join(".")
        } (no netdev egress hook for packet sockets)`,
      };
    }
    if (!devices.checkRuleset) return { on: false, why: "the device layer has no kernel to ask" };
    try {
      await devices.checkRuleset(guardProbe());
    } catch (err) {
      return { on: false, why: `the kernel refuses the guard's tables: ${userMessage(err)}` };
    }
    return { on: true, why: `Linux ${release} has the netdev egress hook` };
  })();
  if (state.on) log.info("NetworkPolicy: pods' raw sockets are guarded", { why: state.why });
  else {
    log.warn(
      "NetworkPolicy: no raw-socket guard: a pod a policy isolates must lack NET_RAW and NET_ADMIN for its policy to hold (such pods are flagged)",
      { why: state.why },
    );
  }
  return state;
}

/**
 * Why a pod a policy isolates can reach past it, in words (null: it cannot): `caps`
 * from its spec, `defaults` the runtime's default set, `guard` the kernel's guard.
 */
export function bypassOf(
  caps: NetCaps | undefined,
  defaults: readonly string[],
  guard: boolean,
): string | null {
  if (!caps) return null;
  const h = podHolds(caps, defaults);
  const how = (holding: string) =>
    holding === "yes" ? "its spec adds it or is privileged" : "the runtime's default set has it";
  if (h.netAdmin) {
    return `it holds NET_ADMIN (${how(caps.admin)}): it can delete its own nftables tables`;
  }
  if (h.netRaw && !guard) {
    return `it holds NET_RAW (${
      how(caps.raw)
    }) and this node has no raw-socket guard: its packet sockets' frames leave unjudged`;
  }
  return null;
}
