/**
 * A pod's bandwidth as its runtime hands it to the plugin: the unit test of the
 * dispatcher and the bench pass the same `runtimeConfig`.
 *
 * @module
 */

/**
 * The `runtimeConfig` containerd passes for a pod annotated 10M both ways: the pod's
 * annotations, and what containerd derives from them for the `bandwidth` capability
 * (2^32 − 1 bits: the placeholder burst of a pod that sets none).
 */
export const SHAPED_10M_RUNTIME_CONFIG = {
  "io.kubernetes.cri.pod-annotations": {
    "kubernetes.io/ingress-bandwidth": "10M",
    "kubernetes.io/egress-bandwidth": "10M",
  },
  bandwidth: {
    ingressRate: 10_000_000,
    ingressBurst: 2 ** 32 - 1,
    egressRate: 10_000_000,
    egressBurst: 2 ** 32 - 1,
  },
} as const;
