/**
 * Records as the agent's API returns them, for tests that build an agent's view by
 * hand (the stress checkers' unit tests).
 *
 * @module
 */
import type { Attachment } from "../../api/schema.ts";

/** The fields every hand-made attachment names; the rest default. */
export type AttachmentInput =
  & Pick<Attachment, "containerId" | "pod" | "network" | "netns" | "eniId" | "mac">
  & Partial<Attachment>;

/**
 * A ready attachment of `a.containerId`'s eth0 in interface mode, created and updated at
 * 2026-01-01T00:00:00.000Z on the default profile, not sticky, with no node name, hold,
 * park, host link or answered DEL unless `a` says otherwise.
 */
export function readyAttachment(a: AttachmentInput): Attachment {
  return {
    ifName: "eth0",
    podUid: null,
    mode: "interface",
    state: "ready",
    nodeName: null,
    createdAt: "2026-01-01T00:00:00.000Z",
    updatedAt: "2026-01-01T00:00:00.000Z",
    profile: "default",
    sticky: false,
    holdUntil: null,
    parkUntil: null,
    hostLink: null,
    delAnsweredAt: null,
    ...a,
  };
}
