/**
 * The real control plane as the NetworkPolicy tests' API server (a {@linkcode PolicyApi} of
 * tests/support/policy_cluster.ts): kube-apiserver, etcd, the controller-manager and the
 * scheduler of tests/support/k8s/cluster.ts, with everything in deploy/kubernetes/ applied.
 * The harness's objects become what a user and kubelet would send: namespaces and
 * NetworkPolicies by server-side apply (strict validation; the server defaults them), Pods
 * created with their spec (no status, no made-up owner: the real garbage collector would
 * delete a pod whose owner does not exist) and their status written by the node's
 * simulated kubelet (tests/support/k8s/kubelet.ts, its own node credentials), label changes
 * by a merge patch, pod deletion as the user asks it and kubelet finishes it. Each node's
 * agent authenticates as the shipped ServiceAccount `kube-system/enim-agent` with a
 * TokenRequest token in a projected-volume folder of its sandbox (tests/support/k8s/token.ts)
 * through a YAML kubeconfig with `tokenFile`. The nodes reach the API server through a
 * relay (tests/support/tcp_relay.ts) that {@linkcode RealApi.down} and {@linkcode RealApi.up}
 * control.
 *
 * @module
 */
import { z } from "zod";
import type { Obj, Resource } from "../kube_apiserver.ts";
import type { PolicyApi } from "../policy_cluster.ts";
import type { SimulatedNode } from "../node.ts";
import { KubeCluster, type KubeClusterOptions } from "./cluster.ts";
import { SimulatedKubelet } from "./kubelet.ts";
import { applyManifests, type ApplyOutcome, FIELD_MANAGER, readManifests } from "./manifests.ts";
import { TcpRelay } from "../tcp_relay.ts";
import { StoredSchema } from "./rest.ts";
import { ProjectedToken } from "./token.ts";
import { goMissing } from "./build.ts";

/** The agent's ServiceAccount in deploy/kubernetes/rbac.yaml. */
export const AGENT_SERVICE_ACCOUNT = { namespace: "kube-system", name: "enim-agent" };

/** The folder of the agent's token in its sandbox (`/run/enim/serviceaccount/token`). */
const TOKEN_DIR = "serviceaccount";

const PodStoredSchema = StoredSchema.extend({
  status: z.optional(z.looseObject({
    podIPs: z.optional(z.array(z.object({ ip: z.string() }))),
  })),
});

const enc = encodeURIComponent;

/** The real control plane as a {@linkcode PolicyApi} (see the module doc). */
export class RealApi implements PolicyApi {
  readonly cluster: KubeCluster;
  readonly relay: TcpRelay;
  /** What applying deploy/kubernetes/ did. */
  readonly applied: ApplyOutcome[];
  /** Each admitted node's token, by node name. */
  readonly tokens = new Map<string, ProjectedToken>();
  readonly #kubelets = new Map<string, SimulatedKubelet>();
  readonly #namespaces = new Set<string>();

  private constructor(cluster: KubeCluster, relay: TcpRelay, applied: ApplyOutcome[]) {
    this.cluster = cluster;
    this.relay = relay;
    this.applied = applied;
  }

  get name(): string {
    return `kube-apiserver v${this.cluster.bins.version}`;
  }

  get url(): string {
    return `https://127.0.0.1:${this.relay.port}`;
  }

  /** Starts the control plane and applies deploy/kubernetes/. */
  static async start(o: KubeClusterOptions = {}): Promise<RealApi> {
    const cluster = await KubeCluster.start(o);
    try {
      const applied = await applyManifests(
        cluster.admin,
        await readManifests(cluster.bins.version),
      );
      return new RealApi(cluster, TcpRelay.start(cluster.apiPort), applied);
    } catch (err) {
      await cluster.stop();
      throw err;
    }
  }

  /** The kubelet of `node` (made on first use). */
  async kubelet(node: string): Promise<SimulatedKubelet> {
    let k = this.#kubelets.get(node);
    if (!k) {
      k = await SimulatedKubelet.of(this.cluster, node);
      this.#kubelets.set(node, k);
    }
    return k;
  }

  async admitNode(
    node: SimulatedNode,
    nodeName: string,
    port: number,
    addresses: string[],
  ): Promise<void> {
    const k = await this.kubelet(nodeName);
    await k.register({ addresses: addresses.length ? addresses : ["10.0.0.254"], enis: 8 });
    const token = await ProjectedToken.create(
      this.cluster,
      node.sandbox.host(TOKEN_DIR),
      AGENT_SERVICE_ACCOUNT.namespace,
      AGENT_SERVICE_ACCOUNT.name,
    );
    this.tokens.set(nodeName, token);
    await Deno.writeTextFile(
      node.sandbox.host("kubeconfig"),
      this.cluster.kubeconfig(
        { tokenFile: node.sandbox.inner(`${TOKEN_DIR}/token`) },
        `https://127.0.0.1:${port}`,
      ),
    );
  }

  async write(resource: Resource, obj: Obj): Promise<number> {
    switch (resource) {
      case "namespaces":
        return await this.#namespace(obj);
      case "networkpolicies":
        return await this.#policy(obj);
      case "pods":
        return await this.#pod(obj);
    }
  }

  async #namespace(obj: Obj): Promise<number> {
    const name = String(obj.metadata.name);
    const stored = await this.cluster.admin.apply(
      `/api/v1/namespaces/${enc(name)}`,
      {
        apiVersion: "v1",
        kind: "Namespace",
        metadata: { name, labels: obj.metadata.labels ?? {} },
      },
      StoredSchema,
      FIELD_MANAGER,
    );
    if (!this.#namespaces.has(name)) {
      // Pods are refused until the controller made the namespace's default ServiceAccount.
      await this.cluster.waitServiceAccount(name, "default");
      this.#namespaces.add(name);
    }
    return Number(stored.metadata.resourceVersion);
  }

  async #policy(obj: Obj): Promise<number> {
    const { namespace, name } = obj.metadata;
    const stored = await this.cluster.admin.apply(
      `/apis/networking.k8s.io/v1/namespaces/${enc(namespace)}/networkpolicies/${enc(name)}`,
      {
        apiVersion: "networking.k8s.io/v1",
        kind: "NetworkPolicy",
        metadata: {
          namespace,
          name,
          ...(obj.metadata.labels ? { labels: obj.metadata.labels } : {}),
        },
        spec: obj.spec,
      },
      StoredSchema,
      FIELD_MANAGER,
    );
    return Number(stored.metadata.resourceVersion);
  }

  /** The uid the real server gave a pod (undefined: no such pod). */
  async podUid(namespace: string, name: string): Promise<string | undefined> {
    const path = `/api/v1/namespaces/${enc(namespace)}/pods/${enc(name)}`;
    return (await this.cluster.admin.find(path, PodStoredSchema))?.metadata.uid;
  }

  /** A Pod as the harness describes it: created or relabelled, its status by its kubelet. */
  async #pod(obj: Obj): Promise<number> {
    const { namespace, name } = obj.metadata;
    const labels: Record<string, string> = obj.metadata.labels ?? {};
    const path = `/api/v1/namespaces/${enc(namespace)}/pods/${enc(name)}`;
    const nodeName: string | undefined = obj.spec?.nodeName;
    const admin = this.cluster.admin;
    let stored = await admin.find(path, PodStoredSchema);
    let rv: number;
    if (stored === null) {
      const created = await admin.create(`/api/v1/namespaces/${enc(namespace)}/pods`, {
        apiVersion: "v1",
        kind: "Pod",
        metadata: { name, namespace, labels },
        spec: {
          ...(nodeName ? { nodeName } : {}),
          ...(obj.spec?.hostNetwork ? { hostNetwork: true } : {}),
          containers: (obj.spec?.containers ?? [{ name: "main" }]).map((
            c: Obj,
          ) => ({
            name: c.name,
            image: "registry.example.com/enim-test/app:1",
            ...(c.ports?.length
              ? {
                ports: c.ports.map((p: Obj) => ({
                  ...(p.name ? { name: p.name } : {}),
                  containerPort: p.containerPort,
                  ...(p.protocol ? { protocol: p.protocol } : {}),
                })),
              }
              : {}),
          })),
        },
      }, PodStoredSchema);
      rv = Number(created.metadata.resourceVersion);
      stored = created;
      if (nodeName) {
        const k = await this.kubelet(nodeName);
        stored = await k.starting(namespace, name);
        rv = Number(stored.metadata.resourceVersion);
      }
    } else {
      rv = Number(stored.metadata.resourceVersion);
      const had = stored.metadata.labels ?? {};
      const same = Object.keys(had).length === Object.keys(labels).length &&
        Object.entries(labels).every(([k, v]) => had[k] === v);
      if (!same) {
        const patch: Record<string, string | null> = { ...labels };
        for (const k of Object.keys(had)) if (!(k in labels)) patch[k] = null;
        const p = await admin.patch(
          path,
          { metadata: { labels: patch } },
          PodStoredSchema,
          "merge",
        );
        rv = Number(p.metadata.resourceVersion);
      }
    }
    const ips: string[] = (obj.status?.podIPs ?? []).map((x: { ip: string }) => x.ip);
    const storedIps = (stored.status?.podIPs ?? []).map((x) => x.ip);
    if (nodeName && ips.length && ips.join() !== storedIps.join()) {
      const k = await this.kubelet(nodeName);
      const running = await k.running(namespace, name, ips);
      rv = Number(running.metadata.resourceVersion);
    }
    return rv;
  }

  async remove(resource: Resource, namespace: string | undefined, name: string) {
    const admin = this.cluster.admin;
    if (resource === "pods") {
      const path = `/api/v1/namespaces/${enc(namespace!)}/pods/${enc(name)}`;
      const pod = await admin.find(
        path,
        StoredSchema.extend({
          spec: z.looseObject({ nodeName: z.optional(z.string()) }),
        }),
      );
      if (!pod) return null;
      await admin.delete(path);
      if (!pod.spec.nodeName) return await this.cluster.etcdRevision();
      return Number(await (await this.kubelet(pod.spec.nodeName)).finishDeletion(namespace!, name));
    }
    const collection = resource === "namespaces"
      ? "/api/v1/namespaces"
      : `/apis/networking.k8s.io/v1/namespaces/${enc(namespace!)}/networkpolicies`;
    const path = `${collection}/${enc(name)}`;
    const before = await admin.find(path, StoredSchema);
    if (!before) return null;
    // The DELETE answers a Status without the deletion's resourceVersion (NetworkPolicy's
    // registry does not return the deleted object): its DELETED event carries it.
    const gone = await admin.watchFor(collection, {
      resourceVersion: before.metadata.resourceVersion,
      fieldSelector: `metadata.name=${name}`,
      match: (e) => e.type === "DELETED",
      started: () => admin.delete(path, {}, false),
    });
    return Number(gone.object.metadata.resourceVersion);
  }

  down(): Promise<void> {
    return this.relay.down();
  }

  up(): void {
    this.relay.up();
  }

  async close(): Promise<void> {
    for (const k of this.#kubelets.values()) k.close();
    await this.relay.close().catch(() => {});
    await this.cluster.stop();
  }
}

/**
 * The API server the NetworkPolicy end-to-end tests run on: the real one when Go is here
 * (`ENIM_POLICY_API=test` asks for the test API server anyway), else the test API server,
 * saying why.
 */
export function realApiWanted(): { real: boolean; why: string } {
  if (Deno.env.get("ENIM_POLICY_API") === "test") {
    return { real: false, why: "ENIM_POLICY_API=test" };
  }
  const missing = goMissing();
  return missing ? { real: false, why: missing } : { real: true, why: "Go is installed" };
}
