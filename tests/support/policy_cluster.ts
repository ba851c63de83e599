/**
 * A small Kubernetes cluster for the NetworkPolicy end-to-end tests: an API server reached
 * from each simulated node through a {@linkcode KubeBridge}, nodes whose agents read it (a
 * kubeconfig in the node's sandbox, `/run/enim/kubeconfig`: the sandbox's private
 * /run/enim, which the permission set reads), and enim pods created as kubelet does: the
 * Pod object (labels, named container ports, node) first, then the sandbox's CNI ADD, then
 * the Pod's status with its addresses. Each pod runs an answer server on
 * {@linkcode POD_PORTS} and a {@linkcode Prober}.
 *
 * The API server is a {@linkcode PolicyApi}: the test API server
 * (tests/support/kube_apiserver.ts, {@linkcode TestServerApi}, the default; for faults
 * injected between client and server) or the real control plane
 * (tests/support/k8s/policy_api.ts: kube-apiserver, etcd, the controller-manager, the
 * agents authenticated as the shipped RBAC's ServiceAccount). Writes ({@linkcode put},
 * {@linkcode remove}, {@linkcode namespace}, {@linkcode relabel}) are queued in order;
 * everything that waits ({@linkcode pod}, {@linkcode settle}, …) waits for them first.
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

/**
 * The API server a {@linkcode PolicyCluster} writes to and its nodes' agents read:
 * writes answer with the resourceVersion they made (what {@linkcode PolicyCluster.settle}
 * waits for the agents to reach).
 */
export interface PolicyApi {
  /** Where the nodes' bridge connects: `https://127.0.0.1:<port>`. */
  readonly url: string;
  /** What it is, for test names and logs. */
  readonly name: string;
  /** Creates or replaces an object; resolves to the resourceVersion of its last write. */
  write(resource: Resource, obj: Obj): Promise<number>;
  /** Deletes an object; resolves to the delete's resourceVersion (null: it was not there). */
  remove(resource: Resource, namespace: string | undefined, name: string): Promise<number | null>;
  /** The uid the server gave a pod (undefined: no such pod). */
  podUid(namespace: string, name: string): Promise<string | undefined>;
  /**
   * Gives `node` (named `nodeName` in the cluster; `addresses` its own) what its agent
   * needs: the kubeconfig at the sandbox's `kubeconfig` for `https://127.0.0.1:<port>`.
   */
  admitNode(
    node: SimulatedNode,
    nodeName: string,
    port: number,
    addresses: string[],
  ): Promise<void>;
  /** Refuses the nodes' connections and cuts the open ones. */
  down(): Promise<void>;
  /** Accepts them again. */
  up(): void;
  close(): Promise<void>;
}

/** The test API server (tests/support/kube_apiserver.ts) as a {@linkcode PolicyApi}. */
export class TestServerApi implements PolicyApi {
  readonly name = "the test API server";
  readonly pki: TestPki;
  readonly server: KubeApiServer;

  private constructor(pki: TestPki, server: KubeApiServer) {
    this.pki = pki;
    this.server = server;
  }

  /** A new test API server with its own PKI. */
  static async start(): Promise<TestServerApi> {
    const pki = await makeTestPki();
    return new TestServerApi(pki, KubeApiServer.start({ pki }));
  }

  get url(): string {
    return this.server.url;
  }

  write(resource: Resource, obj: Obj): Promise<number> {
    return Promise.resolve(Number(this.server.put(resource, obj).metadata.resourceVersion));
  }

  remove(resource: Resource, namespace: string | undefined, name: string) {
    const gone = this.server.remove(resource, namespace, name);
    return Promise.resolve(gone ? Number(this.server.resourceVersion) : null);
  }

  podUid(namespace: string, name: string): Promise<string | undefined> {
    return Promise.resolve(this.server.get("pods", `${namespace}/${name}`)?.metadata.uid);
  }

  /** The kubeconfig as a cluster hands one out: YAML (the bearer token inline). */
  async admitNode(node: SimulatedNode, _name: string, port: number): Promise<void> {
    await Deno.writeTextFile(node.sandbox.host("kubeconfig"), kubeconfigFor(this.server, port));
  }

  down(): Promise<void> {
    return this.server.down();
  }

  up(): void {
    this.server.up();
  }

  async close(): Promise<void> {
    await this.server.close().catch(() => {});
    await Deno.remove(this.pki.dir, { recursive: true }).catch(() => {});
  }
}

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
  /** The API server. */
  readonly api: PolicyApi;
  readonly bridge: KubeBridge;
  readonly nodes: SimulatedNode[] = [];
  readonly pods = new Map<string, ClusterPod>();
  readonly servers = new Servers();
  /** The resourceVersion of the last write of each kind (what {@linkcode settle} waits for). */
  readonly #lastRv = new Map<Resource, number>();
  readonly #probers: Prober[] = [];
  /** The queued writes, in order; the first failure is kept and thrown by {@linkcode flush}. */
  #writes: Promise<void> = Promise.resolve();
  #pending = 0;
  #writeError: unknown = null;

  private constructor(api: PolicyApi) {
    this.api = api;
    this.bridge = KubeBridge.start(api);
  }

  /** The cluster on `api` (default: a new test API server), and its bridge (no node yet). */
  static async start(api?: PolicyApi): Promise<PolicyCluster> {
    return new PolicyCluster(api ?? await TestServerApi.start());
  }

  /** The test API server's PKI; throws on a real one. */
  get pki(): TestPki {
    if (this.api instanceof TestServerApi) return this.api.pki;
    throw new Error(`This cluster runs on ${this.api.name}, not on the test API server`);
  }

  /** The test API server (for the faults only it can inject); throws on a real one. */
  get server(): KubeApiServer {
    if (this.api instanceof TestServerApi) return this.api.server;
    throw new Error(`This cluster runs on ${this.api.name}, not on the test API server`);
  }

  /**
   * Runs `write` after the writes queued before it; with none pending it starts at once,
   * so that on the test API server (whose writes are synchronous) a write has happened
   * when {@linkcode put} returns, as it always had.
   */
  #queue(write: () => Promise<number | null>, resource: Resource): void {
    const run = async (started?: Promise<number | null>) => {
      if (this.#writeError !== null) return;
      try {
        const rv = await (started ?? write());
        if (rv !== null) this.#lastRv.set(resource, Math.max(rv, this.#lastRv.get(resource) ?? 0));
      } catch (err) {
        this.#writeError = err;
      } finally {
        this.#pending--;
      }
    };
    const idle = this.#pending === 0;
    this.#pending++;
    if (idle && this.#writeError === null) {
      let started: Promise<number | null>;
      try {
        started = write();
      } catch (err) {
        started = Promise.reject(err);
      }
      this.#writes = run(started);
    } else {
      this.#writes = this.#writes.then(() => run());
    }
  }

  /** Waits for every queued write; throws the first that failed. */
  async flush(): Promise<void> {
    await this.#writes;
    if (this.#writeError !== null) throw this.#writeError;
  }

  /** Creates or replaces an object (queued), remembering its resourceVersion. */
  put(resource: Resource, obj: Obj): void {
    const copy = structuredClone(obj);
    this.#queue(() => this.api.write(resource, copy), resource);
  }

  /** Deletes an object (queued), remembering the delete's resourceVersion. */
  remove(resource: Resource, namespace: string | undefined, name: string): void {
    this.#queue(() => this.api.remove(resource, namespace, name), resource);
  }

  /** A namespace with its labels. */
  namespace(name: string, labels: Record<string, string>): void {
    this.put("namespaces", makeNamespace(name, labels));
  }

  /**
   * A node (its agent reading this cluster as `name`): the options of
   * {@linkcode SimulatedNode.start} (the agent started once its kubeconfig is written).
   */
  async node(
    name: string,
    o: SimulatedNodeOptions = {},
    /** The argv prefix of another build to run there (`tests/support/releases.ts`). */
    argv?: string[],
  ): Promise<SimulatedNode> {
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
    const addresses = [node.nic?.ipv4, node.nic?.ipv6].filter((a): a is string => !!a);
    await this.flush();
    await this.api.admitNode(node, name, port, addresses);
    node.agentArgv = argv;
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
    const args = await this.cniArgs(namespace, name);
    const containerId = `c-${namespace}-${name}${suffix}`;
    await this.flush();
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
  async cniArgs(namespace: string, name: string): Promise<string> {
    await this.flush();
    const uid = await this.api.podUid(namespace, name);
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
    await this.flush();
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
    await this.#writes.catch(() => {});
    await this.api.close().catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
