/**
 * One NetworkPolicy, prepared once for every compile that reads it: canonical
 * selectors, the directions it applies to (`policyTypes` and its default), its rules
 * with their peers resolved to peer definitions and stable keys, and the warnings of
 * what it says that cannot match anything.
 *
 * Readings of `networking.k8s.io/v1` (types.go and the NetworkPolicy concept page):
 *
 * - `policyTypes` absent (or empty): Ingress always, Egress when `egress` has a rule.
 * - A peer with `podSelector` alone selects pods of the policy's own namespace; with
 *   `namespaceSelector` alone, every pod of the selected namespaces; with both, the pods
 *   matching the pod selector in the selected namespaces (AND). Separate peers are ORed.
 * - `from`/`to` absent or empty: every source/destination; `ports` absent or empty:
 *   every port of every protocol.
 * - `ipBlock` stands alone; a peer that mixes it with a selector, or has nothing, is
 *   invalid (the API server rejects both) and matches nothing.
 * - A policy enim cannot read (kube/objects.ts keeps it, `unreadable` set, its spec
 *   the fail-closed one: its own podSelector or `{}`, its directions, no rule) isolates
 *   and admits nothing, and says so in a warning.
 *
 * @module
 */
import type { NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort } from "../kube/objects.ts";
import { type Requirement, requirements, selectorText, stableKey } from "./_selector.ts";
import { blockPrefixes } from "./_blocks.ts";

/**
 * A set of pods by selectors: those of `namespace`, or of the namespaces
 * `namespaceSelector` selects (exactly one of the two), that `pods` selects.
 */
export interface PodDef {
  namespace?: string;
  namespaceSelector?: Requirement[];
  pods: Requirement[];
}

/** Every pod of every namespace (the destinations of an egress rule with no `to`). */
export const ALL_PODS: PodDef = { namespaceSelector: [], pods: [] };

/** A peer, resolved: a pod set by its definition, or an ipBlock's prefixes. */
export type PreparedPeer =
  | { kind: "pods"; key: string; def: PodDef; text: string }
  | { kind: "ipBlock"; key: string; text: string; family: 4 | 6; prefixes: string[] };

/** A rule: its peers (null: any) and its ports (null: all). */
export interface PreparedRule {
  peers: PreparedPeer[] | null;
  ports: NetworkPolicyPort[] | null;
}

/** A NetworkPolicy as the compiler reads it. */
export interface PreparedPolicy {
  namespace: string;
  name: string;
  podSelector: Requirement[];
  ingress: boolean;
  egress: boolean;
  ingressRules: PreparedRule[];
  egressRules: PreparedRule[];
  warnings: string[];
  /** Why it cannot be read (it then isolates and admits nothing); absent when it can. */
  unreadable?: string;
}

/** The stable key of a pod set (`p…`). */
export function podDefKey(def: PodDef): string {
  return stableKey("p", def);
}

/** The stable key of a named-port set (`n…`): a pod set, a protocol and a port name. */
export function namedPortKey(def: PodDef, protocol: string, name: string): string {
  return stableKey("n", { def, protocol, name });
}

/** What a pod set is, for people. */
export function podDefText(def: PodDef): string {
  const where = def.namespace !== undefined
    ? `namespace ${def.namespace}`
    : def.namespaceSelector!.length === 0
    ? "all namespaces"
    : `namespaces ${selectorText(def.namespaceSelector!)}`;
  return `pods ${selectorText(def.pods)} in ${where}`;
}

/**
 * ipBlocks already cut into prefixes, by their text: clusters repeat the same blocks in
 * many policies (bounded: emptied past 4096 entries).
 */
const BLOCKS = new Map<string, ReturnType<typeof blockPrefixes>>();

function cachedBlock(cidr: string, except: string[]): ReturnType<typeof blockPrefixes> {
  const k = JSON.stringify([cidr, except]);
  let b = BLOCKS.get(k);
  if (b === undefined) {
    if (BLOCKS.size >= 4096) BLOCKS.clear();
    BLOCKS.set(k, b = blockPrefixes(cidr, except));
  }
  return b;
}

function preparePeer(
  peer: NetworkPolicyPeer,
  namespace: string,
  warn: (w: string) => void,
): PreparedPeer | null {
  if (peer.ipBlock) {
    if (peer.podSelector || peer.namespaceSelector) {
      warn("a peer has ipBlock and a selector: it matches nothing");
      return null;
    }
    const { cidr, except = [] } = peer.ipBlock;
    // kube/objects.ts has checked that both are CIDRs (a policy with one that is not
    // cannot be read, and admits nothing).
    const block = cachedBlock(cidr, except);
    if (!block) {
      warn(`ipBlock cidr "${cidr}" is no CIDR: the peer matches nothing`);
      return null;
    }
    for (const bad of block.invalid) {
      // The API server refuses an except outside the block; one of the other family
      // holds no address of the block, and cuts nothing.
      warn(`ipBlock except "${bad}" is of the other family: it cuts nothing`);
    }
    const text = `ipBlock ${cidr}${except.length ? ` except ${except.join(", ")}` : ""}`;
    return {
      kind: "ipBlock",
      key: stableKey("b", { family: block.family, prefixes: block.prefixes }),
      text,
      family: block.family,
      prefixes: block.prefixes,
    };
  }
  if (!peer.podSelector && !peer.namespaceSelector) {
    warn("a peer has no selector and no ipBlock: it matches nothing");
    return null;
  }
  const pods = peer.podSelector ? requirements(peer.podSelector) : [];
  const def: PodDef = peer.namespaceSelector
    ? { namespaceSelector: requirements(peer.namespaceSelector), pods }
    : { namespace, pods };
  return { kind: "pods", key: podDefKey(def), def, text: podDefText(def) };
}

function prepareRule(
  peers: NetworkPolicyPeer[] | undefined,
  ports: NetworkPolicyPort[] | undefined,
  namespace: string,
  warn: (w: string) => void,
): PreparedRule {
  return {
    peers: peers && peers.length > 0
      ? peers.map((p) => preparePeer(p, namespace, warn)).filter((p) => p !== null)
      : null,
    ports: ports && ports.length > 0 ? ports : null,
  };
}

/** The directions a policy applies to: its `policyTypes`, or their default. */
function policyTypes(p: NetworkPolicy): string[] {
  return p.spec.policyTypes && p.spec.policyTypes.length > 0
    ? p.spec.policyTypes
    : ["Ingress", ...((p.spec.egress?.length ?? 0) > 0 ? ["Egress"] : [])];
}

/** What a NetworkPolicy enim cannot read does instead: it isolates, and admits nothing. */
export interface UnreadablePolicy {
  /** `namespace/name`. */
  policy: string;
  resourceVersion: string | null;
  /** What could not be read, `path: message`. */
  reason: string;
  /** The pods it isolates in its namespace, as a selector's text (`<all>`: every pod). */
  selects: string;
  /** Its podSelector cannot be read: every pod of its namespace is isolated. */
  wholeNamespace: boolean;
  ingress: boolean;
  egress: boolean;
}

/** What an unreadable policy does (null for a policy enim reads). */
export function unreadablePolicy(p: NetworkPolicy): UnreadablePolicy | null {
  if (!p.unreadable) return null;
  const types = policyTypes(p);
  return {
    policy: `${p.metadata.namespace ?? "default"}/${p.metadata.name}`,
    resourceVersion: p.metadata.resourceVersion ?? null,
    reason: p.unreadable.reason,
    selects: selectorText(requirements(p.spec.podSelector)),
    wholeNamespace: p.unreadable.wholeNamespace,
    ingress: types.includes("Ingress"),
    egress: types.includes("Egress"),
  };
}

/** What an unreadable policy does, in words (the warning, the log line). */
export function unreadableText(u: UnreadablePolicy): string {
  const who = u.wholeNamespace ? "every pod of its namespace" : `the pods ${u.selects}`;
  const dirs = [u.ingress ? "ingress" : "", u.egress ? "egress" : ""].filter(Boolean);
  return `cannot be read (${u.reason}): it isolates ${who} for ${
    dirs.join(" and ")
  } and admits nothing`;
}

/** Prepares a NetworkPolicy (pure). */
export function preparePolicy(p: NetworkPolicy): PreparedPolicy {
  const namespace = p.metadata.namespace ?? "default";
  const warnings: string[] = [];
  const warn = (w: string) => warnings.push(`${p.metadata.name}: ${w}`);
  const types = policyTypes(p);
  const unreadable = unreadablePolicy(p);
  if (unreadable) warn(unreadableText(unreadable));
  return {
    namespace,
    name: p.metadata.name,
    podSelector: requirements(p.spec.podSelector),
    ingress: types.includes("Ingress"),
    egress: types.includes("Egress"),
    ingressRules: (p.spec.ingress ?? []).map((r) => prepareRule(r.from, r.ports, namespace, warn)),
    egressRules: (p.spec.egress ?? []).map((r) => prepareRule(r.to, r.ports, namespace, warn)),
    warnings,
    ...(p.unreadable ? { unreadable: p.unreadable.reason } : {}),
  };
}
