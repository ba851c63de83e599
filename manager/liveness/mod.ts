/**
 * The built-in liveness sources, and the types a new one implements.
 *
 * @module
 */
import type { LivenessSource } from "./types.ts";
import { netnsLiveness } from "./netns.ts";
import { cniGcLiveness } from "./cni_gc.ts";
import { recyclingLiveness } from "./recycling.ts";
import { unfinishedLiveness } from "./unfinished.ts";

export type { LivenessContext, LivenessSource, Verdict } from "./types.ts";
export { cniGcLiveness, netnsLiveness, recyclingLiveness, unfinishedLiveness };

/** The built-in liveness sources. */
export function defaultLivenessSources(): LivenessSource[] {
  return [unfinishedLiveness, netnsLiveness, cniGcLiveness, recyclingLiveness];
}
