/**
 * Local truth: the addresses enim gave this node's pods, and those its pods let go.
 * enim is the node's IPAM, so on this node an address belongs to the local pod enim gave
 * it to, whatever the API still says, and to nobody the API names once its pod's DEL
 * took it back (from the moment the device leaves the pod):
 *
 * - a local pod **holds** the addresses of its newest attachment, from its ADD: no API
 *   object of another pod (another name, or the same name with another uid) lends its
 *   labels to them;
 * - a pod that no longer holds an address here (its DEL, or a newer attachment with
 *   other addresses) has **released** it: its API object, which keeps
 *   `status.podIPs` until kubelet's final status (seconds; much longer with a finalizer),
 *   lends its labels to that address no more. A release lasts while the API still shows
 *   that pod (same name and uid, not finished, see {@linkcode lendsAddresses}); it goes
 *   when the pod's object goes, is replaced by another pod's, or finishes.
 *
 * A pod is its name and its uid: a uid of null (a runtime that does not pass
 * `K8S_POD_UID`, an object without one) matches any uid of that name.
 *
 * @module
 */
import type { Pod } from "../kube/objects.ts";
import { parseAddr } from "./_addr.ts";

/** A pod as local truth knows it: its key (`namespace/name`) and uid (null: unknown). */
export interface Identity {
  key: string;
  uid: string | null;
}

/** Whether `uid` is the same pod's as `other` (an unknown uid matches any). */
export function sameUid(a: string | null | undefined, b: string | null | undefined): boolean {
  return a == null || b == null || a === b;
}

/**
 * Whether a pod's API object lends its addresses to peer sets (readings of the
 * NetworkPolicy concept page and of the pod lifecycle): not a `hostNetwork` pod (it has
 * its node's addresses: a peer by address like the node); not a pod that has finished
 * (phase Succeeded or Failed); not a pod deleted without grace
 * (`deletionGracePeriodSeconds` 0 with the object still there: a force delete held by a
 * finalizer, or kubelet's last delete once its containers are gone: none of them runs).
 * A Terminating pod within its grace period still runs, and may legitimately send (its
 * preStop hook, connections it drains): it lends its addresses until one of the above,
 * or until its own node's DEL takes them back (local truth there; elsewhere its node
 * does not hand the address out again until the API stops showing it, bounded: see
 * docs/network_policy.md).
 */
export function lendsAddresses(pod: Pod): boolean {
  if (pod.hostNetwork || pod.phase === "Succeeded" || pod.phase === "Failed") return false;
  return pod.deleting?.graceSeconds !== 0;
}

/** Canonical texts of the addresses of `ips` (what is no address is dropped). */
function canonical(ips: readonly string[]): string[] {
  const out: string[] = [];
  for (const s of ips) {
    const a = parseAddr(s.trim());
    if (a && !out.includes(a.text)) out.push(a.text);
  }
  return out;
}

/** The local pods' addresses, and what local pods released (see the module doc). */
export class LocalAddresses {
  /** Local pods: the addresses enim gave them, and their uid. */
  readonly #locals = new Map<string, { ips: string[]; addrs: string[]; uid: string | null }>();
  /** Address → the local pod holding it. */
  readonly #held = new Map<string, Identity>();
  /** Address → the pods that released it here. */
  readonly #released = new Map<string, Identity[]>();
  /** Pod key → the addresses it has releases of. */
  readonly #releasedBy = new Map<string, Set<string>>();

  /** The addresses enim gave local pod `key` (as given) and its uid; undefined: not local. */
  of(key: string): { ips: string[]; uid: string | null } | undefined {
    return this.#locals.get(key);
  }

  /** The local pod holding `addr` (canonical text), if any. */
  holder(addr: string): Identity | undefined {
    return this.#held.get(addr);
  }

  /** Whether pod `key` with `uid` released `addr` here (and the API still shows it). */
  released(addr: string, key: string, uid: string | null): boolean {
    return this.#released.get(addr)?.some((r) => r.key === key && sameUid(r.uid, uid)) ?? false;
  }

  /**
   * Whether the API object of pod `key` (`uid`) may lend `addr`: nobody holds it, and it
   * did not release it.
   */
  mayLend(addr: string, key: string, uid: string | null): boolean {
    return !this.#held.has(addr) && !this.released(addr, key, uid);
  }

  /**
   * Local pod `key` (with `uid`) holds `ips` from now on (null: it is no local pod any
   * more, after its DEL). What it held before and holds no longer, it has released; what
   * it holds now it no longer has a release of. Returns the addresses whose holder or
   * releases changed (canonical).
   */
  set(key: string, uid: string | null, ips: string[] | null): string[] {
    const before = this.#locals.get(key);
    const now = ips ? canonical(ips) : [];
    const changed = new Set<string>();
    if (before) {
      // Another uid is another pod: it released everything the earlier one held.
      const same = before.uid === uid;
      for (const a of before.addrs) {
        if (same && now.includes(a)) continue;
        const h = this.#held.get(a);
        if (h?.key === key) this.#held.delete(a);
        this.#release(a, { key, uid: before.uid });
        changed.add(a);
      }
    }
    if (ips) {
      for (const a of now) {
        const h = this.#held.get(a);
        if (h?.key !== key || h.uid !== uid) changed.add(a);
        this.#held.set(a, { key, uid });
        if (this.#unrelease(a, (r) => r.key === key && sameUid(r.uid, uid))) changed.add(a);
      }
      this.#locals.set(key, { ips: [...ips], addrs: now, uid });
    } else this.#locals.delete(key);
    return [...changed];
  }

  /**
   * Drops the releases of pod `key` that the API no longer backs, `pod` being what the
   * API shows under that name now (undefined: nothing): it is gone, another pod (another
   * uid), or no longer lends addresses. Returns their addresses.
   */
  prune(key: string, pod: Pod | undefined): string[] {
    const addrs = this.#releasedBy.get(key);
    if (!addrs) return [];
    const backed = (r: Identity) =>
      pod !== undefined && lendsAddresses(pod) && sameUid(r.uid, pod.metadata.uid);
    const out: string[] = [];
    for (const a of [...addrs]) {
      if (this.#unrelease(a, (r) => r.key === key && !backed(r))) out.push(a);
    }
    return out;
  }

  /** The pods that have releases. */
  releasers(): string[] {
    return [...this.#releasedBy.keys()];
  }

  /** Every address held or released here. */
  addresses(): string[] {
    return [...new Set([...this.#held.keys(), ...this.#released.keys()])];
  }

  #release(addr: string, who: Identity): void {
    const list = this.#released.get(addr) ?? [];
    if (!list.some((r) => r.key === who.key && r.uid === who.uid)) list.push(who);
    this.#released.set(addr, list);
    let mine = this.#releasedBy.get(who.key);
    if (!mine) this.#releasedBy.set(who.key, mine = new Set());
    mine.add(addr);
  }

  /** Removes the releases of `addr` that `drop` picks; true when any went. */
  #unrelease(addr: string, drop: (r: Identity) => boolean): boolean {
    const list = this.#released.get(addr);
    if (!list) return false;
    const left = list.filter((r) => !drop(r));
    if (left.length === list.length) return false;
    for (const r of list) {
      if (left.some((l) => l.key === r.key)) continue;
      const mine = this.#releasedBy.get(r.key);
      mine?.delete(addr);
      if (mine?.size === 0) this.#releasedBy.delete(r.key);
    }
    if (left.length > 0) this.#released.set(addr, left);
    else this.#released.delete(addr);
    return true;
  }
}
