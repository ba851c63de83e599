/**
 * One attachment under policy (a pod's ENI and its host link) as the enforcer keeps it,
 * and the small readings of a compiled policy the enforcer's parts share.
 *
 * @module
 */
import type { CompiledPolicy } from "../../policy/mod.ts";
import type { TableFinding, TableMark } from "../../netns/table_check.ts";

/** One attachment under policy: a pod's ENI and its host link. */
export interface Att {
  key: string;
  /** `namespace/name`. */
  pod: string;
  /** The pod's uid (CNI_ARGS `K8S_POD_UID`; null: the runtime did not say). */
  uid: string | null;
  namespace: string;
  name: string;
  ips: string[];
  /** The ENI's name in the pod. */
  eni: string;
  /** The host link's node end. */
  nodeEnd: string;
  /** The pod's namespace; null until the ADD has recorded it (`committed`). */
  netns: string | null;
  /** Registration order (the newest attachment of a pod gives the pod its addresses). */
  seq: number;
  /** What the pod's table holds, as last rendered there (null: not known to this agent). */
  loaded: CompiledPolicy | null;
  /**
   * The pod's policy as last compiled (its rules current: compiled again whenever they
   * change; its sets' members may lag behind the deltas): what the node's incremental
   * updates and the status read, without materializing every set again.
   */
  compiled: CompiledPolicy | null;
  /** The pod's table missed an edit (no namespace yet, a failed load): render it again. */
  stale: boolean;
  /** The compiler knows it (false: not synced yet, or the pod is not in the cluster). */
  registered: boolean;
  /** A restored pod the cluster does not have: its tables stay as they are. */
  unknown: boolean;
  /** Known to have no table in its namespace (ADDed while no policy selected it). */
  noTable?: boolean;
  /**
   * What its raw-socket guard (`policy/raw_guard.ts`) holds: true dropping, false empty,
   * undefined not known to this agent (loaded again with its table's next render).
   */
  guard?: boolean;
  /** The node's load that put its chains in place (prepare's). */
  nodeReady?: Promise<boolean>;
  /**
   * Its chains may be on the node (false: known not to be): it was restored (an earlier
   * agent may have left them), or a load of them was made and no later one deleted them.
   */
  nodeChains?: boolean;
  /** What the last check of its table saw (`_table_check.ts`). */
  checked?: TableMark | null;
  /** A check found its table missing or changed: not enforced until a render has loaded. */
  broken?: boolean;
  /** The check of its table queued or running. */
  checking?: Promise<TableFinding>;
}

/**
 * A compiled policy without its sets' members: all that a `previous` render, the node's
 * update of an unchanged pod and the status read (rules, set keys and kinds). Keeping
 * the members of every pod's big sets three times over cost the agent tens of MB.
 */
export const light = (c: CompiledPolicy): CompiledPolicy => ({
  ...c,
  sets: c.sets.map((s) => ({ ...s, ipv4: [], ipv6: [] }) as typeof s),
});

/**
 * Whether a policy isolates the pod in some direction. A pod no policy selects (most pods
 * of most clusters) gets no table in its namespace and no chains on the node: what is not
 * jumped to is accepted. Its table and chains are made when a policy first selects it.
 */
export const isolates = (c: CompiledPolicy): boolean => c.ingress.isolated || c.egress.isolated;

/** The local pod of an attachment, for the engine (its uid: the pod it must be). */
export const localOf = (att: Att, ips: string[], uid: string | null) => ({
  namespace: att.namespace,
  name: att.name,
  ips,
  ...(uid !== null ? { uid } : {}),
});

/** Whether two address lists hold the same addresses, in any order. */
export const sameSet = (a: string[], b: string[]): boolean =>
  a.length === b.length && [...a].sort().join() === [...b].sort().join();

/** The newest attachment of `pod` among `atts` (it gives the pod its addresses). */
export function newestOf(atts: Iterable<Att>, pod: string): Att | undefined {
  let best: Att | undefined;
  for (const a of atts) {
    if (a.pod === pod && (!best || a.seq > best.seq)) best = a;
  }
  return best;
}
