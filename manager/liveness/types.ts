/**
 * GC's liveness sources: each reports, among the attachments it is given, the
 * ones it knows to be dead, with a reason. One file per source; the agent's
 * wiring (`AgentDeps.livenessSources`) may add more (a Kubernetes source asking
 * the API server which pods exist would be one file and one line there).
 *
 * @module
 */
import type { DeviceLayer } from "../../netns/types.ts";
import type { AttachmentRow } from "../state.ts";
import type { GcInput } from "../types.ts";

/** What a liveness source gets besides the attachments. */
export interface LivenessContext {
  /** Now, epoch milliseconds. */
  now: number;
  graceMs: number;
  /** The GC request (carries the CNI GC verb's network and valid attachments). */
  request: GcInput;
  devices: DeviceLayer;
}

/** A death certificate: why the attachment is dead, and whether its netns can still be used. */
export interface Verdict {
  reason: string;
  /** False when the recorded netns path is gone or now names another namespace. */
  netnsUsable?: boolean;
}

/** A source of liveness facts: returns the dead ones among `attachments`, by `keyOf`. */
export interface LivenessSource {
  name: string;
  dead(attachments: AttachmentRow[], ctx: LivenessContext): Promise<Map<string, Verdict>>;
}
