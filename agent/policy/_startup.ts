/**
 * Two of the waits of the enforcer's `waiting` phase (lifecycle.ts): the node's
 * addresses listed, and the caches' first full sync. Each tries again until it is met or
 * the enforcer stops; neither touches a table.
 *
 * @module
 */
import type { DeviceLayer } from "../../netns/types.ts";
import type { Kube } from "../../kube/mod.ts";
import type { Logger } from "../../lib/log.ts";
import { userMessage } from "../../lib/message.ts";
import { sleep } from "../../lib/async.ts";

/** Lists the node's addresses, every 2 s until it can; null once `signal` aborts. */
export async function listNodeAddresses(
  devices: DeviceLayer,
  log: Logger,
  signal: AbortSignal,
): Promise<string[] | null> {
  while (!signal.aborted) {
    try {
      return (await devices.nodeAddresses()).addresses;
    } catch (err) {
      log.warn("Cannot list the node's addresses; trying again", { error: userMessage(err) });
      await sleep(2_000, signal);
    }
  }
  return null;
}

/**
 * Waits until the three caches (pods, namespaces, NetworkPolicies) have listed once,
 * warning every 30 s meanwhile; returns early once `signal` aborts (closing the caches
 * ends their waits).
 */
export async function waitForCaches(kube: Kube, log: Logger, signal: AbortSignal): Promise<void> {
  const caches = [kube.pods, kube.namespaces, kube.networkPolicies];
  while (!signal.aborted) {
    const t0 = performance.now();
    const synced = await Promise.all(caches.map((c) => c.waitSynced(30_000)));
    if (signal.aborted || synced.every(Boolean)) return;
    log.warn(
      "NetworkPolicy is not enforced for new pods yet: the Kubernetes caches have not synced (ADDs answer 11; existing pods keep their rules)",
      {
        caches: kube.stats().map((s) => ({
          resource: s.resource,
          synced: s.synced,
          error: s.lastError,
        })),
      },
    );
    // A stopped cache answers at once: do not spin.
    if (performance.now() - t0 < 1_000) await sleep(5_000, signal);
  }
}
