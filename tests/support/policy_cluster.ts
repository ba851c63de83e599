/**
 * A small Kubernetes cluster for the NetworkPolicy end-to-end tests: the test API server
 * (tests/support/kube_apiserver.ts) reached from each simulated node through a
 * {@linkcode KubeBridge}, nodes whose agents read it (a kubeconfig in the node's sandbox,
 * `/run/enim/kubeconfig`: the sandbox's private /run/enim, which the permission set
 * reads), and enim pods created as kubelet does: the Pod object (labels, named container
 * ports, node) first, then the sandbox's CNI ADD, then the Pod's status with its
 * addresses. Each pod runs an answer server on {@linkcode POD_PORTS} and a
 * {@linkcode Prober}.
 *
 * @module
 */
import { assert } from "../../lib/assert.ts";
import { poll } from "../../lib/async.ts";
import { makeTestPki, type TestPki } from "./kube_pki.ts";
import { KubeApiServer, type Obj, type Resource } from "./kube_apiserver.ts";
import { KubeBridge, kubeconfigFor } from "./kube_bridge.ts";
import { makeNamespace, makePod } from "./kube_objects.ts";
import { type AddResult, SimulatedNode, type SimulatedNodeOptions } from "./node.ts";
import type { NetnsHandle } from "./vpc.ts";
import { Servers } from "./traffic.ts";
import { Prober } from "./prober.ts";
import type { Status } from "../../api/schema.ts";

/** The cluster's Service CIDRs (routed through every pod's host link). */
export const SERVICE_CIDRS = { ipv4: "172.30.0.0/16", ipv6: "fd00:30::/108" };

/** What every pod serves: TCP 8080, 8081, 5432, 9050; UDP 53, 5353. */
export const POD_PORTS = [
  { proto: "tcp" as const, port: 8080 },
  { proto: "tcp" as const, port: 8081 },
  { proto: "tcp" as const, port: 5432 },
  { proto: "tcp" as const, port: 9050 },
  { proto: "udp" as const, port: 53 },
  { proto: "udp" as const, port: 5353 },
];

/** A pod of the cluster, as a test sees it. */
export interface ClusterPod {
  /** `namespace/name`. */
  id: string;
  namespace: string;
  name: string;
  labels: Record<string, string>;
  node: SimulatedNode;
  ns: NetnsHandle;
  res: AddResult;
  v4: string;
  v6: string;
  prober: Prober;
  /** The CNI call's arguments (for DEL and a second ADD). */
  args: string;
  /** The CNI container id of its sandbox. */
  containerId: string;
  /** Its container ports, as its Pod object lists them. */
  ports: ContainerPorts;
  /** The node's name in the cluster. */
  nodeName: string;
}

/** The pod's container ports, as the Pod object lists them. */
export type ContainerPorts = { name?: string; containerPort: number; protocol?: string }[];

/** The cluster: the API server, its bridge, the nodes and the pods. */
export class PolicyCluster implements AsyncDisposable {
  readonly pki: TestPki;
  readonly server: KubeApiServer;
  readonly bridge: KubeBridge;
  readonly nodes: SimulatedNode[] = [];
  readonly pods = new Map<string, ClusterPod>();
  readonly servers = new Servers();
  /** The resourceVersion of the last write of each kind (what {@linkcode settle} waits for). */
  readonly #lastRv = new Map<Resource, number>();
  readonly #probers: Prober[] = [];

  private constructor(pki: TestPki, server: KubeApiServer) {
    this.pki = pki;
    this.server = server;
    this.bridge = KubeBridge.start(server);
  }

  /** The API server and its bridge (no node yet). */
  static async start(): Promise<PolicyCluster> {
    const pki = await makeTestPki();
    return new PolicyCluster(pki, KubeApiServer.start({ pki }));
  }

  /** Creates or replaces an object, remembering its resourceVersion. */
  put(resource: Resource, obj: Obj): Obj {
    const stored = this.server.put(resource, obj);
    this.#lastRv.set(resource, Number(stored.metadata.resourceVersion));
    return stored;
  }

  /** Deletes an object, remembering the delete's resourceVersion. */
  remove(resource: Resource, namespace: string | undefined, name: string): void {
    if (this.server.remove(resource, namespace, name)) {
      this.#lastRv.set(resource, Number(this.server.resourceVersion));
    }
  }

  /** A namespace with its labels. */
  namespace(name: string, labels: Record<string, string>): void {
    this.put("namespaces", makeNamespace(name, labels));
  }

  /**
   * A node (its agent reading this cluster as `name`): the options of
   * {@linkcode SimulatedNode.start} (the agent started once its kubeconfig is written).
   */
  async node(name: string, o: SimulatedNodeOptions = {}): Promise<SimulatedNode> {
    const node = await SimulatedNode.start({
      ...o,
      startAgent: false,
      extra: {
        ...o.extra,
        kubernetes: { kubeconfig: "/run/enim/kubeconfig", nodeName: name, pageSize: 100 },
      },
    });
    this.nodes.push(node);
    const port = await this.bridge.into(node.vpc.node.name);
    await Deno.writeTextFile(node.sandbox.host("kubeconfig"), kubeconfigFor(this.server, port));
    await node.startAgent();
    return node;
  }

  /** The network config of the cluster's pods. */
  netconf(node: SimulatedNode): Record<string, unknown> {
    return node.netconf("1.1.0", { serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] });
  }

  /** The Pod object of a pod (its status with `ips` when given). */
  podObject(
    namespace: string,
    name: string,
    labels: Record<string, string>,
    node: string,
    ports: ContainerPorts,
    ips: { v4?: string; v6?: string } = {},
  ): Obj {
    return makePod({ namespace, name, labels, nodeName: node, ports, ip: ips.v4, ipv6: ips.v6 });
  }

  /**
   * An enim pod on `node` (named `nodeName` in the cluster), created as kubelet creates
   * one: its Pod object, its namespace with its answer server, the ADD, its status.
   */
  async pod(
    node: SimulatedNode,
    nodeName: string,
    namespace: string,
    name: string,
    labels: Record<string, string>,
    ports: ContainerPorts,
  ): Promise<ClusterPod> {
    this.put("pods", this.podObject(namespace, name, labels, nodeName, ports));
    return await this.sandbox(node, nodeName, namespace, name, labels, ports, "");
  }

  /**
   * A new sandbox of the pod (kubelet's next sandbox of the same Pod, in a new namespace
   * `<ns>-<name><suffix>`, container `c-<ns>-<name><suffix>`): its ADD and its status;
   * the test DELs the old one.
   */
  async sandbox(
    node: SimulatedNode,
    nodeName: string,
    namespace: string,
    name: string,
    labels: Record<string, string>,
    ports: ContainerPorts,
    suffix: string,
  ): Promise<ClusterPod> {
    const ns = await node.vpc.pod(`${namespace}-${name}${suffix}`.slice(0, 32));
    await this.servers.start(ns, `${namespace}/${name}`, POD_PORTS);
    const args = this.cniArgs(namespace, name);
    const containerId = `c-${namespace}-${name}${suffix}`;
    const res = await node.add(ns, { containerId, args, config: this.netconf(node) });
    const addr = (fam: 4 | 6) =>
      res.ips.map((i) => i.address.split("/")[0]).find((x) => x.includes(":") === (fam === 6))!;
    const v4 = addr(4), v6 = addr(6);
    this.put("pods", this.podObject(namespace, name, labels, nodeName, ports, { v4, v6 }));
    const prober = await Prober.start(ns.name);
    this.#probers.push(prober);
    const pod: ClusterPod = {
      id: `${namespace}/${name}`,
      namespace,
      name,
      labels,
      node,
      ns,
      res,
      v4,
      v6,
      prober,
      args,
      containerId,
      ports,
      nodeName,
    };
    this.pods.set(pod.id, pod);
    return pod;
  }

  /** The CNI_ARGS kubelet passes for a pod: its namespace, name and uid (its object's). */
  cniArgs(namespace: string, name: string): string {
    const uid: string | undefined = this.server.get("pods", `${namespace}/${name}`)?.metadata.uid;
    return `K8S_POD_NAMESPACE=${namespace};K8S_POD_NAME=${name};${
      uid ? `K8S_POD_UID=${uid};` : ""
    }IgnoreUnknown=1`;
  }

  /** DELs a sandbox of a pod (as kubelet does when it goes). */
  async del(pod: ClusterPod): Promise<void> {
    await pod.node.del(pod.ns, {
      containerId: pod.containerId,
      args: pod.args,
      config: this.netconf(pod.node),
    });
  }

  /** Gives a pod new labels (its Pod object written again, its status kept). */
  relabel(pod: ClusterPod, labels: Record<string, string>): void {
    pod.labels = labels;
    this.put(
      "pods",
      this.podObject(pod.namespace, pod.name, labels, pod.nodeName, pod.ports, {
        v4: pod.v4,
        v6: pod.v6,
      }),
    );
  }

  /** A prober in any namespace (a node's, a VPC machine's). */
  async prober(netns: string): Promise<Prober> {
    const p = await Prober.start(netns);
    this.#probers.push(p);
    return p;
  }

  /**
   * Waits until every node's agent has put in place every write made so far (each
   * cache's enforced resourceVersion at least the last write's, nothing pending).
   */
  async settle(timeoutMs = 20_000): Promise<void> {
    const want = new Map(this.#lastRv);
    for (const node of this.nodes) {
      let last: Status["policy"] | undefined;
      const ok = await poll(async () => {
        const s = (await node.client.status()).policy;
        last = s;
        if (!s?.synced || s.pendingEvents > 0) return null;
        for (const [resource, rv] of want) {
          const c = s.caches.find((x) => x.resource === resource);
          if (!c || Number(c.enforcedResourceVersion ?? 0) < rv) return null;
        }
        if (s.pods.some((p) => p.state === "retrying")) return null;
        return true;
      }, { timeoutMs, intervalMs: 25 });
      assert(ok, `The agent did not put the cluster's changes in place: ${JSON.stringify(last)}`);
    }
  }

  /** Stops everything: probers, servers, nodes (joined ones first), the bridge, the server. */
  async close(): Promise<void> {
    for (const p of this.#probers.splice(0)) await p.close().catch(() => {});
    await this.servers[Symbol.asyncDispose]().catch(() => {});
    for (const n of [...this.nodes].reverse()) await n.close().catch(() => {});
    await this.bridge.close().catch(() => {});
    await this.server.close().catch(() => {});
    await Deno.remove(this.pki.dir, { recursive: true }).catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
