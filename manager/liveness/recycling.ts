/**
 * The seed's recycling rule: a pod's older container whose DEL did not come.
 *
 * @module
 */
import { keyOf } from "../../providers/schema.ts";
import type { LivenessSource, Verdict } from "./types.ts";

/** (c) The seed's recycling rule: the pod has a newer container, and this DEL did not come in time. */
export const recyclingLiveness: LivenessSource = {
  name: "recycling",
  dead(rows, ctx) {
    const out = new Map<string, Verdict>();
    for (const r of rows) {
      if (r.state === "recycling" && r.recycleSince !== null) {
        const age = ctx.now - r.recycleSince;
        if (age >= ctx.graceMs) {
          out.set(keyOf(r), {
            reason: `pod "${r.pod}" has a newer container and this one's DEL did not come in ${
              Math.round(age / 1000)
            }s`,
          });
        }
      }
    }
    return Promise.resolve(out);
  },
};
