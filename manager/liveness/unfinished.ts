/**
 * Releases that did not finish (state `deleting`): GC finishes them.
 *
 * @module
 */
import { keyOf } from "../../providers/schema.ts";
import type { LivenessSource, Verdict } from "./types.ts";

/** Releases that failed half way (state `deleting`): finish them. */
export const unfinishedLiveness: LivenessSource = {
  name: "unfinished",
  dead(rows) {
    const out = new Map<string, Verdict>();
    for (const r of rows) {
      if (r.state === "deleting") {
        out.set(keyOf(r), {
          reason: `an earlier release did not finish${r.lastError ? `: ${r.lastError}` : ""}`,
        });
      }
    }
    return Promise.resolve(out);
  },
};
