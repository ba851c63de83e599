/**
 * The compiler's index of the cluster's pods and namespaces: each pod's labels, named
 * ports and the addresses it contributes to peer sets, by namespace and by label key
 * and value, so that a selector's members are found from the pods that carry its most
 * selective label rather than by a scan of every pod.
 *
 * Which addresses a pod contributes, its identity at each address:
 *
 * - A local pod contributes the addresses enim gave it (kubelet writes `status.podIPs`
 *   only after ADD), and only those, while its API object is the same pod (its uid).
 * - Any other pod contributes the addresses its API object lists while it lends them
 *   (`lendsAddresses` of `_local_addrs.ts`: not finished, not `hostNetwork`, not deleted
 *   without grace), less those local truth says are not its: an address a local pod
 *   holds, an address the pod let go on this node (`_local_addrs.ts`).
 * - An address two pods' API objects list, neither of them let go here and no local pod
 *   holds, is contested: the API cannot say whose it is (the old pod's status not final
 *   yet, the new one's written), so neither contributes it (fail closed: a policy that
 *   admits one of them admits that address from neither) until one of them stops
 *   listing it.
 *
 * @module
 */
import type { Pod } from "../kube/objects.ts";
import { type Addr, parseAddr } from "./_addr.ts";
import { type Labels, matches, namespaceMatches, type Requirement } from "./_selector.ts";
import { lendsAddresses, LocalAddresses, sameUid } from "./_local_addrs.ts";

export { lendsAddresses } from "./_local_addrs.ts";

/** A pod as the index keeps it. */
export interface PodRec {
  key: string;
  namespace: string;
  labels: Labels;
  ports: Pod["ports"];
  /** The IPv4 and IPv6 addresses it contributes (sorted by key; empty when none). */
  a4: Addr[];
  a6: Addr[];
  /**
   * The addresses its API object lists and would lend, when they are not `a4` and `a6`
   * (a local pod's, or some not its here, or contested); null: the same.
   */
  listed: Addr[] | null;
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

/** The addresses a record's API object lists (and would lend). */
export function listedOf(rec: PodRec): Addr[] {
  return rec.listed ?? (rec.a6.length === 0 ? rec.a4 : [...rec.a4, ...rec.a6]);
}

/** Pods by namespace and label, and namespaces' labels. */
export class PodIndex {
  readonly pods = new Map<string, PodRec>();
  readonly #byNamespace = new Map<string, Map<string, PodRec>>();
  /** namespace → label key → value → pods. */
  readonly #byLabel = new Map<string, Map<string, Map<string, Posting>>>();
  readonly #nsLabels = new Map<string, Labels>();
  /** Address → the pods whose API objects list it (and would lend it). */
  readonly #listers = new Map<string, Posting>();
  /** Local truth: local pods' addresses, as enim assigned them, and what they let go. */
  readonly local = new LocalAddresses();

  /** Forgets every pod and namespace (local truth stays). */
  clear(): void {
    this.pods.clear();
    this.#byNamespace.clear();
    this.#byLabel.clear();
    this.#nsLabels.clear();
    this.#listers.clear();
  }

  /** The record of `pod` as it would be indexed now (its addresses by the rules above). */
  record(pod: Pod): PodRec {
    const namespace = pod.metadata.namespace ?? "default";
    const key = podKey(namespace, pod.metadata.name);
    const uid = pod.metadata.uid ?? null;
    const api = lendsAddresses(pod) && pod.ips.length > 0
      ? splitAddrs(pod.ips)
      : { a4: NO_ADDRS, a6: NO_ADDRS };
    const local = this.local.of(key);
    const labels = pod.metadata.labels, ports = pod.ports;
    if (local && sameUid(local.uid, uid)) {
      const { a4, a6 } = splitAddrs(local.ips);
      const listed = api.a6.length === 0 ? api.a4 : [...api.a4, ...api.a6];
      return { key, namespace, labels, ports, a4, a6, listed, pod };
    }
    const lend = (a: Addr) => this.#lends(a, key, uid);
    let a4 = api.a4, a6 = api.a6, listed: Addr[] | null = null;
    if (!a4.every(lend) || !a6.every(lend)) {
      listed = [...a4, ...a6];
      a4 = a4.filter(lend);
      a6 = a6.filter(lend);
      if (a4.length === 0) a4 = NO_ADDRS;
      if (a6.length === 0) a6 = NO_ADDRS;
    }
    return { key, namespace, labels, ports, a4, a6, listed, pod };
  }

  /** Whether the API object of pod `key` (`uid`) may lend `a` (see the module doc). */
  #lends(a: Addr, key: string, uid: string | null): boolean {
    if (!this.local.mayLend(a.text, key, uid)) return false;
    const others = this.#listers.get(a.text);
    if (others === undefined) return true;
    for (const o of postingPods(others)) {
      if (o.key === key) continue;
      if (!this.local.released(a.text, o.key, o.pod.metadata.uid ?? null)) return false;
    }
    return true;
  }

  /** The addresses the API objects of two pods or more list. */
  contested(): string[] {
    const out: string[] = [];
    for (const [a, p] of this.#listers) if (postingSize(p) > 1) out.push(a);
    return out;
  }

  /** The pods whose API objects list `addr` (canonical text). */
  listers(addr: string): PodRec[] {
    const p = this.#listers.get(addr);
    return p === undefined ? [] : [...postingPods(p)];
  }

  /** Puts a record in (replacing the pod's earlier one); returns the earlier one. */
  put(rec: PodRec): PodRec | undefined {
    const old = this.remove(rec.key);
    this.pods.set(rec.key, rec);
    for (const a of listedOf(rec)) {
      this.#listers.set(a.text, postingAdd(this.#listers.get(a.text), rec));
    }
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
    for (const a of listedOf(rec)) {
      const left = postingRemove(this.#listers.get(a.text)!, rec);
      if (left === undefined) this.#listers.delete(a.text);
      else this.#listers.set(a.text, left);
    }
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

  /** Every pod's record. */
  *all(): Iterable<PodRec> {
    for (const pods of this.#byNamespace.values()) yield* pods.values();
  }

  /** The pods of a namespace. */
  podsIn(namespace: string): Iterable<PodRec> {
    return this.#byNamespace.get(namespace)?.values() ?? [];
  }

  /** The namespaces that hold pods, or the one given, whose labels `nsSelector` matches. */
  namespacesMatching(nsSelector: readonly Requirement[]): string[] {
    return [...this.#byNamespace.keys()].filter((ns) =>
      namespaceMatches(nsSelector, this.#nsLabels.get(ns))
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
