/**
 * The kinds the agent caches: where each is listed and watched, the schema that trims
 * it (kube/objects.ts), and its indexes.
 *
 * @module
 */
import {
  type Namespace,
  NamespaceSchema,
  type NetworkPolicy,
  NetworkPolicySchema,
  type Pod,
  PodSchema,
} from "./objects.ts";
import type { ResourceKind } from "./kind.ts";

const byNamespace = (o: { metadata: { namespace?: string } }) => [o.metadata.namespace ?? ""];

/**
 * Pods, cluster-wide, indexed by `namespace`, by `ip` (every pod IP; host-network
 * pods share their node's, and a finished pod keeps its IP, so an IP may find several)
 * and by `node` (`spec.nodeName`).
 */
export const PODS: ResourceKind<Pod> = {
  resource: "pods",
  path: "/api/v1/pods",
  schema: PodSchema,
  namespaced: true,
  indexers: {
    namespace: byNamespace,
    ip: (p) => p.ips,
    node: (p) => (p.nodeName ? [p.nodeName] : []),
  },
};

/** Namespaces (their labels are what NetworkPolicy's `namespaceSelector` matches). */
export const NAMESPACES: ResourceKind<Namespace> = {
  resource: "namespaces",
  path: "/api/v1/namespaces",
  schema: NamespaceSchema,
  namespaced: false,
};

/** NetworkPolicies, cluster-wide, indexed by `namespace`. */
export const NETWORK_POLICIES: ResourceKind<NetworkPolicy> = {
  resource: "networkpolicies",
  path: "/apis/networking.k8s.io/v1/networkpolicies",
  schema: NetworkPolicySchema,
  namespaced: true,
  indexers: { namespace: byNamespace },
};
