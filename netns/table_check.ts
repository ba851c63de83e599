/**
 * The check of enim's nftables tables against what was loaded: the policy tables (the
 * node's `inet enim_policy` and each pod's, `agent/policy/enforcer.ts`) and the node's
 * host-link table (`inet enim`, `manager/host_link.ts`). Something other than this agent can take a table away (`nft flush
 * ruleset`, the first line of the default `/etc/nftables.conf`, run by every restart of
 * `nftables.service`; an operator's `nft delete table`), and the agent would otherwise
 * go on believing its last load. A check lists the table (`nft -t -j list table`: its
 * chains, rules and sets' declarations, not their elements) and compares it with what
 * the previous check saw when no load of that table has run between the two; a table
 * that is missing, or that changed while nothing of this agent's loaded it, is loaded
 * again whole, counted and logged.
 *
 * What it does not see: a set's elements edited by someone else (the terse listing
 * leaves them out; a whole listing of a cluster's big sets costs too much for a
 * periodic check), and a change made between a load and the next check (that check
 * takes what it sees as what was loaded).
 *
 * @module
 */
import * as z from "zod/mini";

/** What `nft -j list table` prints (each item one object: a table, chain, rule, set, ...). */
const ListingSchema = z.object({ nftables: z.array(z.record(z.string(), z.unknown())) });

/** Counter values, which the traffic changes, read as zero. */
const COUNTS = /"(packets|bytes)":\s*\d+/g;

/**
 * A table's shape from its listing (`nft -t -j list table`): everything but the listing's
 * metainfo and the counters' values, as one string to compare with an earlier one.
 */
export function tableShape(json: string): string {
  const items = ListingSchema.parse(JSON.parse(json)).nftables.filter((i) => !("metainfo" in i));
  return JSON.stringify(items).replace(COUNTS, '"$1":0');
}

/** What a check of one table saw last, and the count of its loads then (`TableLoads.runs`). */
export interface TableMark {
  shape: string;
  runs: number;
}

/** A check's finding: the table is as it was (or was loaded since), missing, or changed. */
export type TableFinding = "ok" | "missing" | "changed";

/**
 * Judges a table's listing (null: no such table) against the last check's mark, the
 * table's load count now being `runs`. Returns the finding and the mark to keep (null
 * after a finding that loads the table again).
 */
export function judgeTable(
  listing: string | null,
  mark: TableMark | null,
  runs: number,
): { finding: TableFinding; mark: TableMark | null } {
  if (listing === null) return { finding: "missing", mark: null };
  const shape = tableShape(listing);
  if (mark && mark.runs === runs && mark.shape !== shape) return { finding: "changed", mark: null };
  return { finding: "ok", mark: { shape, runs } };
}
