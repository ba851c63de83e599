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
  /**
   * Its DEL was acknowledged and the agent has not been killed since: the agent may
   * still be finishing it (a DEL answers once its intent is recorded, before its device
   * is home), so the views may show it part way, each read at its own moment.
   */
  finishing: boolean;
  /**
   * When (`Date.now()`, the agent's clock) the first ADD since the key last held nothing
   * was sent: no attachment of the key was made before, so a stale CNI GC list may take
   * it only once the agent's grace period has passed since then (null: no ADD since).
   */
  addSince: number | null;
  /** Why a stale CNI GC may have taken its attachment since `addSince` (null: none could). */
  staleExcused: string | null;
  history: HistoryEntry[];
}

/**
 * A CNI GC sent with a stale list (the opt-in `--stale-gc` schedule, beside ADDs): the
 * agent may reclaim an unlisted attachment older than its grace period at the moment
 * its pass planned, some time between `sentAt` and `endAt` (the answer, or the next
 * agent kill when the call was cut off with the agent alive; null while neither came).
 */
export interface StaleGcWindow {
  sentAt: number;
  endAt: number | null;
  /** The keys (`containerId/ifName`) its valid list named. */
  valid: Set<string>;
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
  /** Stale CNI GCs sent so far (the `--stale-gc` schedule). */
  readonly staleGcs: StaleGcWindow[] = [];
  /** The agent's GC grace period (ms): a stale list cannot take a younger attachment. */
  readonly graceMs: number;
  readonly #t0: number;
  round = 0;

  constructor(
    runId: string,
    pods: PodRecord[],
    t0 = performance.now(),
    graceMs = 0,
  ) {
    this.runId = runId;
    this.pods = pods;
    this.#t0 = t0;
    this.graceMs = graceMs;
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
        finishing: false,
        addSince: null,
        staleExcused: null,
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
    return k.status === "added" && k.reclaimable === null && pod.exists &&
      pod.gen === k.netnsGen && this.staleExcuse(k) === null;
  }

  /**
   * Why a stale CNI GC may have taken the key (null: none could): one that did not list
   * it and whose pass could have planned when the key's attachment was past the grace
   * period. A pass plans before its answer (`endAt`), and the attachment was made after
   * `addSince`; with no answer yet, any time up to now.
   */
  staleExcuse(k: KeyRecord, now = Date.now()): string | null {
    if (k.staleExcused !== null) return k.staleExcused;
    for (const w of this.staleGcs) {
      const why = this.#excuse(k, w, w.endAt ?? now);
      if (why) return why;
    }
    return null;
  }

  #excuse(k: KeyRecord, w: StaleGcWindow, end: number): string | null {
    if (k.addSince === null || w.valid.has(`${k.containerId}/${k.ifName}`)) {
      return null;
    }
    const age = end - k.addSince;
    if (age < this.graceMs) return null;
    return `left out of a stale CNI GC list (sent ${w.sentAt - k.addSince} ms after its first ` +
      `ADD) whose pass may have planned up to ${age} ms after it, past the grace ${this.graceMs} ms`;
  }

  /** Records a stale CNI GC being sent (returned so its answer can close it). */
  staleGcSent(valid: Set<string>): StaleGcWindow {
    const w: StaleGcWindow = { sentAt: Date.now(), endAt: null, valid };
    this.staleGcs.push(w);
    return w;
  }

  /**
   * A stale CNI GC's pass is over (answered, or the agent killed): what it may have
   * taken is marked on the keys (for the rest of their life), and it is forgotten.
   */
  staleGcEnded(w: StaleGcWindow, at = Date.now()): void {
    const i = this.staleGcs.indexOf(w);
    if (i < 0) return;
    this.staleGcs.splice(i, 1);
    w.endAt = at;
    for (const k of this.keys.values()) {
      if (k.staleExcused !== null) continue;
      const why = this.#excuse(k, w, at);
      if (why) {
        k.staleExcused = why;
        this.note(k, `may be reclaimed: ${why}`);
      }
    }
  }

  /**
   * The agent was killed: no pass of a stale GC sent before goes on after this, and
   * no answered DEL is finishing any more (reconcile finishes what is left at start).
   */
  agentKilled(): void {
    const now = Date.now();
    for (const w of [...this.staleGcs]) this.staleGcEnded(w, now);
    for (const k of this.keys.values()) k.finishing = false;
  }

  /** The key's attachment is gone for sure (DEL acknowledged, ADD refused): a new life. */
  released(k: KeyRecord): void {
    k.addSince = null;
    k.staleExcused = null;
  }

  /** Every key whose device is known to have been put in `pod`'s current namespace. */
  keysOfPod(pod: PodRecord): KeyRecord[] {
    return [...this.keys.values()].filter((k) => k.pod === pod.index);
  }
}
