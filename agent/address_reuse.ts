/**
 * The reuse wait (issue 42): an ENI freed by a DEL goes back to the pool only once the
 * Kubernetes API no longer shows a pod holding its addresses, or after a bound
 * (`networkPolicy.reuseWaitSeconds`; AWS's VPC CNI waits 30 s before it reuses an IP).
 *
 * Why: on this node enim knows whose an address is (local truth, `policy/_local_addrs.ts`),
 * but every other node's agent knows only what the API shows. A pod's object keeps
 * `status.podIPs` after its DEL until kubelet writes its final status (seconds; with a
 * finalizer or a stuck volume much longer): were its address handed to a new pod at
 * once, the other nodes would admit the new pod's packets under the old pod's labels
 * until kubelet wrote the new pod's status, and then as neither's (an address two pods
 * claim is nobody's there). Waiting until the API stops showing the old pod keeps both
 * from happening, within the bound.
 *
 * A pod holds an address, for this wait, when its object lists it and lends it
 * (`lendsAddresses`: not finished, not `hostNetwork`, not deleted without grace), as the
 * other agents read it.
 *
 * @module
 */
import type { Informer } from "../kube/informer.ts";
import type { Pod } from "../kube/objects.ts";
import { lendsAddresses } from "../policy/mod.ts";
import { normalizeIp } from "../lib/ip.ts";
import type { Logger } from "../lib/log.ts";

/** Options of {@linkcode ReuseWaits.wait}. */
export interface ReuseWaitOptions {
  /** The most it waits (0: never). */
  boundMs: number;
  /** Ends the wait at once (the agent stops). */
  signal: AbortSignal;
  log: Logger;
}

/** A pod the cache shows holding an address: its key and uid. */
interface Holder {
  key: string;
  uid: string | null;
}

/** The pods the cache shows holding one of `addresses`, sorted by key. */
export function holdersOf(pods: Informer<Pod>, addresses: string[]): Holder[] {
  const out = new Map<string, Holder>();
  for (const a of addresses) {
    for (const p of pods.byIndex("ip", a)) {
      if (!lendsAddresses(p)) continue;
      const key = `${p.metadata.namespace ?? "default"}/${p.metadata.name}`;
      out.set(`${key} ${p.metadata.uid ?? ""}`, { key, uid: p.metadata.uid ?? null });
    }
  }
  return [...out.values()].sort((x, y) => (x.key < y.key ? -1 : x.key > y.key ? 1 : 0));
}

/** The freed ENIs' waits in progress, over the cache of pods. */
export class ReuseWaits {
  readonly #pods: Informer<Pod>;

  /** Waits over `pods` (the agent's shared cache). */
  constructor(pods: Informer<Pod>) {
    this.#pods = pods;
  }

  /**
   * Null when `addresses` may be handed out again now (no pod holds them in the cache,
   * or the wait is off); else the wait, which resolves once none does (the cache
   * synced), or after `boundMs`, or when `signal` aborts. It never rejects, and logs
   * what it waited for.
   */
  wait(addresses: string[], o: ReuseWaitOptions): Promise<void> | null {
    const addrs = [...new Set(addresses.map(normalizeIp))];
    if (o.boundMs <= 0 || addrs.length === 0 || o.signal.aborted) return null;
    if (this.#pods.synced && holdersOf(this.#pods, addrs).length === 0) return null;
    return this.#waitFree(addrs, o);
  }

  async #waitFree(addrs: string[], o: ReuseWaitOptions): Promise<void> {
    const pods = this.#pods;
    const t0 = performance.now();
    const names = () => pods.synced ? holdersOf(pods, addrs).map((h) => h.key) : null;
    const holders = names();
    o.log.info(
      "A freed ENI goes back to the pool once the Kubernetes API no longer shows its pod with its addresses",
      {
        addresses: addrs,
        ...(holders ? { pods: holders } : { synced: false }),
        boundSeconds: o.boundMs / 1000,
      },
    );
    let done!: (outcome: string) => void;
    const ended = new Promise<string>((r) => done = r);
    const check = () => {
      if (pods.synced && holdersOf(pods, addrs).length === 0) done("free");
    };
    const concerns = (p: Pod | undefined) =>
      p !== undefined && p.ips.some((a) => addrs.includes(a));
    const unsubscribe = pods.subscribe((old, cur) => {
      if (concerns(old) || concerns(cur)) check();
    }, { replay: false });
    const timer = setTimeout(() => done("bound"), o.boundMs);
    const stop = () => done("stopped");
    o.signal.addEventListener("abort", stop, { once: true });
    // Not synced yet (the agent just started): checked again once it is.
    if (!pods.synced) pods.waitSynced(o.boundMs).then(check, () => {});
    check();
    try {
      const outcome = await ended;
      const fields = { addresses: addrs, outcome, waitedMs: Math.round(performance.now() - t0) };
      if (outcome === "bound") {
        o.log.warn(
          "The Kubernetes API still shows a pod with a freed ENI's addresses after the reuse wait; the ENI goes back to the pool",
          { ...fields, pods: names() },
        );
      } else o.log.info("A freed ENI goes back to the pool", fields);
    } finally {
      clearTimeout(timer);
      o.signal.removeEventListener("abort", stop);
      unsubscribe();
    }
  }
}
