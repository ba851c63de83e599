/**
 * Liveness from the runtime: a CNI GC call's list of valid attachments.
 *
 * @module
 */
import { keyOf } from "../../providers/schema.ts";
import type { LivenessSource, Verdict } from "./types.ts";

/** (b) A CNI GC call for the attachment's network does not list it in its valid attachments. */
export const cniGcLiveness: LivenessSource = {
  name: "cni-gc",
  dead(rows, ctx) {
    const out = new Map<string, Verdict>();
    const { network, validAttachments } = ctx.request;
    if (network === undefined || validAttachments === undefined) return Promise.resolve(out);
    const valid = new Set(validAttachments.map(keyOf));
    for (const r of rows) {
      if (r.network === network && !valid.has(keyOf(r))) {
        out.set(keyOf(r), {
          reason: `not in cni.dev/valid-attachments of network "${network}"`,
        });
      }
    }
    return Promise.resolve(out);
  },
};
