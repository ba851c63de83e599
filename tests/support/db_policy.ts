/**
 * The one-node NetworkPolicy fixture several tests share: in namespace `alpha` of a
 * {@linkcode PolicyCluster}, a backend `db` whose policy admits only `web` (TCP 5432),
 * a pod `job` it keeps out, Services in front of db written as kube-proxy writes them,
 * and the loop that probes from job until told to stop.
 *
 * @module
 */
import { installKubeProxy, type ServicePort } from "./kube_proxy.ts";
import { type ClusterPod, type PolicyCluster, SERVICE_CIDRS } from "./policy_cluster.ts";
import { passed, type Probe } from "./prober.ts";
import type { SimulatedNode } from "./node.ts";

/** db's policy: pods `app=db` of `alpha` admit `app=web` on port 5432 only. */
export const DB_ADMITS_WEB = {
  metadata: { namespace: "alpha", name: "db" },
  spec: {
    podSelector: { matchLabels: { app: "db" } },
    ingress: [{
      from: [{ podSelector: { matchLabels: { app: "web" } } }],
      ports: [{ port: 5432 }],
    }],
  },
};

/** Puts {@linkcode DB_ADMITS_WEB} and waits for every agent to enforce it. */
export async function admitOnlyWeb(c: PolicyCluster): Promise<void> {
  c.put("networkpolicies", structuredClone(DB_ADMITS_WEB));
  await c.settle();
}

/** A ClusterIP Service port of `alpha` (`protocol` `port` → the backend's same port). */
export function servicePort(
  name: string,
  clusterIP: string,
  ip: string,
  protocol: "tcp" | "udp",
  port: number,
): ServicePort {
  return {
    namespace: "alpha",
    name,
    portName: `${protocol}-${port}`,
    protocol,
    clusterIP,
    port,
    endpoints: [{ ip, port }],
  };
}

/** kube-proxy's IPv4 rules for `services` (iptables mode, written by hand) on node `a`. */
export async function kubeProxyByHand(a: SimulatedNode, services: ServicePort[]): Promise<void> {
  await installKubeProxy(a.vpc.node.name, "iptables", services, [{
    family: 4,
    serviceCidr: SERVICE_CIDRS.ipv4,
    nodeIPs: [a.nic!.ipv4!],
  }]);
}

/**
 * Probes `targets` from `from` over and over (300 ms each) until `stop` settles: each
 * probe that got through (`proto addr:port result`), and the rounds made.
 */
export async function probeUntil(
  from: ClusterPod,
  targets: Probe[],
  stop: Promise<unknown>,
): Promise<{ through: string[]; rounds: number }> {
  let done = false;
  stop.finally(() => done = true);
  const through: string[] = [];
  let rounds = 0;
  while (!done) {
    const r = await from.prober.probe(targets, 300);
    rounds++;
    r.forEach((x, i) => {
      if (passed(x)) through.push(`${targets[i].proto} ${targets[i].addr}:${targets[i].port} ${x}`);
    });
  }
  return { through, rounds };
}
