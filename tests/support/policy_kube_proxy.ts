/**
 * kube-proxy for the NetworkPolicy tests on a {@linkcode PolicyCluster}: the real one on
 * the real control plane, its rules written by hand on the test API server.
 *
 * @module
 */
import { assert } from "../../lib/assert.ts";
import { poll } from "../../lib/async.ts";
import {
  installKubeProxy,
  type ProxyMode,
  removeKubeProxy,
  type ServicePort,
} from "./kube_proxy.ts";
import { RealKubeProxy } from "./k8s/kube_proxy.ts";
import { FIELD_MANAGER } from "./k8s/manifests.ts";
import { StoredSchema } from "./k8s/rest.ts";
import { RealApi } from "./k8s/policy_api.ts";
import { type PolicyCluster, SERVICE_CIDRS } from "./policy_cluster.ts";
import type { SimulatedNode } from "./node.ts";

/** kube-proxy on a cluster's nodes (see {@linkcode kubeProxyOn}). */
export interface PolicyProxies {
  what: string;
  /** The real kube-proxy (false: its rules written by hand). */
  real: boolean;
  /**
   * Resolves once kube-proxy's rules for the Services are on `n` (bounded): the real one
   * writes them again itself (it resyncs); by hand they are written again now.
   */
  programmed(n: SimulatedNode): Promise<void>;
  stop(): Promise<void>;
}

/**
 * kube-proxy on `nodes` for `services` (each selecting `app: db` in its namespace): on the
 * real API server the real kube-proxy in `mode`, reading the Services and the
 * EndpointSlices the real controller-manager makes (it waits until each Service's endpoint
 * is ready and each node reaches it); on the test API server its rules written by hand.
 */
export async function kubeProxyOn(
  c: PolicyCluster,
  nodes: [SimulatedNode, string][],
  mode: ProxyMode,
  services: ServicePort[],
): Promise<PolicyProxies> {
  const install = (n: SimulatedNode) =>
    installKubeProxy(n.vpc.node.name, mode, services, [{
      family: 4,
      serviceCidr: SERVICE_CIDRS.ipv4,
      nodeIPs: [n.nic!.ipv4!],
    }]);
  if (!(c.api instanceof RealApi)) {
    for (const [n] of nodes) await install(n);
    return {
      what: "kube-proxy's rules written by hand",
      real: false,
      programmed: (n) => install(n),
      stop: async () => {
        for (const [n] of nodes) await removeKubeProxy(n.vpc.node.name);
      },
    };
  }
  const api = c.api;
  for (const s of services) {
    await api.cluster.admin.apply(
      `/api/v1/namespaces/${s.namespace}/services/${s.name}`,
      {
        apiVersion: "v1",
        kind: "Service",
        metadata: { name: s.name, namespace: s.namespace },
        spec: {
          clusterIP: s.clusterIP,
          selector: { app: "db" },
          ports: [{ name: s.portName, port: s.port, targetPort: s.endpoints[0].port }],
        },
      },
      StoredSchema,
      FIELD_MANAGER,
    );
  }
  const proxies: RealKubeProxy[] = [];
  /** Waits (bounded) until kube-proxy on `n` has written the Services' rules. */
  const programmed = async (n: SimulatedNode) => {
    const ok = await poll(async () => {
      const text = await proxies.find((p) => p.netns === n.vpc.node.name)!.rules();
      return services.every((s) => text.includes(s.clusterIP)) || null;
    }, { timeoutMs: 90_000, intervalMs: 200 });
    assert(ok, `kube-proxy (${mode}) on ${n.vpc.node.name} wrote no rules for the Services`);
  };
  const stop = async () => {
    for (const p of proxies.splice(0)) await p.stop().catch(() => {});
  };
  try {
    for (const [n, nodeName] of nodes) {
      proxies.push(
        await RealKubeProxy.start(api.cluster, {
          netns: n.vpc.node.name,
          nodeName,
          apiPort: await c.bridge.into(n.vpc.node.name),
          mode,
        }),
      );
    }
    // Synced when each node has the Services' rules (no pod probes a ClusterIP before:
    // see k8s_kube_proxy_test's unprogrammed ClusterIP), then a pod of each node reaches each.
    for (const [n] of nodes) await programmed(n);
    for (const [n] of nodes) {
      const from = [...c.pods.values()].find((p) => p.node === n)!;
      for (const s of services) {
        const ok = await poll(async () => {
          const [r] = await from.prober.probe(
            [{ proto: "tcp", addr: s.clusterIP, port: s.port }],
            1_000,
          );
          return r.startsWith("open ") || null;
        }, { timeoutMs: 60_000, intervalMs: 200 });
        assert(ok, `${from.id} never reached ${s.clusterIP}:${s.port} (${mode})`);
      }
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return { what: `the real kube-proxy v${api.cluster.bins.version}`, real: true, programmed, stop };
}
