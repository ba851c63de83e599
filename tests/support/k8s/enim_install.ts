/**
 * enim's shipped manifests as the real-node tests install them (the DaemonSet test, the
 * rollout test): the agent's ConfigMap for the simulated VPC (the one change from what
 * ships: the mock provider's subnet is the VPC's and its device simulator plugs the ENIs),
 * the DaemonSet's image set to a tag, a release's manifests read from history, and waiting
 * on the DaemonSet's pods.
 *
 * @module
 */
import { z } from "zod";
import { join } from "node:path";
import type { SimulatedVpc } from "../vpc.ts";
import type { RealNode } from "./real_node.ts";
import type { KubeRest } from "./rest.ts";
import { StoredListSchema } from "./rest.ts";
import { PodSchema } from "./kubelet.ts";
import { forRelease, type ManifestDoc, readManifests } from "./manifests.ts";
import { releaseSource } from "../releases.ts";

/** The image deploy/kubernetes/daemonset.yaml names (imported, never pulled). */
export const SHIPPED_IMAGE = "ghcr.io/example/enim:0.1.0";

/** The agent pods' label selector (not the uninstall Job's). */
export const AGENT_SELECTOR = "app.kubernetes.io/name=enim,app.kubernetes.io/component=agent";

/** What {@linkcode simulatedAgentConfig} writes. */
export interface SimulatedAgentOptions {
  /** The mock provider's ENIs on the node. */
  enis: number;
  /** The VPC's IPv4 subnet (default 10.200.0.0/24, gateway .1). */
  subnet?: { cidr: string; gateway: string };
  /**
   * The release the configuration is for (default: this tree's). 0.1.0's schema is strict
   * and has no `metrics` or `cniConfig` (its init container installs the conflist), so its
   * configuration leaves them out.
   */
  release?: string;
}

/** The agent's configuration for the simulated cloud (the rest as the shipped ConfigMap). */
export function simulatedAgentConfig(vpc: SimulatedVpc, o: SimulatedAgentOptions): string {
  const subnet = o.subnet ?? { cidr: "10.200.0.0/24", gateway: "10.200.0.1" };
  const old = o.release === "0.1.0";
  return JSON.stringify(
    {
      socket: "/run/enim/enim.sock",
      statePath: "/var/lib/enim/enim.db",
      provider: { name: "mock", mock: { enis: o.enis, subnets: { ipv4: subnet } } },
      devices: "ip",
      deviceSimulator: { vpcNetns: vpc.vpc.name, bridge: vpc.bridge },
      gc: { intervalSeconds: 30, graceSeconds: 30 },
      log: { level: "info", format: "json" },
      devicePlugin: { enabled: true },
      networkPolicy: { enabled: false },
      // As the shipped ConfigMap: the conflist written once the agent answers, and the
      // metrics port the DaemonSet's startup and liveness probes ask.
      ...(old ? {} : {
        cniConfig: { source: "/etc/enim/10-enim.conflist" },
        metrics: { enabled: true, address: "0.0.0.0", port: 9798 },
      }),
    },
    null,
    2,
  );
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

/** A list's items carry no apiVersion and kind. */
export const PodListSchema = StoredListSchema.extend({
  items: z.array(
    PodSchema.extend({ apiVersion: z.optional(z.string()), kind: z.optional(z.string()) }),
  ),
});
export type ListedPod = z.infer<typeof PodListSchema>["items"][number];

/** The DaemonSet's agent pods. */
export async function agentPods(rest: KubeRest): Promise<ListedPod[]> {
  const list = await rest.get("/api/v1/namespaces/kube-system/pods", PodListSchema, {
    labelSelector: AGENT_SELECTOR,
  });
  return list.items;
}

/** Polls `f` every 500 ms until it gives a value; throws with the node's logs after `timeoutMs`. */
export async function until<T>(
  what: string,
  f: () => Promise<T | null>,
  node: RealNode | null,
  timeoutMs = 180_000,
): Promise<T> {
  const t0 = performance.now();
  for (;;) {
    const v = await f();
    if (v !== null) return v;
    if (performance.now() - t0 > timeoutMs) {
      throw new Error(`${what}: not within ${timeoutMs} ms\n${await node?.logs(6000) ?? ""}`);
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}
