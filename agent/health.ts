/**
 * The agent's liveness: whether it is wedged, which a restart would cure, as against busy
 * or waiting on a slow cloud, which a restart would not. Served at `GET /healthz` on the
 * TCP listener (the DaemonSet's liveness probe) and `GET /v1/healthz` on the socket.
 *
 * | what is checked | how | wedged when |
 * | --- | --- | --- |
 * | the event loop turns | the answer itself: the endpoint is served by the agent's one event loop | no answer within the probe's timeout (kubelet counts it a failure) |
 * | the manager's work moves | its locks ({@linkcode LockProgress}): a key taken or released | keys are held or waited for, and none was taken or released for `health.stallSeconds` |
 *
 * Every step under a lock has its own deadline (a provider call `timeouts.providerSeconds`,
 * a command `timeouts.commandSeconds`, the waits for DELs and the policy sync theirs), and a
 * GC pass or a reconcile takes and releases a key per ENI; so a lock that does not move for
 * far longer than those is held by something that will never settle. A slow or failing
 * cloud is not a wedge: its calls fail at their deadline and release their locks. Readiness
 * is another question (`enim status` exits non-zero while the agent is not ready).
 *
 * @module
 */
import type { LockProgress } from "../manager/mutex.ts";

/** What `GET /healthz` answers. */
export interface Health {
  ok: boolean;
  /** Why the agent is wedged (absent when ok). */
  reason?: string;
}

/** Where liveness reads the manager's progress from. */
export interface HealthSources {
  /** The manager's locks (absent: nothing to judge, the agent is live while it answers). */
  progress?: () => LockProgress;
  /** How long held locks may go without moving (`health.stallSeconds`), in ms. */
  stallMs: number;
  /** The monotonic clock the progress is read on (default `performance.now`). */
  now?: () => number;
}

/** Judges liveness from `sources`: a function `GET /healthz` calls on each probe. */
export function healthCheck(sources: HealthSources): () => Health {
  const now = sources.now ?? (() => performance.now());
  return () => {
    const p = sources.progress?.();
    if (!p || p.busy === 0) return { ok: true };
    const still = now() - p.movedAt;
    if (still <= sources.stallMs) return { ok: true };
    return {
      ok: false,
      reason: `The ENI manager is wedged: ${p.busy} lock${p.busy === 1 ? " is" : "s are"} ` +
        `held or waited for and none was taken or released for ${Math.floor(still / 1000)} s ` +
        `(health.stallSeconds: ${sources.stallMs / 1000})`,
    };
  };
}
