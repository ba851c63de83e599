/**
 * The fence (issue 48 point 2): what keeps the node's Service and NodePort flows to and
 * from enim's pods judged while the node's policy table is gone. The node's table
 * (`inet enim_policy`, {@linkcode nodeRuleset}) judges what crosses a host link's node end
 * in the `forward` hook; anything with `CAP_NET_ADMIN` on the node can delete it (`nft
 * delete table`, a tool that owns the ruleset), and until the agent's next check loads it
 * again every such flow would be unjudged.
 *
 * So the node's table stamps every packet it lets through a node end: the first rules of
 * its `forward` chain set the judged bit of the packet mark (`networkPolicy.judgedMark`)
 * on what comes from or goes to a node end, which an `accept` of a later rule does not
 * skip and a `drop` makes moot. The fence,
 * table `inet enim_fence` of its own, runs after it in the same hook (priority `filter +
 * 10`) and drops the first packet of a connection (conntrack's `new`) that comes from or
 * goes to a node end (`iifgroup`/`oifgroup`: every node end is in the host links' link
 * group) and lacks the bit: a packet no policy table judged. Replies and packets of
 * connections already admitted pass (they were judged when they began).
 *
 * The fence is armed by one element of its set `armed` (the host links' link group)
 * which expires: the agent writes the set again at every table check
 * (`networkPolicy.tableCheckSeconds`), the element lasting {@linkcode fenceTimeoutSeconds}.
 * A fence outlives nothing that stamps for it: an agent that stops deletes it; one that
 * dies leaves it armed until the element expires, so an agent that knows no fence (an
 * older enim rolled back onto the node, whose table stamps nothing) finds it disarmed
 * that long after, and meanwhile new flows through node ends are dropped, not admitted.
 *
 * The fence does not survive what takes the node's whole ruleset (`nft flush ruleset`):
 * that window stays (docs/network_policy.md, "A table taken away").
 *
 * @module
 */
import { HOST_LINK_GROUP } from "../netns/host_link.ts";

/** The fence's table (family `inet`, in the node's namespace). */
export const FENCE_TABLE = "enim_fence";

/** The judged bit's default (`networkPolicy.judgedMark`). */
export const DEFAULT_JUDGED_MARK = 0x20000;

/** The counter of first packets the fence dropped (unjudged). */
export const FENCE_COUNTER = "drop_unjudged";

/** How long the fence stays armed after its last write: five checks, at least 10 s. */
export function fenceTimeoutSeconds(checkSeconds: number): number {
  return Math.max(10, Math.ceil(5 * checkSeconds));
}

const T = `inet ${FENCE_TABLE}`;
const hex = (n: number) => `0x${n.toString(16)}`;

/**
 * The fence's table, armed for `timeoutSeconds` (loaded in the node's namespace with
 * `nft -f`; idempotent: declared, its chain and set flushed and written again, in one
 * transaction).
 */
export function fenceRuleset(o: { mark: number; timeoutSeconds: number }): string {
  const m = hex(o.mark);
  const g = String(HOST_LINK_GROUP);
  return [
    `table ${T} {`,
    "\tset armed { type devgroup; flags timeout; }",
    `\tcounter ${FENCE_COUNTER} { }`,
    "\tchain forward { type filter hook forward priority filter + 10; policy accept; }",
    "}",
    `flush chain ${T} forward`,
    `flush set ${T} armed`,
    `add element ${T} armed { ${g} timeout ${Math.max(1, Math.round(o.timeoutSeconds))}s }`,
    `add rule ${T} forward ct state established,related accept`,
    `add rule ${T} forward meta mark & ${m} == ${m} accept`,
    `add rule ${T} forward iifgroup @armed counter name ${FENCE_COUNTER} drop`,
    `add rule ${T} forward oifgroup @armed counter name ${FENCE_COUNTER} drop`,
    "",
  ].join("\n");
}

/** Takes the fence away (a no-op where it is not). */
export function fenceRemoval(): string {
  return `table ${T} {}\ndelete table ${T}\n`;
}

/**
 * The rules the node's policy table starts its `forward` chain with: the judged bit set
 * on what comes from or goes to a node end (never on another's packets).
 */
export function judgedStamp(mark: number): string[] {
  const g = String(HOST_LINK_GROUP);
  return [
    `iifgroup ${g} meta mark set meta mark | ${hex(mark)}`,
    `oifgroup ${g} meta mark set meta mark | ${hex(mark)}`,
  ];
}
