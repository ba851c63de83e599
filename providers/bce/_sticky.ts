/**
 * The record a zone-sticky ENI carries in the cloud: its name and its
 * description are all another node needs to find it, to know whose it is and
 * how long it is kept (no CRD, no controller, no node-to-node channel).
 *
 * **Name.** `<namePrefix>/z/<clusterId>/<16 hex>`, the hex being the first 64
 * bits of SHA-256 over the cluster, the pod (`namespace/name`) and the
 * interface name. Deterministic, so a node looks a pod's ENI up with one
 * `GET /v1/eni?name=…` (matched exactly on our side too: whether BCE's filter
 * matches exactly, by prefix or fuzzily is unverified, reference §1.2). At most
 * 24 + 3 + 20 + 1 + 16 = 64 characters, inside BCE's 65, and of BCE's alphabet
 * (letters, digits, `- _ / .`, a letter first).
 *
 * **Description.** One line of at most 200 characters (BCE's limit):
 * `enim-sticky v1 <state> cluster=<id> if=<ifName> [until=<ISO>] by=<instanceId> pod=<ns/name>`.
 * `owned`: a pod of this cluster owns it on instance `by`; `parked`: it is
 * detached into the VPC, kept for the pod until `until`, by `by`. The pod comes
 * last and is cut (ending in `…`) when the line would be too long: the name's
 * hash is what identifies the pod, the description only confirms it.
 *
 * @module
 */
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";

/** The most characters BCE takes in a description (the fake enforces it too). */
export const DESCRIPTION_MAX = 200;

/** A cluster id: what keeps two clusters sharing a VPC from taking each other's pods' ENIs. */
export const ClusterIdSchema = z.string().check(
  z.regex(
    /^[A-Za-z0-9][A-Za-z0-9\-_.]{0,19}$/,
    "Expected a cluster id of at most 20 letters, digits, '-', '_' and '.'",
  ),
);

/** What a zone-sticky ENI's description records. */
export interface StickyRecord {
  state: "owned" | "parked";
  cluster: string;
  /** The pod, `namespace/name` (cut, ending in `…`, when it did not fit). */
  pod: string;
  ifName: string;
  /** Until when a parked ENI is kept for its pod (epoch ms); null for an owned one. */
  until: number | null;
  /** The instance that wrote the record (the owner's, or the one that parked it). */
  by: string;
}

const LINE =
  /^enim-sticky v1 (owned|parked) cluster=(\S+) if=(\S+)(?: until=(\S+))? by=(\S+) pod=(\S+)$/;

const RecordSchema = z.object({
  state: z.enum(["owned", "parked"]),
  cluster: ClusterIdSchema,
  pod: z.string().check(z.minLength(1)),
  ifName: z.string().check(z.minLength(1), z.maxLength(15)),
  until: z.nullable(z.number().check(z.int())),
  by: z.string().check(z.minLength(1)),
});

/** The description text of a record (at most {@linkcode DESCRIPTION_MAX} characters). */
export function encodeRecord(r: StickyRecord): string {
  const until = r.until === null ? "" : ` until=${new Date(r.until).toISOString()}`;
  const head =
    `enim-sticky v1 ${r.state} cluster=${r.cluster} if=${r.ifName}${until} by=${r.by} pod=`;
  const room = DESCRIPTION_MAX - head.length;
  const pod = r.pod.length <= room ? r.pod : `${r.pod.slice(0, Math.max(0, room - 1))}…`;
  return head + pod;
}

/** The record a description carries; null when it is none (or malformed). */
export function decodeRecord(description: string | null | undefined): StickyRecord | null {
  const m = LINE.exec(description ?? "");
  if (!m) return null;
  const until = m[4] === undefined ? null : Date.parse(m[4]);
  if (until !== null && !Number.isFinite(until)) return null;
  const r = RecordSchema.safeParse({
    state: m[1],
    cluster: m[2],
    ifName: m[3],
    until,
    by: m[5],
    pod: m[6],
  });
  if (!r.success) return null;
  if ((r.data.state === "parked") !== (r.data.until !== null)) return null;
  return r.data;
}

/**
 * Whether a description is a parked record: the ENI is kept for its pod, deleted
 * only when its hold expires (never as anyone's leftover).
 */
export function isParked(description: string | null | undefined): boolean {
  return decodeRecord(description)?.state === "parked";
}

/** Whether a record names `pod` (a cut pod name matches by its prefix). */
export function recordNames(r: StickyRecord, pod: string, ifName: string): boolean {
  if (r.ifName !== ifName) return false;
  return r.pod.endsWith("…") ? pod.startsWith(r.pod.slice(0, -1)) : r.pod === pod;
}

/** The prefix every zone-sticky name of a cluster starts with. */
export function stickyPrefix(namePrefix: string, cluster: string): string {
  return `${namePrefix}/z/${cluster}/`;
}

/** The deterministic cloud name of the pod's zone-sticky ENI (see the module doc). */
export async function stickyName(
  namePrefix: string,
  cluster: string,
  pod: string,
  ifName: string,
): Promise<string> {
  const data = new TextEncoder().encode(`${cluster}\n${pod}\n${ifName}`);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", data));
  const hex = Array.from(digest.slice(0, 8), (b) => b.toString(16).padStart(2, "0")).join("");
  return `${stickyPrefix(namePrefix, cluster)}${hex}`;
}

/** Whether a cloud name is a zone-sticky name (of any cluster) under `namePrefix`. */
export function isStickyName(namePrefix: string, name: string): boolean {
  return name.startsWith(`${namePrefix}/z/`);
}
