/**
 * Liveness from the kernel: the pod's network namespace is gone or replaced.
 *
 * @module
 */
import type { DeviceLayer } from "../../netns/types.ts";
import type { AttachmentRow } from "../state.ts";
import { keyOf } from "../../providers/schema.ts";
import type { LivenessSource, Verdict } from "./types.ts";

/**
 * (a) The pod's network namespace no longer exists, or exists with another identity
 * (device and inode recorded at ADD), or (interface mode) no longer holds the ENI's
 * device: the kernel hands a freed namespace's inode to the next one, so a path
 * deleted and recreated quickly can carry the recorded identity.
 */
export const netnsLiveness: LivenessSource = {
  name: "netns",
  async dead(rows, ctx) {
    const out = new Map<string, Verdict>();
    const byPath = new Map<string, Promise<{ dev: number; ino: number } | null>>();
    const identity = (p: string) => {
      let v = byPath.get(p);
      if (!v) {
        v = ctx.devices.netnsIdentity(p).catch(() => null);
        byPath.set(p, v);
      }
      return v;
    };
    await Promise.all(rows.map(async (r) => {
      // IPAM attachments with a non-nsfs netns (e.g. /dev/null) have no identity to check.
      if (r.netnsDev === null || r.netnsIno === null) {
        if (r.mode === "ipam") return;
      }
      const id = await identity(r.netns);
      if (!id) {
        out.set(keyOf(r), { reason: `netns "${r.netns}" no longer exists`, netnsUsable: false });
      } else if (
        r.netnsDev !== null && r.netnsIno !== null &&
        (id.dev !== r.netnsDev || id.ino !== r.netnsIno)
      ) {
        out.set(keyOf(r), {
          reason: `netns "${r.netns}" was replaced (inode ${r.netnsIno} → ${id.ino})`,
          netnsUsable: false,
        });
      } else if (
        r.mode === "interface" && r.mac && (r.state === "ready" || r.state === "recycling")
      ) {
        // The kernel reuses a freed namespace's inode at once, so a path deleted and
        // recreated can show the recorded identity: the ENI's device must still be there.
        if (await deviceGone(r, ctx.devices)) {
          out.set(keyOf(r), {
            reason: `netns "${r.netns}" no longer holds the ENI's device ${r.mac} (replaced)`,
            netnsUsable: false,
          });
        }
      }
    }));
    return out;
  },
};

/**
 * Whether the interface-mode attachment's netns surely no longer holds its device:
 * neither a link with its MAC nor its interface with the node-side name as alias
 * (a chained plugin such as tuning may have changed the MAC). Unknown counts as held.
 */
async function deviceGone(r: AttachmentRow, devices: DeviceLayer): Promise<boolean> {
  try {
    if (await devices.findByMac(r.mac!, r.netns)) return false;
    const live = await devices.inspect({ netns: r.netns, ifName: r.ifName });
    return !(live.link && r.nodeName && live.link.ifalias === r.nodeName);
  } catch {
    return false;
  }
}
