/**
 * NetworkPolicy for enim pods (pure: nothing here spawns a process or does I/O).
 *
 * - {@linkcode PolicyEngine} (compile.ts): each local pod's effective policy, kept in
 *   step with the cluster cache; changes answer set deltas or pods to render again.
 * - {@linkcode unreadablePolicy} (_prepare.ts): what a policy enim cannot read does
 *   instead (it isolates, and admits nothing), for the log and `enim status`.
 * - {@linkcode lendsAddresses} (_local_addrs.ts): whether a pod's API object lends its
 *   addresses to peer sets (not finished, not `hostNetwork`, not deleted without grace).
 * - {@linkcode admits} (evaluate.ts): whether a compiled policy admits a packet.
 * - {@linkcode podRuleset}, {@linkcode nodeRuleset}, {@linkcode setDeltaCommands}
 *   (nft.ts): the nftables text for the pod's namespace, the node's, and set edits.
 *
 * @module
 */
export {
  compilePolicy,
  type EngineOptions,
  type LocalPod,
  podKey,
  PodNotFoundError,
  PolicyEngine,
  type PolicyUpdate,
  type PolicyView,
} from "./compile.ts";
export { type UnreadablePolicy, unreadablePolicy, unreadableText } from "./_prepare.ts";
export { lendsAddresses } from "./_local_addrs.ts";
export {
  DEFAULT_JUDGED_MARK,
  FENCE_COUNTER,
  FENCE_TABLE,
  fenceRemoval,
  fenceRuleset,
  fenceTimeoutSeconds,
} from "./fence.ts";
export { GUARD_COUNTER, GUARD_STAMP, GUARD_TABLE, guardProbe, guardRuleset } from "./raw_guard.ts";
export { admits, connectionAllowed, type End, type Probe } from "./evaluate.ts";
export {
  type DropCounter,
  type DropLog,
  nodeNames,
  type NodePod,
  nodeRuleset,
  type NodeRulesetOptions,
  nodeUpdate,
  type NodeUpdateOptions,
  parseDropCounters,
  podRuleset,
  type PodRulesetOptions,
  POLICY_TABLE,
  setDeltaCommands,
  setReplaceCommands,
} from "./nft.ts";
export * from "./types.ts";
