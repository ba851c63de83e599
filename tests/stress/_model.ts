/**
 * What the stress clients know, as a container runtime would: every pod (its
 * namespace and the generation of that namespace), every attachment key they
 * used (container id + interface name) with what the agent acknowledged for
 * it, and each key's operation history (for the violation reports).
 *
 * The checks compare this knowledge with the agent's state and the kernel. A
 * key's `reclaimable` reason says why the agent may legitimately have taken it
 * away since its ADD was acknowledged (its namespace was deleted or replaced,
 * a CNI GC left it out of the valid attachments, a newer container of the pod
 * was added): such a key need not be intact any more, but everything the
 * agent still records for it must still be consistent.
 *
 * @module
 */

/** What the clients know about one attachment key. */
export type KeyStatus =
  /** An operation on it is in flight. */
  | "pending"
  /** ADD acknowledged (exit 0 / 200), no DEL since. */
  | "added"
  /** DEL acknowledged. */
  | "deleted"
  /** ADD refused before anything was kept (no ENI available): nothing may be recorded. */
  | "refused"
  /** The outcome is unknown: the agent or the plugin died mid-call, or an unexpected answer. */
  | "unknown";

/** One entry of a key's (or the run's) history. */
export interface HistoryEntry {
  round: number;
  /** Milliseconds since the run started. */
  t: number;
  what: string;
}

/** What an acknowledged ADD put in the pod. */
export interface AddedDevice {
  mac: string;
  /** Addresses in CIDR form (`10.99.0.2/24`). */
  ips: string[];
  /** Expected default routes: `default via GW`, one per family. */
  routes: string[];
  /** The prevResult a CHECK sends (the ADD's CNI result, or one built from the API answer). */
  prevResult: Record<string, unknown>;
  /** The host link the ADD made (its node end on the node, its pod end in the pod), if any. */
  hostLink?: { nodeIfName: string; podIfName: string; podMac: string };
}

/** One attachment key the clients used. */
export interface KeyRecord {
  containerId: string;
  ifName: string;
  /** The pod's index. */
  pod: number;
  /** The generation of the pod's namespace the last ADD targeted. */
  netnsGen: number;
  /** That namespace's path (the pod's path, or with fresh paths one per generation). */
  netns: string;
  status: KeyStatus;
  /** Set by an acknowledged ADD. */
  added: AddedDevice | null;
  /** Why the agent may have reclaimed it since (null: it must be intact while `added`). */
  reclaimable: string | null;
  /**
   * Its DEL was acknowledged by the plugin alone: the agent was down and the namespace
   * gone, so by design nothing was undone and the agent's GC reclaims the ENI later.
   */
  delDeferred: boolean;
  history: HistoryEntry[];
}

/** An older sandbox of a pod: its namespace still exists after a newer one was made. */
export interface OldSandbox {
  nsName: string;
  path: string;
  gen: number;
}

/** One pod: a named network namespace the harness creates, deletes and replaces. */
export interface PodRecord {
  index: number;
  /** The Kubernetes pod name (`pod-<i>`). */
  name: string;
  /** The short name given to `SimulatedVpc.pod`. */
  short: string;
  /** The namespace name under /run/netns. */
  nsName: string;
  path: string;
  /** Bumped each time the namespace is (re)created. */
  gen: number;
  exists: boolean;
  /** The namespace file's inode, while it exists. */
  ino: number | null;
  /** The current container's number (`<run>-p<i>-c<ctr>`). */
  ctr: number;
  /** An operation on this pod is in flight (pod operations are serialized). */
  busy: boolean;
  /**
   * Older sandboxes whose namespace still exists (a kubelet recreating a pod's sandbox
   * starts the new one before the old one's DEL): their attachments enter recycling.
   */
  old: OldSandbox[];
  /**
   * A racing ADD answered 0 since the namespace was (re)created: it may have landed in
   * this namespace (the replacement) rather than the one it was aimed at, so another
   * container's ADD of the same interface may find the name taken (102).
   */
  racedInto?: boolean;
}

/** The clients' whole knowledge. */
export class Model {
  readonly runId: string;
  readonly pods: PodRecord[];
  readonly keys = new Map<string, KeyRecord>();
  readonly #t0: number;
  round = 0;

  constructor(runId: string, pods: PodRecord[], t0 = performance.now()) {
    this.runId = runId;
    this.pods = pods;
    this.#t0 = t0;
  }

  /** Milliseconds since the run started. */
  now(): number {
    return Math.round(performance.now() - this.#t0);
  }

  /** The container id of a pod's current container. */
  containerId(pod: PodRecord): string {
    return `${this.runId}-p${pod.index}-c${pod.ctr}`;
  }

  /** The key record for `containerId`, created on first use. */
  key(pod: PodRecord, containerId: string, ifName = "eth0"): KeyRecord {
    const k = `${containerId}/${ifName}`;
    let r = this.keys.get(k);
    if (!r) {
      r = {
        containerId,
        ifName,
        pod: pod.index,
        netnsGen: pod.gen,
        netns: pod.path,
        status: "unknown",
        added: null,
        reclaimable: null,
        delDeferred: false,
        history: [],
      };
      this.keys.set(k, r);
    }
    return r;
  }

  /** Appends to a key's history. */
  note(k: KeyRecord, what: string): void {
    k.history.push({ round: this.round, t: this.now(), what });
    if (k.history.length > 60) k.history.splice(0, k.history.length - 60);
  }

  /** Marks every key ADDed into the pod's current namespace generation as reclaimable. */
  podNamespaceGone(pod: PodRecord, why: string): void {
    this.generationGone(pod, pod.gen, why);
  }

  /** Marks every key ADDed into one namespace generation of the pod as reclaimable. */
  generationGone(pod: PodRecord, gen: number, why: string): void {
    for (const k of this.keys.values()) {
      if (k.pod === pod.index && k.netnsGen === gen && k.reclaimable === null) {
        k.reclaimable = why;
        this.note(k, `reclaimable: ${why}`);
      }
    }
  }

  /** The path of the namespace the key was ADDed into, while that namespace exists. */
  liveNetns(k: KeyRecord): string | null {
    const pod = this.pods[k.pod];
    if (pod.exists && pod.gen === k.netnsGen) return pod.path;
    return pod.old.find((o) => o.gen === k.netnsGen)?.path ?? null;
  }

  /** Every pod namespace that exists (current and older sandboxes), by name. */
  namespaceNames(): string[] {
    return this.pods.flatMap((
      p,
    ) => [...(p.exists ? [p.nsName] : []), ...p.old.map((o) => o.nsName)]);
  }

  /** The names to read: every existing namespace and every pod's current one. */
  namesToRead(): string[] {
    return [...new Set([...this.pods.map((p) => p.nsName), ...this.namespaceNames()])];
  }

  /** Whether an acknowledged ADD must still be intact (device in its live pod, recorded). */
  mustBeIntact(k: KeyRecord): boolean {
    const pod = this.pods[k.pod];
    return k.status === "added" && k.reclaimable === null && pod.exists && pod.gen === k.netnsGen;
  }

  /** Every key whose device is known to have been put in `pod`'s current namespace. */
  keysOfPod(pod: PodRecord): KeyRecord[] {
    return [...this.keys.values()].filter((k) => k.pod === pod.index);
  }
}
