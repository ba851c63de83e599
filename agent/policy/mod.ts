/**
 * NetworkPolicy enforcement on the node (issue 35): the manager's
 * {@linkcode PolicyHook} over the cluster's caches (kube/) and the policy compiler
 * (policy/), applied through the device layer (netns/, the only code that spawns).
 *
 * - **From the first packet.** An ADD waits (bounded: `networkPolicy.syncWaitSeconds`)
 *   for the caches' first full list, fetches a pod the cache has not seen yet (5 s), and
 *   fails with CNI code 11 when it cannot know the pod's policy: the runtime retries.
 *   Otherwise `prepare` hands the plug a way to the pod's own table: called once the
 *   ENI's move has started (the compiling overlaps it), it compiles the pod's policy,
 *   loads the node's table with the pod's chains (at its node end, in parallel with the
 *   plug; `committed` waits for it) and gives the text, which the plug loads in the
 *   pod's namespace with the host link's ruleset before the ENI is configured.
 * - **Kept in step.** Every cache event (pods, namespaces, NetworkPolicies) goes to one
 *   serialized queue; a batch of events is applied to the compiler at once, then to the
 *   kernel: set deltas as element edits in each pod that uses the set and on the node
 *   (a failed edit replaces the sets whole), pods whose rules changed rendered again
 *   (with what was loaded before, so what went is deleted), then the node's table.
 *   A load that fails is retried with a backoff; nothing is ever flushed open.
 * - **Never fail open.** Once synced, an API server outage leaves the caches as they
 *   are, and they are enforced. A starting agent touches no table (the kernel keeps what
 *   the last agent loaded) until its caches have synced and the manager has handed over
 *   the node's pods (lifecycle.ts); its ADDs answer 11 until then. A pod the cluster no
 *   longer has keeps its last rules. No change can stop the queue: one that fails half
 *   way has every table rendered again from the caches.
 *
 * The enforcer is `enforcer.ts` (its parts are named there); this module starts it.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { SqlitePolicyMemory } from "./_memory.ts";
import { Kube } from "../../kube/mod.ts";
import { type KubeEnv, kubeEnv } from "../../kube/access.ts";
import type { DeviceLayer } from "../../netns/types.ts";
import type { AgentConfig } from "../config.ts";
import type { Metrics } from "../../lib/metrics.ts";
import type { Logger } from "../../lib/log.ts";
import { PolicyEnforcer } from "./enforcer.ts";
import { probeRawGuard } from "./_raw.ts";

/** The kernel's release (`uname -r`); null when it cannot be read. */
function osRelease(): string | null {
  try {
    return Deno.osRelease();
  } catch {
    return null;
  }
}

export {
  NOT_SYNCED,
  PolicyEnforcer,
  type PolicyEnforcerOptions,
  type PolicyRecorder,
} from "./enforcer.ts";
export { type PolicyDrops, policyView } from "./_status.ts";

/** Whether `networkPolicy.enabled` turns enforcement on, and why (for the log). */
export function policyEnabled(
  cfg: Pick<AgentConfig, "networkPolicy" | "kubernetes">,
  env: KubeEnv,
): { on: boolean; why: string } {
  const e = cfg.networkPolicy.enabled;
  if (e !== "auto") return { on: e, why: `networkPolicy.enabled is ${e}` };
  if (cfg.kubernetes.kubeconfig) return { on: true, why: "kubernetes.kubeconfig is set" };
  if (env.KUBECONFIG) return { on: true, why: "KUBECONFIG is set" };
  if (env.KUBERNETES_SERVICE_HOST) {
    return { on: true, why: "the agent runs in a pod (KUBERNETES_SERVICE_HOST)" };
  }
  return {
    on: false,
    why: "no Kubernetes API is configured (kubernetes.kubeconfig, KUBECONFIG, in-cluster)",
  };
}

/**
 * The agent's enforcer when `networkPolicy` is on (null when off): the Kubernetes API
 * found (a configuration error stops the agent: it never runs open by mistake), the
 * caches started. Registers its metrics.
 */
export async function startPolicyEnforcer(
  cfg: AgentConfig,
  o: {
    devices: DeviceLayer;
    metrics: Metrics;
    log: Logger;
    env?: KubeEnv;
    /** The agent's state database: what the enforcer keeps across a restart (`_memory.ts`). */
    db?: DatabaseSync;
  },
): Promise<PolicyEnforcer | null> {
  const env = o.env ?? kubeEnv();
  const { on, why } = policyEnabled(cfg, env);
  if (!on) {
    o.log.info("NetworkPolicy enforcement is off", { why });
    return null;
  }
  const k = cfg.kubernetes;
  const kube = await Kube.connect({
    kubeconfig: k.kubeconfig,
    context: k.context,
    nodeName: k.nodeName,
    pageSize: k.pageSize,
    requestTimeoutSeconds: k.requestTimeoutSeconds,
    watchTimeoutSeconds: k.watchTimeoutSeconds,
    watchBookmarkSeconds: k.watchBookmarkSeconds,
    env,
    log: o.log,
  });
  o.log.info("NetworkPolicy enforcement is on", { why });
  const np = cfg.networkPolicy;
  const rawGuard = await probeRawGuard(np.rawSocketGuard, o.devices, osRelease(), o.log);
  const enforcer = new PolicyEnforcer({
    kube,
    devices: o.devices,
    log: o.log,
    syncWaitMs: cfg.networkPolicy.syncWaitSeconds * 1000,
    logDropsPerSecond: cfg.networkPolicy.logDropsPerSecond,
    reuseWaitMs: cfg.networkPolicy.reuseWaitSeconds * 1000,
    tableCheckMs: cfg.networkPolicy.tableCheckSeconds * 1000,
    judgedMark: np.judgedMark,
    ...(o.db ? { memory: new SqlitePolicyMemory(o.db) } : {}),
    metrics: o.metrics,
    rawGuard,
    rawCapablePods: np.rawCapablePods,
    runtimeDefaultCapabilities: np.runtimeDefaultCapabilities,
  });
  o.metrics.setPolicySource(async () => {
    const s = enforcer.status();
    return {
      synced: s.synced,
      caches: s.caches,
      rules: enforcer.ruleCounts(),
      drops: await enforcer.drops(),
      unreadable: s.unreadable.map((u) => u.policy),
      unenforced: s.pods.flatMap((p) => p.bypass ? [{ pod: p.pod, why: p.bypass }] : []),
    };
  });
  return enforcer;
}
