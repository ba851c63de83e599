/**
 * The small cluster the policy tests compile against: three namespaces (alpha, beta,
 * gamma) of three pods each (web, db, job), dual-stack, with named container ports,
 * plus a node and an external host; objects are built as the API server sends them and
 * parsed through kube/objects.ts's schemas.
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
} from "../../kube/objects.ts";
import type { PolicyView } from "../../policy/compile.ts";

/** The namespaces and their labels. */
export const NAMESPACES: Record<string, Record<string, string>> = {
  alpha: { team: "a", env: "prod" },
  beta: { team: "b", env: "prod" },
  gamma: { team: "c", env: "dev" },
};

/** The node's addresses and an address outside the cluster. */
export const NODE = { v4: "10.0.0.254", v6: "fd00::fe" };
/** A host outside the cluster. */
export const EXTERNAL = { v4: "192.168.5.5", v6: "fd99::5" };

const NS_INDEX: Record<string, number> = { alpha: 1, beta: 2, gamma: 3 };
const POD_INDEX: Record<string, number> = { web: 1, db: 2, job: 3 };

/** A pod of the world, as the raw API object's fields. */
export interface RawPod {
  namespace: string;
  name: string;
  labels: Record<string, string>;
  ports: { name?: string; containerPort: number; protocol?: "TCP" | "UDP" | "SCTP" }[];
  ips: string[];
  phase?: string;
  hostNetwork?: boolean;
}

/** The nine pods: web (`http` 8080, 8081 in gamma), db (`sql` 5432, `http` 9050), job (`dns` 53/UDP). */
export function basePods(): RawPod[] {
  const pods: RawPod[] = [];
  for (const ns of Object.keys(NAMESPACES)) {
    for (const name of ["web", "db", "job"]) {
      const labels: Record<string, string> = { app: name };
      if (name === "web") labels.tier = "front";
      if (name === "db") labels.tier = "back";
      const ports: RawPod["ports"] = name === "web"
        ? [{ name: "http", containerPort: ns === "gamma" ? 8081 : 8080 }]
        : name === "db"
        ? [{ name: "sql", containerPort: 5432 }, { name: "http", containerPort: 9050 }]
        : [{ name: "dns", containerPort: 53, protocol: "UDP" }];
      const n = NS_INDEX[ns], m = POD_INDEX[name];
      pods.push({
        namespace: ns,
        name,
        labels,
        ports,
        ips: [`10.0.${n}.${m}`, `fd00::${n}:${m}`],
        phase: "Running",
      });
    }
  }
  return pods;
}

/** A Pod object parsed from its API JSON. */
export function podObject(p: RawPod): Pod {
  return PodSchema.parse({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: p.name, namespace: p.namespace, uid: crypto.randomUUID(), labels: p.labels },
    spec: {
      nodeName: "node-1",
      hostNetwork: p.hostNetwork,
      containers: [{ name: "c", image: "x", ports: p.ports }],
    },
    status: {
      phase: p.phase,
      ...(p.ips.length ? { podIP: p.ips[0], podIPs: p.ips.map((ip) => ({ ip })) } : {}),
    },
  });
}

/** A Namespace object parsed from its API JSON (with `kubernetes.io/metadata.name`). */
export function namespaceObject(name: string, labels: Record<string, string>): Namespace {
  return NamespaceSchema.parse({
    apiVersion: "v1",
    kind: "Namespace",
    metadata: { name, labels: { ...labels, "kubernetes.io/metadata.name": name } },
    spec: { finalizers: ["kubernetes"] },
  });
}

/** A NetworkPolicy parsed from its API JSON (`spec` as written in YAML). */
export function policyObject(namespace: string, name: string, spec: unknown): NetworkPolicy {
  return NetworkPolicySchema.parse({
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: { name, namespace },
    spec,
  });
}

/** A view over plain arrays. */
export function viewOf(
  pods: Pod[],
  namespaces: Namespace[],
  policies: NetworkPolicy[],
): PolicyView {
  return {
    pods: () => pods,
    namespaces: () => namespaces,
    networkPolicies: () => policies,
  };
}

/** The world's namespaces as objects. */
export function baseNamespaces(): Namespace[] {
  return Object.entries(NAMESPACES).map(([n, l]) => namespaceObject(n, l));
}
