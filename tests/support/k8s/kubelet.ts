/**
 * kubelet's side of the API, simulated for a real control plane (tests/support/k8s/cluster.ts)
 * from kubelet's published behaviour: each node authenticates with its own client
 * certificate (`system:node:<name>`, so the Node authorizer and NodeRestriction judge it as
 * they judge a kubelet), registers its Node (the labels kubelet sets, then its status:
 * addresses, capacity with the device plugin's `enim.dev/eni`, conditions, nodeInfo), and
 * writes each pod's status through the status subresource with a strategic merge patch:
 * `Pending` with waiting containers when it starts the pod, then the pod's IPs, `Running`
 * and Ready once the sandbox's CNI ADD answered; at deletion the terminal status and the
 * final DELETE (grace 0, with the pod's UID as precondition).
 *
 * The node lifecycle controller is not run (there is no heartbeat to watch); its one
 * visible act on a healthy node — removing the `node.kubernetes.io/not-ready` taint that
 * admission put on the new Node — is done by {@linkcode SimulatedKubelet.register} as the
 * admin.
 *
 * @module
 */
import { z } from "zod";
import type { KubeCluster } from "./cluster.ts";
import { type KubeRest, StoredSchema } from "./rest.ts";

/** A pod as the tests read it back. */
export const PodSchema = StoredSchema.extend({
  spec: z.looseObject({
    nodeName: z.optional(z.string()),
    hostNetwork: z.optional(z.boolean()),
    serviceAccountName: z.optional(z.string()),
    containers: z.array(z.looseObject({
      name: z.string(),
      image: z.string(),
      resources: z.optional(z.looseObject({
        limits: z.optional(z.record(z.string(), z.string())),
        requests: z.optional(z.record(z.string(), z.string())),
      })),
      ports: z.optional(z.array(z.looseObject({
        name: z.optional(z.string()),
        containerPort: z.number(),
        protocol: z.optional(z.string()),
      }))),
    })),
  }),
  status: z.optional(z.looseObject({
    phase: z.optional(z.string()),
    podIP: z.optional(z.string()),
    podIPs: z.optional(z.array(z.object({ ip: z.string() }))),
    conditions: z.optional(z.array(z.looseObject({ type: z.string(), status: z.string() }))),
  })),
});
/** A stored pod. */
export type StoredPod = z.infer<typeof PodSchema>;

/** A Node as the tests read it back. */
export const NodeSchema = StoredSchema.extend({
  spec: z.looseObject({
    taints: z.optional(z.array(z.looseObject({ key: z.string(), effect: z.string() }))),
  }),
  status: z.optional(z.looseObject({
    capacity: z.optional(z.record(z.string(), z.string())),
    allocatable: z.optional(z.record(z.string(), z.string())),
    addresses: z.optional(z.array(z.object({ type: z.string(), address: z.string() }))),
    conditions: z.optional(z.array(z.looseObject({ type: z.string(), status: z.string() }))),
  })),
});

/** What a node says about itself. */
export interface NodeInfo {
  /** The node's InternalIP addresses. */
  addresses: string[];
  /** The `enim.dev/eni` devices the agent's device plugin advertises (default none). */
  enis?: number;
}

const now = () => new Date().toISOString().replace(/\.\d+Z$/, "Z");

/**
 * The pod's `Ready` and `ContainersReady` conditions, both `status`, with `reason` and
 * `message` (null clears them, as kubelet's patch does once the pod is ready; absent
 * leaves them out).
 */
function readiness(
  status: "True" | "False",
  t: string,
  reason?: string | null,
  message?: string | null,
) {
  return ["Ready", "ContainersReady"].map((type) => ({
    type,
    status,
    ...(reason === undefined ? {} : { reason }),
    ...(message === undefined ? {} : { message }),
    lastTransitionTime: t,
  }));
}

/**
 * Each of the pod's containers in `state` (kubelet's `waiting`, `running` or
 * `terminated`): ready and started only while running, with an image ID and a
 * container ID once it runs.
 */
function containerStatuses(
  pod: StoredPod,
  state:
    | { waiting: { reason: string } }
    | { running: { startedAt: string } }
    | { terminated: { exitCode: number; reason: string; finishedAt: string } },
) {
  const running = "running" in state;
  return pod.spec.containers.map((x) => ({
    name: x.name,
    image: x.image,
    imageID: running ? `${x.image}@sha256:${"0".repeat(64)}` : "",
    ...(running ? { containerID: `containerd://${crypto.randomUUID().replaceAll("-", "")}` } : {}),
    ready: running,
    restartCount: 0,
    started: running,
    state,
  }));
}

/** One node's kubelet, as far as the API server sees it. */
export class SimulatedKubelet {
  readonly name: string;
  readonly #cluster: KubeCluster;
  readonly #rest: KubeRest;
  #addresses: string[] = [];

  private constructor(cluster: KubeCluster, name: string, rest: KubeRest) {
    this.#cluster = cluster;
    this.name = name;
    this.#rest = rest;
  }

  /** The kubelet of node `name`, with its own client certificate. */
  static async of(cluster: KubeCluster, name: string): Promise<SimulatedKubelet> {
    const cert = await cluster.nodeCert(name);
    return new SimulatedKubelet(cluster, name, await cluster.client({ cert }));
  }

  /** The REST client as this node. */
  get rest(): KubeRest {
    return this.#rest;
  }

  /**
   * Registers the Node as kubelet does at start (create with kubelet's labels, then its
   * status), and removes the not-ready taint as the node lifecycle controller would once
   * the node is Ready. Returns the Node as stored.
   */
  async register(info: NodeInfo): Promise<z.infer<typeof NodeSchema>> {
    this.#addresses = info.addresses;
    const n = this.name;
    const existing = await this.#rest.find(`/api/v1/nodes/${n}`, NodeSchema);
    if (!existing) {
      await this.#rest.create("/api/v1/nodes", {
        apiVersion: "v1",
        kind: "Node",
        metadata: {
          name: n,
          labels: {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": n,
            "kubernetes.io/os": "linux",
          },
          annotations: { "volumes.kubernetes.io/controller-managed-attach-detach": "true" },
        },
        spec: {},
      }, NodeSchema);
    }
    const capacity: Record<string, string> = {
      cpu: "4",
      memory: "8Gi",
      pods: "110",
      "ephemeral-storage": "40Gi",
      ...(info.enis !== undefined ? { "enim.dev/eni": String(info.enis) } : {}),
    };
    const t = now();
    const cond = (type: string, status: string, reason: string, message: string) => ({
      type,
      status,
      reason,
      message,
      lastHeartbeatTime: t,
      lastTransitionTime: t,
    });
    await this.#rest.patch(`/api/v1/nodes/${n}/status`, {
      status: {
        capacity,
        allocatable: capacity,
        conditions: [
          cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
          ),
          cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
          cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
          ),
          cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        addresses: [
          ...info.addresses.map((address) => ({ type: "InternalIP", address })),
          { type: "Hostname", address: n },
        ],
        daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
        nodeInfo: {
          machineID: crypto.randomUUID().replaceAll("-", ""),
          systemUUID: crypto.randomUUID(),
          bootID: crypto.randomUUID(),
          kernelVersion: Deno.osRelease(),
          osImage: "enim test node",
          containerRuntimeVersion: "containerd://2.1.0",
          kubeletVersion: `v${this.#cluster.bins.version}`,
          operatingSystem: "linux",
          architecture: "amd64",
        },
      },
    }, NodeSchema);
    // The node lifecycle controller's part: a Ready node loses the not-ready taint.
    const stored = await this.#cluster.admin.get(`/api/v1/nodes/${n}`, NodeSchema);
    const taints = stored.spec.taints ?? [];
    const kept = taints.filter((x) => x.key !== "node.kubernetes.io/not-ready");
    if (kept.length !== taints.length) {
      return await this.#cluster.admin.patch(
        `/api/v1/nodes/${n}`,
        { spec: { taints: kept } },
        NodeSchema,
        "merge",
      );
    }
    return stored;
  }

  #podPath(namespace: string, name: string): string {
    return `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`;
  }

  /** The pod as stored now. */
  pod(namespace: string, name: string): Promise<StoredPod> {
    return this.#cluster.admin.get(this.#podPath(namespace, name), PodSchema);
  }

  /** The status kubelet writes when it starts the pod's sandbox: Pending, containers waiting. */
  async starting(namespace: string, name: string): Promise<StoredPod> {
    const pod = await this.pod(namespace, name);
    const t = now();
    const c = pod.spec.containers.map((x) => x.name);
    const unready = `containers with unready status: [${c.join(" ")}]`;
    return await this.#rest.patch(`${this.#podPath(namespace, name)}/status`, {
      status: {
        phase: "Pending",
        hostIP: this.#addresses[0],
        hostIPs: this.#addresses.map((ip) => ({ ip })),
        startTime: t,
        conditions: [
          { type: "PodReadyToStartContainers", status: "False", lastTransitionTime: t },
          { type: "Initialized", status: "True", lastTransitionTime: t },
          ...readiness("False", t, "ContainersNotReady", unready),
        ],
        containerStatuses: containerStatuses(pod, { waiting: { reason: "ContainerCreating" } }),
      },
    }, PodSchema);
  }

  /** The status once the sandbox has its IPs (the CNI ADD's) and the containers run: Ready. */
  async running(namespace: string, name: string, ips: string[]): Promise<StoredPod> {
    const pod = await this.pod(namespace, name);
    const t = now();
    return await this.#rest.patch(`${this.#podPath(namespace, name)}/status`, {
      status: {
        phase: "Running",
        hostIP: this.#addresses[0],
        hostIPs: this.#addresses.map((ip) => ({ ip })),
        // A strategic merge patch merges podIPs by `ip`: the addresses of an earlier
        // sandbox are deleted explicitly, as kubelet's computed patch does.
        ...(ips.length
          ? {
            podIP: ips[0],
            "$setElementOrder/podIPs": ips.map((ip) => ({ ip })),
            podIPs: [
              ...ips.map((ip) => ({ ip })),
              ...(pod.status?.podIPs ?? []).filter((p) => !ips.includes(p.ip)).map((p) => ({
                ip: p.ip,
                $patch: "delete",
              })),
            ],
          }
          : {}),
        conditions: [
          { type: "PodReadyToStartContainers", status: "True", lastTransitionTime: t },
          { type: "Initialized", status: "True", lastTransitionTime: t },
          ...readiness("True", t, null, null),
        ],
        containerStatuses: containerStatuses(pod, { running: { startedAt: t } }),
      },
    }, PodSchema);
  }

  /**
   * What kubelet does once a deleted pod's containers stopped and its sandbox was torn
   * down: the terminal status, then the final DELETE (grace 0, the pod's UID as
   * precondition). Returns the DELETE's resourceVersion.
   */
  async finishDeletion(namespace: string, name: string): Promise<string> {
    const pod = await this.pod(namespace, name);
    const t = now();
    await this.#rest.patch(`${this.#podPath(namespace, name)}/status`, {
      status: {
        phase: "Failed",
        conditions: readiness("False", t, "PodCompleted"),
        containerStatuses: containerStatuses(pod, {
          terminated: { exitCode: 137, reason: "Error", finishedAt: t },
        }),
      },
    }, PodSchema);
    const r = await this.#rest.raw("DELETE", this.#podPath(namespace, name), {
      body: JSON.stringify({
        kind: "DeleteOptions",
        apiVersion: "v1",
        gracePeriodSeconds: 0,
        preconditions: { uid: pod.metadata.uid },
      }),
      contentType: "application/json",
    });
    if (r.status !== 200) {
      throw new Error(
        `kubelet's final DELETE of "${namespace}/${name}" answered ${r.status}: ${r.text}`,
      );
    }
    return PodSchema.parse(r.body).metadata.resourceVersion;
  }

  close(): void {
    this.#rest.close();
  }
}
