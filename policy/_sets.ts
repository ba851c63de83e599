/**
 * The peer sets the local pods use, with their members: each set counts, per element,
 * how many pods contribute it (two pods may share an address for a moment, a pod may
 * have one port under a name in two containers), so that a pod's change moves exactly
 * its own contribution and reports the elements that appeared or vanished.
 *
 * Sets are shared: one per stable key, whoever uses it; created (members found through
 * the index) when a first local pod uses it, dropped when the last stops.
 *
 * @module
 */
import type { Protocol } from "../kube/objects.ts";
import { matches, namespaceMatches } from "./_selector.ts";
import type { PodDef } from "./_prepare.ts";
import type { PodIndex, PodRec } from "./_pod_index.ts";
import type { SetSpec } from "./_rules.ts";
import type { AddrPort, PeerSet, SetDelta } from "./types.ts";

/** An element: its text (an address, or `address#port`) and its sort key. */
interface Elem {
  text: string;
  key: string;
}

/** How many pods contribute an element, and its sort key. */
interface Counted {
  n: number;
  key: string;
}

/** A set whose members follow pods: element → how many pods contribute it. */
interface DynSet {
  kind: "pods" | "namedPort";
  key: string;
  def: PodDef;
  text: string;
  protocol?: Protocol;
  portName?: string;
  c4: Map<string, Counted>;
  c6: Map<string, Counted>;
  /**
   * The members sorted, per family, as {@linkcode SetStore.peerSet} last returned them
   * (kept up to date by copies as members come and go: a list once returned never
   * changes): sorting thousands of members took a pod's ADD 6 ms, for a set other local
   * pods held already.
   */
  sorted: [v4: readonly string[] | undefined, v6: readonly string[] | undefined];
  /** Copies made since the lists were last asked for (past {@linkcode RESORT_LIMIT}, dropped). */
  resorts?: number;
  users: Set<string>;
}

interface BlockSet {
  kind: "ipBlock";
  key: string;
  text: string;
  v4: string[];
  v6: string[];
  users: Set<string>;
}

type SetState = DynSet | BlockSet;

const NONE: [Elem[], Elem[]] = [[], []];

/**
 * How many members may come or go between two reads of a set's sorted lists before the
 * lists are dropped (sorted again when next read): a namespace's label change moves
 * thousands of members at once, and one copy each would cost more than a sort.
 */
const RESORT_LIMIT = 16;

/** Element edits of sets during one change (net: an add then a delete cancels). */
export class DeltaLog {
  /** Per set: [IPv4, IPv6] edits, element → sort key. */
  readonly edits = new Map<DynSet, { add: Map<string, string>; del: Map<string, string> }[]>();
  /** Addresses a pod stopped contributing (it let them go, or they are not its any more). */
  readonly lost = new Set<string>();

  /** Notes that `el` appeared in (or vanished from) `s`. */
  note(s: DynSet, family: 4 | 6, el: Elem, added: boolean): void {
    let e = this.edits.get(s);
    if (!e) {
      e = [{ add: new Map(), del: new Map() }, { add: new Map(), del: new Map() }];
      this.edits.set(s, e);
    }
    const f = e[family === 4 ? 0 : 1];
    const [mine, other] = added ? [f.add, f.del] : [f.del, f.add];
    if (other.has(el.text)) other.delete(el.text);
    else mine.set(el.text, el.key);
  }
}

/** Element texts sorted by their keys. */
function sorted(m: Iterable<[string, string | Counted]>): string[] {
  return [...m].map(([t, k]) => [typeof k === "string" ? k : k.key, t])
    .sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0)).map(([, t]) => t);
}

function addrPort(el: string): AddrPort {
  const i = el.lastIndexOf("#");
  return { addr: el.slice(0, i), port: Number(el.slice(i + 1)) };
}

/** The sets in use and their members. */
export class SetStore {
  readonly #index: PodIndex;
  readonly #sets = new Map<string, SetState>();
  /** Pod sets scoped to one namespace (a podSelector alone), by namespace. */
  readonly #scoped = new Map<string, Set<DynSet>>();
  /** Pod sets with a namespace selector. */
  readonly #global = new Set<DynSet>();

  constructor(index: PodIndex) {
    this.#index = index;
  }

  /** Forgets every set. */
  clear(): void {
    this.#sets.clear();
    this.#scoped.clear();
    this.#global.clear();
  }

  /** The local pods that use set `key`, sorted. */
  users(key: string): string[] {
    return [...(this.#sets.get(key)?.users ?? [])].sort();
  }

  /** `user` uses the set of `spec` (created with its members when new). */
  acquire(spec: SetSpec, user: string): void {
    let s = this.#sets.get(spec.key);
    if (!s) {
      s = spec.kind === "ipBlock" ? this.#block(spec) : this.#dynamic(spec);
      this.#sets.set(spec.key, s);
    }
    s.users.add(user);
  }

  /** `user` stops using set `key` (dropped when nobody uses it). */
  release(key: string, user: string): void {
    const s = this.#sets.get(key);
    if (!s) return;
    s.users.delete(user);
    if (s.users.size > 0) return;
    this.#sets.delete(key);
    if (s.kind === "ipBlock") return;
    if (s.def.namespace === undefined) this.#global.delete(s);
    else {
      const inNs = this.#scoped.get(s.def.namespace)!;
      inNs.delete(s);
      if (inNs.size === 0) this.#scoped.delete(s.def.namespace);
    }
  }

  /** A pod's record changed from `before` to `after` (either absent): move its contribution. */
  movePod(before: PodRec | undefined, after: PodRec | undefined, log: DeltaLog): void {
    const namespace = (after ?? before)?.namespace;
    if (namespace === undefined) return;
    for (const s of this.#scoped.get(namespace) ?? []) this.#adjust(s, before, after, log);
    for (const s of this.#global) this.#adjust(s, before, after, log);
  }

  /**
   * Namespace `name`'s labels changed (the index holds the new ones): its pods enter or
   * leave the namespace-selector sets whose selector changed its mind.
   */
  namespaceChanged(
    name: string,
    was: Record<string, string> | undefined,
    now: Record<string, string> | undefined,
    log: DeltaLog,
  ): void {
    for (const s of this.#global) {
      const before = namespaceMatches(s.def.namespaceSelector!, was);
      const after = namespaceMatches(s.def.namespaceSelector!, now);
      if (before === after) continue;
      for (const rec of this.#index.select(name, s.def.pods)) {
        this.#adjust(s, before ? rec : undefined, after ? rec : undefined, log, true);
      }
    }
  }

  /** Set `key` with its current members, sorted (with `members` false: none, an empty list). */
  peerSet(key: string, members = true): PeerSet {
    const s = this.#sets.get(key);
    if (!s) throw new Error(`No peer set "${key}" is in use`);
    if (s.kind === "ipBlock") {
      return { key: s.key, kind: "ipBlock", text: s.text, ipv4: s.v4, ipv6: s.v6 };
    }
    // Shared arrays (the cache's): no reader changes a set's member list.
    if (members) s.resorts = 0;
    const v4 = members ? (s.sorted[0] ??= sorted(s.c4)) as string[] : [];
    const v6 = members ? (s.sorted[1] ??= sorted(s.c6)) as string[] : [];
    if (s.kind === "pods") return { key: s.key, kind: "pods", text: s.text, ipv4: v4, ipv6: v6 };
    return {
      key: s.key,
      kind: "namedPort",
      text: s.text,
      protocol: s.protocol!,
      portName: s.portName!,
      ipv4: v4.map(addrPort),
      ipv6: v6.map(addrPort),
    };
  }

  /**
   * The deltas a log holds, for sets that existed before its change and still do (a set
   * created meanwhile came with its members; one dropped needs no edit); `users` leaves
   * out `skip`, the local pods rendered again anyway.
   */
  deltas(log: DeltaLog, skip: Set<string>): SetDelta[] {
    const out: SetDelta[] = [];
    for (const [s, [f4, f6]] of log.edits) {
      if (this.#sets.get(s.key) !== s) continue;
      if (f4.add.size + f4.del.size + f6.add.size + f6.del.size === 0) continue;
      const users = [...s.users].filter((u) => !skip.has(u)).sort();
      if (s.kind === "pods") {
        const list = (x: Map<string, string>) => sorted(x);
        out.push({
          key: s.key,
          kind: "pods",
          users,
          ipv4: { add: list(f4.add), delete: list(f4.del) },
          ipv6: { add: list(f6.add), delete: list(f6.del) },
        });
      } else {
        const list = (x: Map<string, string>) => sorted(x).map(addrPort);
        out.push({
          key: s.key,
          kind: "namedPort",
          users,
          ipv4: { add: list(f4.add), delete: list(f4.del) },
          ipv6: { add: list(f6.add), delete: list(f6.del) },
        });
      }
    }
    return out.sort((a, b) => (a.key < b.key ? -1 : 1));
  }

  #block(spec: Extract<SetSpec, { kind: "ipBlock" }>): BlockSet {
    return {
      kind: "ipBlock",
      key: spec.key,
      text: spec.text,
      v4: spec.family === 4 ? spec.prefixes : [],
      v6: spec.family === 6 ? spec.prefixes : [],
      users: new Set(),
    };
  }

  #dynamic(spec: Exclude<SetSpec, { kind: "ipBlock" }>): DynSet {
    const d: DynSet = {
      kind: spec.kind,
      key: spec.key,
      def: spec.def,
      text: spec.text,
      ...(spec.kind === "namedPort" ? { protocol: spec.protocol, portName: spec.portName } : {}),
      c4: new Map(),
      c6: new Map(),
      sorted: [undefined, undefined],
      users: new Set(),
    };
    const namespaces = d.def.namespace !== undefined
      ? [d.def.namespace]
      : this.#index.namespacesMatching(d.def.namespaceSelector!);
    for (const ns of namespaces) {
      for (const rec of this.#index.select(ns, d.def.pods)) {
        this.#adjust(d, undefined, rec, null, true);
      }
    }
    if (d.def.namespace !== undefined) {
      let inNs = this.#scoped.get(d.def.namespace);
      if (!inNs) this.#scoped.set(d.def.namespace, inNs = new Set());
      inNs.add(d);
    } else this.#global.add(d);
    return d;
  }

  /** The elements a pod gives a set: [IPv4, IPv6] (`inScope`: its namespace is known to be). */
  #contribution(s: DynSet, rec: PodRec | undefined, inScope?: boolean): [Elem[], Elem[]] {
    if (!rec) return NONE;
    const scoped = inScope ??
      (s.def.namespace !== undefined
        ? rec.namespace === s.def.namespace
        : namespaceMatches(s.def.namespaceSelector!, this.#index.namespaceLabels(rec.namespace)));
    if (!scoped || !matches(s.def.pods, rec.labels)) return NONE;
    if (s.kind === "pods") return [rec.a4, rec.a6];
    const ports = rec.ports
      .filter((p) => p.name === s.portName && (p.protocol ?? "TCP") === s.protocol)
      .map((p) => p.containerPort);
    if (ports.length === 0) return NONE;
    const with_ = (a: Elem) =>
      ports.map((p) => ({
        text: `${a.text}#${p}`,
        key: `${a.key}:${p.toString(16).padStart(4, "0")}`,
      }));
    return [rec.a4.flatMap(with_), rec.a6.flatMap(with_)];
  }

  #adjust(
    s: DynSet,
    before: PodRec | undefined,
    after: PodRec | undefined,
    log: DeltaLog | null,
    inScope?: boolean,
  ): void {
    const [o4, o6] = this.#contribution(s, before, inScope);
    const [n4, n6] = this.#contribution(s, after, inScope);
    const same = (a: Elem[], b: Elem[]) =>
      a === b || (a.length === b.length && a.every((x, i) => x.text === b[i].text));
    if (same(o4, n4) && same(o6, n6)) return;
    // Additions first: an element both lose and gain never reaches zero.
    for (const el of n4) this.#count(s, 4, el, 1, log);
    for (const el of n6) this.#count(s, 6, el, 1, log);
    for (const el of o4) this.#count(s, 4, el, -1, log);
    for (const el of o6) this.#count(s, 6, el, -1, log);
  }

  #count(s: DynSet, family: 4 | 6, el: Elem, by: 1 | -1, log: DeltaLog | null): void {
    const m = family === 4 ? s.c4 : s.c6;
    const c = m.get(el.text);
    if (by === 1) {
      if (c) c.n++;
      else {
        m.set(el.text, { n: 1, key: el.key });
        this.#resort(s, family, el, true);
        log?.note(s, family, el, true);
      }
    } else if (c && c.n === 1) {
      this.#resort(s, family, el, false);
      m.delete(el.text);
      log?.note(s, family, el, false);
    } else if (c) c.n--;
  }

  /**
   * `el` joined (or, still counted, is leaving) one family of `s`: its sorted list, when
   * there is one, is replaced by a copy with `el` put in (or taken out) at its place.
   */
  #resort(s: DynSet, family: 4 | 6, el: Elem, added: boolean): void {
    const f = family === 4 ? 0 : 1;
    const list = s.sorted[f];
    if (!list) return;
    s.resorts = (s.resorts ?? 0) + 1;
    if (s.resorts > RESORT_LIMIT) {
      s.sorted = [undefined, undefined];
      return;
    }
    const m = family === 4 ? s.c4 : s.c6;
    // The first position whose key is not below el's.
    let lo = 0, hi = list.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (m.get(list[mid])!.key < el.key) lo = mid + 1;
      else hi = mid;
    }
    const next = list.slice();
    if (added) next.splice(lo, 0, el.text);
    else if (next[lo] === el.text) next.splice(lo, 1);
    // Not where its key says (cannot happen): sorted again when next asked.
    s.sorted[f] = added || next.length < list.length ? next : undefined;
  }
}
