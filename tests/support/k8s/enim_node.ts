/**
 * enim installed on a real node as an operator installs it (issue 50): what
 * tests/k8s_real_node_daemonset_test.ts, tests/k8s_real_node_lifecycle_test.ts and
 * `deno task node` (scripts/node.ts) share.
 *
 * - {@linkcode simulatedManifests}: deploy/kubernetes/ as shipped, but for the agent's
 *   ConfigMap ({@linkcode simulatedAgentConfig}): the mock provider's subnet is the simulated
 *   VPC's and its device simulator plugs the ENIs (the cloud is simulated: docs/testing.md).
 * - {@linkcode installEnim}: enim's image (`deno task image`) imported into the node's
 *   containerd under the name the manifests give, the manifests applied, and the waits an
 *   operator does: the DaemonSet's pod Ready, the Node Ready, `enim.dev/eni` allocatable.
 * - {@linkcode releaseManifests}, {@linkcode withImage}, {@linkcode withImageInstaller}: an
 *   earlier release's manifests from history and the image tags a rollout changes
 *   (tests/k8s_rollout_test.ts).
 * - {@linkcode EnimNode.start}: a control plane, a simulated VPC, one real node and that
 *   install, torn down together.
 * - What the tests read of the node: the agent's API on its socket ({@linkcode agentClient}),
 *   the plugin's own log of what the runtime invoked ({@linkcode cniInvocations}), pods
 *   with their container statuses ({@linkcode RealPodSchema}).
 *
 * @module
 */
import { z } from "zod";
import { join } from "node:path";
import {
  applyManifests,
  forRelease,
  MANIFEST_DIR,
  type ManifestDoc,
  readFileDocs,
  readManifests,
} from "./manifests.ts";
import { KubeCluster, NODE_CONTROLLERS } from "./cluster.ts";
import { BUSYBOX_IMAGE, RealNode } from "./real_node.ts";
import { NodeSchema, PodSchema } from "./kubelet.ts";
import { type KubeRest, StoredListSchema } from "./rest.ts";
import { releaseSource } from "../releases.ts";
import { SimulatedVpc } from "../vpc.ts";
import { SocketAgentClient } from "../../../api/client.ts";
import { buildImage, type BuiltImage } from "../../../scripts/image.ts";

/** The image deploy/kubernetes/daemonset.yaml names (imported, never pulled). */
export const SHIPPED_IMAGE = "ghcr.io/example/enim:0.1.0";
/** The simulated VPC's subnet: outside the shipped conflist's serviceCidrs (10.96.0.0/12). */
export const VPC_SUBNET = { cidr: "10.200.0.0/24", gateway: "10.200.0.1" } as const;
/** The label selector of the DaemonSet's pods (not the uninstall Job's). */
export const AGENT_SELECTOR = "app.kubernetes.io/name=enim,app.kubernetes.io/component=agent";

/** A pod with what kubelet reports of its containers. */
export const RealPodSchema = PodSchema.extend({
  status: z.optional(z.looseObject({
    phase: z.optional(z.string()),
    podIP: z.optional(z.string()),
    conditions: z.optional(z.array(z.looseObject({ type: z.string(), status: z.string() }))),
    containerStatuses: z.optional(z.array(z.looseObject({
      name: z.string(),
      restartCount: z.number(),
      ready: z.boolean(),
      containerID: z.optional(z.string()),
      state: z.optional(z.looseObject({
        running: z.optional(z.looseObject({ startedAt: z.optional(z.string()) })),
      })),
    }))),
  })),
});
/** A pod as {@linkcode RealPodSchema} reads it. */
export type RealPod = z.infer<typeof RealPodSchema>;

/** A list of pods (a list's items carry no apiVersion and kind). */
export const PodListSchema = StoredListSchema.extend({
  items: z.array(
    RealPodSchema.extend({ apiVersion: z.optional(z.string()), kind: z.optional(z.string()) }),
  ),
});

/** Options of the simulated install. */
export interface SimulatedInstallOptions {
  /** The ENIs the mock provider gives the node (the Node's allocatable `enim.dev/eni`). */
  enis: number;
  /**
   * NetworkPolicy: `off` (default) or as shipped (the key left out: `auto`, on in a pod,
   * with the shipped RBAC; the node must serve the `kubernetes` Service first).
   */
  networkPolicy?: "off" | "shipped";
  /**
   * The release the configuration is for (default: this tree's). 0.1.0's schema is strict
   * and has no `metrics` or `cniConfig` (its init container installs the conflist), so its
   * configuration leaves them out.
   */
  release?: string;
}

/** The agent's configuration for the simulated cloud (the rest as the shipped ConfigMap). */
export function simulatedAgentConfig(vpc: SimulatedVpc, o: SimulatedInstallOptions): string {
  return JSON.stringify(
    {
      socket: "/run/enim/enim.sock",
      statePath: "/var/lib/enim/enim.db",
      provider: {
        name: "mock",
        mock: {
          enis: o.enis,
          subnets: { ipv4: { cidr: VPC_SUBNET.cidr, gateway: VPC_SUBNET.gateway } },
        },
      },
      devices: "ip",
      deviceSimulator: { vpcNetns: vpc.vpc.name, bridge: vpc.bridge },
      gc: { intervalSeconds: 30, graceSeconds: 30 },
      log: { level: "info", format: "json" },
      devicePlugin: { enabled: true },
      ...(o.networkPolicy === "shipped" ? {} : { networkPolicy: { enabled: false } }),
      // As the shipped ConfigMap: the conflist written once the agent answers, and the
      // metrics port the DaemonSet's startup and liveness probes ask.
      ...(o.release === "0.1.0" ? {} : {
        cniConfig: { source: "/etc/enim/10-enim.conflist" },
        metrics: { enabled: true, address: "0.0.0.0", port: 9798 },
      }),
    },
    null,
    2,
  );
}

/**
 * deploy/kubernetes/ as an install applies it on a cluster of `version`, the agent's
 * ConfigMap (`enim-agent-config`) holding {@linkcode simulatedAgentConfig} instead.
 */
export async function simulatedManifests(
  version: string,
  vpc: SimulatedVpc,
  o: SimulatedInstallOptions,
): Promise<ManifestDoc[]> {
  return withAgentConfig(await readManifests(version), simulatedAgentConfig(vpc, o));
}

const ContainerSchema = z.looseObject({ name: z.string(), image: z.string() });
const DaemonSetDocSchema = z.looseObject({
  spec: z.looseObject({
    template: z.looseObject({
      spec: z.looseObject({
        initContainers: z.optional(z.array(ContainerSchema)),
        containers: z.array(ContainerSchema),
      }),
    }),
  }),
});
const ConfigMapDocSchema = z.looseObject({ data: z.record(z.string(), z.string()) });

/** `docs` with the agent's ConfigMap holding `config` (agent.jsonc). */
export function withAgentConfig(docs: ManifestDoc[], config: string): ManifestDoc[] {
  return docs.map((d) => {
    if (d.kind !== "ConfigMap" || d.name !== "enim-agent-config") return d;
    const obj = ConfigMapDocSchema.parse(JSON.parse(d.text));
    obj.data["agent.jsonc"] = config;
    return { ...d, text: JSON.stringify(obj) };
  });
}

/**
 * `docs` with the DaemonSet's containers (the init container and the agent) running `ref`,
 * as an operator changes the tag to roll a release out (docs/upgrading.md).
 */
export function withImage(docs: ManifestDoc[], ref: string): ManifestDoc[] {
  return docs.map((d) => {
    if (d.kind !== "DaemonSet" || d.name !== "enim-agent") return d;
    const obj = DaemonSetDocSchema.parse(JSON.parse(d.text));
    const spec = obj.spec.template.spec;
    for (const c of [...(spec.initContainers ?? []), ...spec.containers]) c.image = ref;
    return { ...d, text: JSON.stringify(obj) };
  });
}

const JobDocSchema = z.looseObject({
  metadata: z.looseObject({ name: z.string() }),
  spec: z.looseObject({
    template: z.looseObject({
      spec: z.looseObject({
        nodeName: z.string(),
        containers: z.array(z.looseObject({ image: z.string(), command: z.array(z.string()) })),
      }),
    }),
  }),
});

/**
 * deploy/kubernetes/uninstall-job.yaml filled in as its comments tell an operator: the
 * node's name (the Job's and `spec.nodeName`), the image, and the choice of ENIs.
 */
export async function uninstallJob(
  node: string,
  image: string,
  enis: "--release-enis" | "--keep-enis",
): Promise<ManifestDoc> {
  const [doc] = await readFileDocs(MANIFEST_DIR, "uninstall-job.yaml");
  const obj = JobDocSchema.parse(JSON.parse(doc.text));
  obj.metadata.name = obj.metadata.name.replace("NODE_NAME", node);
  const spec = obj.spec.template.spec;
  spec.nodeName = node;
  const [c] = spec.containers;
  c.image = image;
  c.command = c.command.map((a) => a === "--keep-enis" || a === "--release-enis" ? enis : a);
  return { ...doc, name: obj.metadata.name, text: JSON.stringify(obj) };
}

/**
 * The manifests of the released `version` (e.g. "0.1.0"), read from its commit
 * ({@linkcode releaseSource}), as a cluster of `k8sVersion` takes them.
 */
export async function releaseManifests(
  version: string,
  k8sVersion: string,
): Promise<ManifestDoc[]> {
  const src = await releaseSource(version);
  return forRelease(await readManifests(undefined, join(src, "deploy", "kubernetes")), k8sVersion);
}

/**
 * 0.1.0's init container copies `/usr/local/bin/enim` onto the node: in 0.1.0 that was the
 * `deno compile` binary (deploy/Containerfile), which cannot be built here (`deno compile`
 * downloads denort; tests/k8s_rollout_test.ts). Its image is built with this tree's
 * scripts/image.ts around 0.1.0's bundle instead, where `/usr/local/bin/enim` is a launcher
 * of the image's own deno: the three lines that copied the binary become the image's
 * installer (`install-cni`, which puts deno, 0.1.0's bundle and a launcher on the node).
 * Everything else of 0.1.0's init container (it still writes the conflist from the
 * ConfigMap) stays as shipped.
 */
export function withImageInstaller(docs: ManifestDoc[]): ManifestDoc[] {
  const copy = [
    "cp /usr/local/bin/enim /host/opt/cni/bin/.enim.tmp\n",
    "chmod 0755 /host/opt/cni/bin/.enim.tmp\n",
    "mv -f /host/opt/cni/bin/.enim.tmp /host/opt/cni/bin/enim\n",
  ].join("");
  return docs.map((d) => {
    if (d.kind !== "DaemonSet" || d.name !== "enim-agent") return d;
    const obj = DaemonSetDocSchema.parse(JSON.parse(d.text));
    const init = obj.spec.template.spec.initContainers?.find((c) => c.name === "install-cni");
    const cmd = z.array(z.string()).parse(init?.command);
    const script = cmd[cmd.length - 1];
    if (!init || !script.includes(copy)) {
      throw new Error(`the init container's script does not copy the binary as 0.1.0's did`);
    }
    init.command = [
      ...cmd.slice(0, -1),
      script.replace(copy, "/usr/local/lib/enim/install-cni /host/opt/cni/bin /opt/cni/bin\n"),
    ];
    return { ...d, text: JSON.stringify(obj) };
  });
}

/**
 * Polls `f` every 500 ms until it gives a value; fails after `timeoutMs` with the node's
 * logs (or what `diag` gives).
 */
export async function waitFor<T>(
  what: string,
  f: () => Promise<T | null>,
  node: RealNode | null | (() => Promise<string>),
  timeoutMs = 180_000,
): Promise<T> {
  const t0 = performance.now();
  for (;;) {
    const v = await f();
    if (v !== null) return v;
    if (performance.now() - t0 > timeoutMs) {
      const diag = typeof node === "function" ? await node() : (await node?.logs(6000)) ?? "";
      throw new Error(`${what}: not within ${timeoutMs / 1000} s\n${diag}`);
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** Options of {@linkcode workloadPod}. */
export interface WorkloadOptions {
  /** `enim.dev/eni` asked (default 1; 0: no request, the pod placed whatever the device plugin says). */
  enis?: number;
  /** `restartPolicy: Never` (default Always). */
  never?: boolean;
  labels?: Record<string, string>;
  /** More fields of the pod's spec. */
  spec?: Record<string, unknown>;
  /** More fields of its container. */
  container?: Record<string, unknown>;
}

/** A pod of the busybox image running `sh -c command`, asking for ENIs. */
export function workloadPod(name: string, command: string, o: WorkloadOptions = {}) {
  const enis = String(o.enis ?? 1);
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, labels: { app: name, ...o.labels } },
    spec: {
      terminationGracePeriodSeconds: 1,
      restartPolicy: o.never ? "Never" : "Always",
      containers: [{
        name: "main",
        image: BUSYBOX_IMAGE,
        imagePullPolicy: "Never",
        command: ["/bin/sh", "-c", command],
        ...(enis === "0" ? {} : {
          resources: { limits: { "enim.dev/eni": enis }, requests: { "enim.dev/eni": enis } },
        }),
        ...o.container,
      }],
      ...o.spec,
    },
  };
}

/** What {@linkcode installEnim} leaves running. */
export interface EnimInstall {
  image: BuiltImage;
  /** The DaemonSet's pod, Ready. */
  agentPod: ListedPod;
  /** The Node's allocatable `enim.dev/eni` once the device plugin registered. */
  allocatableEnis: string;
}

/** A pod of a list (no apiVersion and kind). */
export type ListedPod = z.infer<typeof PodListSchema>["items"][number];

/** The DaemonSet's agent pods (during a rollout, the old one's and the new one's). */
export async function agentPods(rest: KubeRest): Promise<ListedPod[]> {
  const list = await rest.get("/api/v1/namespaces/kube-system/pods", PodListSchema, {
    labelSelector: AGENT_SELECTOR,
  });
  return list.items;
}

/** The DaemonSet's pod (null before the controller made it). */
export async function agentPodOf(cluster: KubeCluster): Promise<ListedPod | null> {
  return (await agentPods(cluster.admin))[0] ?? null;
}

/** Whether `p`'s Ready condition is True. */
export function isReady(p: Pick<RealPod, "status"> | null): boolean {
  return p?.status?.conditions?.find((c) => c.type === "Ready")?.status === "True";
}

/**
 * Installs enim on `node` as an operator does (see the module doc): builds (or finds) the
 * image and imports it, applies {@linkcode simulatedManifests}, waits until the DaemonSet's
 * pod and the Node are Ready and the device plugin advertises `enim.dev/eni`.
 */
export async function installEnim(
  cluster: KubeCluster,
  node: RealNode,
  vpc: SimulatedVpc,
  o: SimulatedInstallOptions & { progress?: (line: string) => void },
): Promise<EnimInstall> {
  const say = o.progress ?? (() => {});
  const image = await buildImage({ outDir: `${node.base}/images/enim`, ref: SHIPPED_IMAGE });
  await node.importImage(image.archive, SHIPPED_IMAGE);
  say(`enim's image imported (${image.digest}, ${image.size} bytes)`);
  await applyManifests(cluster.admin, await simulatedManifests(cluster.bins.version, vpc, o));
  // The DaemonSet controller's pod, started by kubelet: init container, then the agent.
  const agentPod = await waitFor("the agent's pod Ready", async () => {
    const p = await agentPodOf(cluster);
    return isReady(p) ? p : null;
  }, node);
  say(`the agent's pod ${agentPod.metadata.name} Ready`);
  // containerd loaded the conflist (CNI STATUS): the Node is Ready; the device plugin
  // registered with kubelet.
  await node.waitReady(180_000);
  const allocatableEnis = await waitFor("enim.dev/eni in the Node's allocatable", async () => {
    const n = await cluster.admin.get(`/api/v1/nodes/${node.name}`, NodeSchema);
    return n.status?.allocatable?.["enim.dev/eni"] ?? null;
  }, node);
  say(`Node ${node.name} Ready, enim.dev/eni ${allocatableEnis}`);
  return { image, agentPod, allocatableEnis };
}

/** Options of {@linkcode EnimNode.start}. */
export interface EnimNodeOptions extends SimulatedInstallOptions {
  /** The Node's name. */
  name: string;
  progress?: (line: string) => void;
}

/** A control plane, a simulated VPC and one real node with enim installed. */
export class EnimNode implements AsyncDisposable {
  readonly cluster: KubeCluster;
  readonly vpc: SimulatedVpc;
  readonly node: RealNode;
  readonly install: EnimInstall;

  private constructor(cluster: KubeCluster, vpc: SimulatedVpc, node: RealNode, i: EnimInstall) {
    this.cluster = cluster;
    this.vpc = vpc;
    this.node = node;
    this.install = i;
  }

  /** Starts everything; on a failure tears down what it had started. */
  static async start(o: EnimNodeOptions): Promise<EnimNode> {
    const cluster = await KubeCluster.start({
      controllers: NODE_CONTROLLERS,
      progress: o.progress,
    });
    let vpc: SimulatedVpc | null = null;
    let node: RealNode | null = null;
    try {
      vpc = await SimulatedVpc.create({ subnets: { ipv4: VPC_SUBNET.cidr } });
      const nic = await vpc.nodeNic();
      node = await RealNode.start(cluster, {
        name: o.name,
        netns: vpc.node.name,
        shareNetns: [vpc.vpc.name],
        nodeIp: nic.ipv4!,
        // A node as an operator has it: the reference plugins (containerd runs `loopback`
        // itself for every sandbox, whatever the conflist says).
        cniPlugins: ["/usr/lib/cni/loopback", "/usr/lib/cni/host-local"],
        progress: o.progress,
      });
      const install = await installEnim(cluster, node, vpc, o);
      return new EnimNode(cluster, vpc, node, install);
    } catch (err) {
      await node?.close().catch(() => {});
      await vpc?.close().catch(() => {});
      await cluster.stop().catch(() => {});
      throw err;
    }
  }

  /** The node, the VPC, the control plane. */
  async close(): Promise<void> {
    const errors: unknown[] = [];
    for (const f of [() => this.node.close(), () => this.vpc.close(), () => this.cluster.stop()]) {
      await f().catch((e) => errors.push(e));
    }
    if (errors.length) throw new AggregateError(errors, "Cannot tear the enim node down");
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** The agent's API on its socket in the node (`/run/enim/enim.sock`, as the plugin reaches it). */
export function agentClient(node: RealNode): SocketAgentClient {
  return new SocketAgentClient(node.host("/run/enim/enim.sock"), 10_000);
}

/** One line of the plugin's log (`logFile` of the shipped conflist): a call the runtime made. */
export const CniInvocationSchema = z.looseObject({
  msg: z.literal("cni invocation"),
  verb: z.nullable(z.string()),
  code: z.number(),
  containerId: z.optional(z.string()),
  netns: z.optional(z.string()),
});
/** A CNI call the runtime made. */
export type CniInvocation = z.infer<typeof CniInvocationSchema>;

/**
 * Every CNI call the runtime made on `node` so far, oldest first, as the installed plugin
 * logged it (`/var/log/enim/cni.log` of the node, and its rotated `.1`).
 */
export async function cniInvocations(node: RealNode): Promise<CniInvocation[]> {
  const path = node.host("/var/log/enim/cni.log");
  let text = "";
  for (const p of [`${path}.1`, path]) text += await Deno.readTextFile(p).catch(() => "");
  const out: CniInvocation[] = [];
  for (const line of text.split("\n").filter((l) => l.trim() !== "")) {
    const parsed = CniInvocationSchema.safeParse(JSON.parse(line));
    if (parsed.success) out.push(parsed.data);
  }
  return out;
}

/** The container ID of a CRI container or sandbox ID as kubelet reports it (`containerd://…`). */
export function runtimeId(id: string | undefined): string | null {
  const m = id ? /^[a-z]+:\/\/([0-9a-f]{64})$/.exec(id) : null;
  return m ? m[1] : null;
}
