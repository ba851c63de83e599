/**
 * The cluster's NetworkPolicies the agent cannot read, said out loud (issue 42). Each
 * fails closed where it is enforced (kube/objects.ts keeps it with a spec that isolates
 * and admits nothing; the compiler warns on the pods it selects); this is the rest: one
 * warning in the log per version of such a policy (not per event, not per pod), and the
 * list `enim status` and the `enim_policy_unreadable` gauge show.
 *
 * It reads the shared NetworkPolicy cache itself, from its first list on, so that what
 * it says does not wait for the enforcer's sync or queue.
 *
 * @module
 */
import type { NetworkPolicy } from "../kube/objects.ts";
import { type UnreadablePolicy, unreadablePolicy, unreadableText } from "../policy/mod.ts";
import type { Logger } from "../lib/log.ts";

/** What {@linkcode UnreadablePolicies} reads: the NetworkPolicy cache's objects and changes. */
export interface PolicySource {
  values(): Iterable<NetworkPolicy>;
  subscribe(
    handler: (old: NetworkPolicy | undefined, cur: NetworkPolicy | undefined) => void,
  ): () => void;
}

/** Logs each unreadable NetworkPolicy once per version, and lists them (see the module doc). */
export class UnreadablePolicies {
  readonly #source: PolicySource;
  readonly #log: Logger;
  /** The version last logged of each unreadable policy, by `namespace/name`. */
  readonly #logged = new Map<string, string | null>();
  readonly #stop: () => void;

  /** Subscribes to `source` (replaying what it holds already). */
  constructor(source: PolicySource, log: Logger) {
    this.#source = source;
    this.#log = log;
    this.#stop = source.subscribe((old, cur) => this.#changed(old, cur));
  }

  /** The unreadable policies the cache holds now, by name. */
  list(): UnreadablePolicy[] {
    const out: UnreadablePolicy[] = [];
    for (const p of this.#source.values()) {
      const u = unreadablePolicy(p);
      if (u) out.push(u);
    }
    return out.sort((a, b) => (a.policy < b.policy ? -1 : a.policy > b.policy ? 1 : 0));
  }

  /** Stops listening. */
  close(): void {
    this.#stop();
  }

  #changed(old: NetworkPolicy | undefined, cur: NetworkPolicy | undefined): void {
    const u = cur && unreadablePolicy(cur);
    const obj = (cur ?? old)!;
    const key = `${obj.metadata.namespace ?? "default"}/${obj.metadata.name}`;
    if (u) {
      if (this.#logged.has(key) && this.#logged.get(key) === u.resourceVersion) return;
      this.#logged.set(key, u.resourceVersion);
      this.#log.warn(
        "NetworkPolicy: a policy cannot be read; it fails closed: it isolates the pods it selects and admits nothing",
        { ...u, effect: unreadableText(u) },
      );
    } else if (this.#logged.delete(key)) {
      this.#log.info(
        cur
          ? "NetworkPolicy: a policy that could not be read can be read now"
          : "NetworkPolicy: a policy that could not be read is deleted",
        { policy: key, resourceVersion: obj.metadata.resourceVersion ?? null },
      );
    }
  }
}
