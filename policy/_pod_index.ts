/**
 * The compiler's index of the cluster's pods and namespaces: each pod's labels, named
 * ports and the addresses it contributes to peer sets, by namespace and by label key
 * and value, so that a selector's members are found from the pods that carry its most
 * selective label rather than by a scan of every pod.
 *
 * Which addresses a pod contributes (readings of the NetworkPolicy concept page):
 * a pod that has addresses and has not terminated (phase Succeeded or Failed) — a
 * Pending pod's init containers already talk, and policy applies to them too; none
 * for a `hostNetwork` pod, which has its node's addresses and is a peer by address like
 * the node (an ipBlock can name it; selectors ignore it, as most implementations do).
 * A local pod's addresses are the ones enim assigned (kubelet writes `status.podIPs`
 * only after ADD), given as an override.
 *
 * @module
 */
import type { Pod } from "../kube/objects.ts";
import { type Addr, parseAddr } from "./_addr.ts";
import { type Labels, matches, type Requirement } from "./_selector.ts";

/** A pod as the index keeps it. */
export interface PodRec {
  key: string;
  namespace: string;
  labels: Labels;
  ports: Pod["ports"];
  /** The IPv4 and IPv6 addresses it contributes (sorted by key; empty when none). */
  a4: Addr[];
  a6: Addr[];
  pod: Pod;
}

/** `namespace/name`, the key of a pod everywhere in policy/. */
export function podKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

const byKey = (x: Addr, y: Addr) => (x.key < y.key ? -1 : x.key > y.key ? 1 : 0);

/** One shared empty address list (most pods have one family): never written to. */
const NO_ADDRS: Addr[] = Object.freeze([]) as never;

/** Parsed addresses by family, sorted and unique; what is no address is dropped. */
export function splitAddrs(ips: readonly string[]): { a4: Addr[]; a6: Addr[] } {
  const a4: Addr[] = [], a6: Addr[] = [];
  for (const s of ips) {
    const a = parseAddr(s.trim());
    if (!a) continue;
    const list = a.family === 4 ? a4 : a6;
    if (!list.some((b) => b.text === a.text)) list.push(a);
  }
  if (a4.length > 1) a4.sort(byKey);
  if (a6.length > 1) a6.sort(byKey);
  // Copies of exactly their length: a list built by push keeps room for 16 more (152
  // bytes per pod of the index, kept as long as the pod).
  return { a4: a4.length ? a4.slice() : NO_ADDRS, a6: a6.length ? a6.slice() : NO_ADDRS };
}

/**
 * The pods with one label value: the pod alone while it is the only one (a label unique
 * to each pod, a StatefulSet's pod name, costs no collection), a short array up to
 * {@linkcode POSTING_ARRAY_MAX} pods (a third of a Set's size), a Set beyond.
 */
type Posting = PodRec | PodRec[] | Set<PodRec>;
const POSTING_ARRAY_MAX = 16;

function postingSize(p: Posting): number {
  return p instanceof Set ? p.size : Array.isArray(p) ? p.length : 1;
}

function* postingPods(p: Posting): Iterable<PodRec> {
  if (p instanceof Set || Array.isArray(p)) yield* p;
  else yield p;
}

/** `p` with `rec` added. */
function postingAdd(p: Posting | undefined, rec: PodRec): Posting {
  if (p === undefined) return rec;
  if (p instanceof Set) return p.add(rec);
  // A new array each time: exactly its length (a push would leave room for 16 more).
  if (!Array.isArray(p)) return [p, rec];
  return p.length < POSTING_ARRAY_MAX ? [...p, rec] : new Set([...p, rec]);
}

/** `p` without `rec` (undefined: empty). */
function postingRemove(p: Posting, rec: PodRec): Posting | undefined {
  if (p instanceof Set) {
    p.delete(rec);
    return p.size > POSTING_ARRAY_MAX / 2 ? p : p.size === 0 ? undefined : [...p];
  }
  if (!Array.isArray(p)) return p === rec ? undefined : p;
  const left = p.filter((r) => r !== rec);
  return left.length > 1 ? left : left[0];
}

/** Canonical addresses by family, sorted and unique; what is no address is dropped. */
export function splitFamilies(ips: readonly string[]): { v4: string[]; v6: string[] } {
  const { a4, a6 } = splitAddrs(ips);
  return { v4: a4.map((a) => a.text), v6: a6.map((a) => a.text) };
}

/** Pods by namespace and label, and namespaces' labels. */
export class PodIndex {
  readonly pods = new Map<string, PodRec>();
  readonly #byNamespace = new Map<string, Map<string, PodRec>>();
  /** namespace → label key → value → pods. */
  readonly #byLabel = new Map<string, Map<string, Map<string, Posting>>>();
  readonly #nsLabels = new Map<string, Labels>();
  /** Local pods' addresses, as enim assigned them. */
  readonly #overrides = new Map<string, string[]>();

  /** Forgets every pod and namespace (local pods' addresses stay). */
  clear(): void {
    this.pods.clear();
    this.#byNamespace.clear();
    this.#byLabel.clear();
    this.#nsLabels.clear();
  }

  /** The record of `pod` as it would be indexed now (its addresses by the rules above). */
  record(pod: Pod): PodRec {
    const namespace = pod.metadata.namespace ?? "default";
    const key = podKey(namespace, pod.metadata.name);
    const override = this.#overrides.get(key);
    const eligible = !pod.hostNetwork && pod.phase !== "Succeeded" && pod.phase !== "Failed";
    const { a4, a6 } = override
      ? splitAddrs(override)
      : eligible && pod.ips.length > 0
      ? splitAddrs(pod.ips)
      : { a4: NO_ADDRS, a6: NO_ADDRS };
    return { key, namespace, labels: pod.metadata.labels, ports: pod.ports, a4, a6, pod };
  }

  /** Sets (or with null clears) the addresses a local pod contributes. */
  setOverride(key: string, ips: string[] | null): void {
    if (ips) this.#overrides.set(key, ips);
    else this.#overrides.delete(key);
  }

  /** Puts a record in (replacing the pod's earlier one); returns the earlier one. */
  put(rec: PodRec): PodRec | undefined {
    const old = this.remove(rec.key);
    this.pods.set(rec.key, rec);
    let inNs = this.#byNamespace.get(rec.namespace);
    if (!inNs) this.#byNamespace.set(rec.namespace, inNs = new Map());
    inNs.set(rec.key, rec);
    let keys = this.#byLabel.get(rec.namespace);
    if (!keys) this.#byLabel.set(rec.namespace, keys = new Map());
    for (const [k, v] of Object.entries(rec.labels ?? {})) {
      let values = keys.get(k);
      if (!values) keys.set(k, values = new Map());
      values.set(v, postingAdd(values.get(v), rec));
    }
    return old;
  }

  /** Takes a pod's record out; returns it. */
  remove(key: string): PodRec | undefined {
    const rec = this.pods.get(key);
    if (!rec) return undefined;
    this.pods.delete(key);
    const inNs = this.#byNamespace.get(rec.namespace)!;
    inNs.delete(key);
    if (inNs.size === 0) this.#byNamespace.delete(rec.namespace);
    // A namespace's label postings go with its last labelled pod, maybe before this
    // pod (without labels) goes.
    const keys = this.#byLabel.get(rec.namespace);
    if (!keys) return rec;
    for (const [k, v] of Object.entries(rec.labels ?? {})) {
      const values = keys.get(k)!;
      const left = postingRemove(values.get(v)!, rec);
      if (left === undefined) values.delete(v);
      else values.set(v, left);
      if (values.size === 0) keys.delete(k);
    }
    if (keys.size === 0) this.#byLabel.delete(rec.namespace);
    return rec;
  }

  /** A namespace's labels (absent namespace: none). */
  namespaceLabels(name: string): Labels {
    return this.#nsLabels.get(name);
  }

  /** Sets (or with undefined forgets) a namespace's labels; returns the earlier ones. */
  setNamespaceLabels(name: string, labels: Labels | null): Labels {
    const old = this.#nsLabels.get(name);
    if (labels === null) this.#nsLabels.delete(name);
    else this.#nsLabels.set(name, labels ?? {});
    return old;
  }

  /** The pods of a namespace. */
  podsIn(namespace: string): Iterable<PodRec> {
    return this.#byNamespace.get(namespace)?.values() ?? [];
  }

  /** The namespaces that hold pods, or the one given, whose labels `nsSelector` matches. */
  namespacesMatching(nsSelector: readonly Requirement[]): string[] {
    return [...this.#byNamespace.keys()].filter((ns) =>
      matches(nsSelector, this.#nsLabels.get(ns))
    );
  }

  /**
   * The pods of `namespace` that `reqs` select: candidates from the smallest posting
   * list an `In` or `Exists` requirement names (every pod of the namespace when none
   * does), then each checked against every requirement.
   */
  *select(namespace: string, reqs: readonly Requirement[]): Iterable<PodRec> {
    const all = this.#byNamespace.get(namespace);
    if (!all) return;
    const keys = this.#byLabel.get(namespace);
    let best: Posting[] | null = null;
    let bestSize = all.size;
    for (const r of reqs) {
      if (r.operator !== "In" && r.operator !== "Exists") continue;
      const values = keys?.get(r.key);
      const lists = !values
        ? []
        : r.operator === "In"
        ? r.values.map((v) => values.get(v)).filter((s) => s !== undefined)
        : [...values.values()];
      const size = lists.reduce((n, s) => n + postingSize(s), 0);
      if (size < bestSize || best === null && size <= bestSize) {
        best = lists;
        bestSize = size;
      }
    }
    // A pod has one value per key, so the lists of one requirement are disjoint.
    const candidates = best ? best.flatMap((s) => [...postingPods(s)]) : all.values();
    for (const rec of candidates) if (matches(reqs, rec.labels)) yield rec;
  }
}
