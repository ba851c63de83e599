/**
 * enim installed as an operator installs it (issue 50, point 3), on the real node of
 * tests/support/k8s/real_node.ts: deploy/kubernetes/ applied to the real API server, enim's
 * image (`deno task image`, scripts/image.ts: what ships) imported into the node's
 * containerd 2.x, and the real DaemonSet controller, scheduler and kubelet start the init
 * container and the agent. The init container installs the plugin (deno and the bundle
 * under /opt/cni/bin/enim.d, on a node with no Deno); the agent writes the conflist once it
 * answers; containerd loads it and the Node turns Ready; the agent's device plugin registers (`enim.dev/eni` in the Node's allocatable);
 * workload pods created through the API get ENIs of the simulated VPC from the plugin
 * the init container installed, run real containers and reach each other; a pod asking
 * more ENIs than the node has stays Pending; deleting a pod gives its ENI back.
 *
 * The agent's ConfigMap is the one thing changed from the shipped manifests: the mock
 * provider's subnets are the simulated VPC's and its device simulator plugs the ENIs
 * (the cloud is simulated: docs/testing.md).
 *
 * Skips, saying why, without Go, gcc, or root.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import type { z } from "zod";
import { nodeBuildMissing } from "./support/k8s/build.ts";
import { KubeCluster, NODE_CONTROLLERS } from "./support/k8s/cluster.ts";
import { BUSYBOX_IMAGE, NODE_DNS, RealNode } from "./support/k8s/real_node.ts";
import { NodeSchema, PodSchema } from "./support/k8s/kubelet.ts";
import { applyManifests, readManifests } from "./support/k8s/manifests.ts";
import { buildImage } from "../scripts/image.ts";
import {
  PodListSchema,
  SHIPPED_IMAGE,
  simulatedAgentConfig,
  until,
  withAgentConfig,
} from "./support/k8s/enim_install.ts";
import { SimulatedVpc } from "./support/vpc.ts";
import { ensureBuiltSync } from "../scripts/build.ts";

const ROOT = Deno.uid() === 0;
const MISSING = nodeBuildMissing() ?? (ROOT ? null : "needs root (namespaces, mounts, cgroups)");

const NODE = "real-node-ds";
const ENIS = 3;

type Pod = z.infer<typeof PodSchema>;

function workload(name: string, command: string, o: { enis?: number; never?: boolean } = {}) {
  const enis = String(o.enis ?? 1);
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, labels: { app: name } },
    spec: {
      terminationGracePeriodSeconds: 1,
      restartPolicy: o.never ? "Never" : "Always",
      containers: [{
        name: "main",
        image: BUSYBOX_IMAGE,
        imagePullPolicy: "Never",
        command: ["/bin/sh", "-c", command],
        resources: { limits: { "enim.dev/eni": enis }, requests: { "enim.dev/eni": enis } },
      }],
    },
  };
}

Deno.test({
  name:
    "the shipped DaemonSet runs on a real kubelet and containerd 2.x, and its plugin gives pods ENIs",
  ignore: MISSING !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    ensureBuiltSync();
    const say = (l: string) => console.error(l);
    await using cluster = await KubeCluster.start({ controllers: NODE_CONTROLLERS, progress: say });
    const vpc = await SimulatedVpc.create({ subnets: { ipv4: "10.200.0.0/24" } });
    let node: RealNode | null = null;
    try {
      const nic = await vpc.nodeNic();
      node = await RealNode.start(cluster, {
        name: NODE,
        netns: vpc.node.name,
        shareNetns: [vpc.vpc.name],
        nodeIp: nic.ipv4!,
        // A node as an operator has it: the reference plugins (containerd runs `loopback`
        // itself for every sandbox, whatever the conflist says).
        cniPlugins: ["/usr/lib/cni/loopback", "/usr/lib/cni/host-local"],
        progress: say,
      });
      // The image that ships, under the name the manifests give (imported, never pulled).
      const image = await buildImage({ outDir: `${node.base}/images/enim`, ref: SHIPPED_IMAGE });
      await node.importImage(image.archive, SHIPPED_IMAGE);
      say(`enim's image imported (${image.digest}, ${image.size} bytes)`);

      const docs = withAgentConfig(
        await readManifests(cluster.bins.version),
        simulatedAgentConfig(vpc, { enis: ENIS }),
      );
      await applyManifests(cluster.admin, docs);

      // The DaemonSet controller's pod, started by kubelet: init container, then the agent.
      const agentPod = await until(
        "the agent's pod Ready",
        async () => {
          const list = await cluster.admin.get(
            "/api/v1/namespaces/kube-system/pods",
            PodListSchema,
            { labelSelector: "app.kubernetes.io/name=enim" },
          );
          const p = list.items[0];
          const ready = p?.status?.conditions?.find((c) => c.type === "Ready");
          return p && ready?.status === "True" ? p : null;
        },
        node!,
        100_000,
      );
      assertEquals(agentPod.spec.nodeName, NODE);
      assert(
        (await Deno.stat(node.host("/opt/cni/bin/enim"))).isFile,
        "the init container installed the plugin",
      );
      assert((await Deno.stat(node.host("/etc/cni/net.d/10-enim.conflist"))).isFile);

      // The agent resolves names with the node's resolver, never cluster DNS (whose pods
      // need ENIs from this very agent): the resolv.conf kubelet had containerd write for
      // its sandbox, the only one on the node yet.
      const sandboxes = node.host("/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes");
      const resolv = [...Deno.readDirSync(sandboxes)].map((e) =>
        Deno.readTextFileSync(`${sandboxes}/${e.name}/resolv.conf`)
      );
      assertEquals(resolv.length, 1, `sandboxes: ${resolv.length}`);
      assert(resolv[0].includes(`nameserver ${NODE_DNS}`), `the agent's resolv.conf: ${resolv[0]}`);
      assert(!resolv[0].includes("10.96.0.10"), `the agent's resolv.conf: ${resolv[0]}`);

      // containerd loaded the conflist (CNI STATUS): the Node is Ready; the device plugin
      // registered with kubelet.
      const ready = await node.waitReady(180_000);
      const eni = await until("enim.dev/eni in the Node's allocatable", async () => {
        const n = await cluster.admin.get(`/api/v1/nodes/${NODE}`, NodeSchema);
        return n.status?.allocatable?.["enim.dev/eni"] ?? null;
      }, node);
      assertEquals(eni, String(ENIS), JSON.stringify(ready.status?.allocatable));

      // Workload pods get ENIs from the installed plugin and reach each other.
      await cluster.admin.create(
        "/api/v1/namespaces/default/pods",
        workload("web", "exec httpd -f -p 8080 -h /bin"),
        PodSchema,
      );
      const web = await until("web Running with an IP", async () => {
        const p = await cluster.admin.get("/api/v1/namespaces/default/pods/web", PodSchema);
        return p.status?.phase === "Running" && p.status.podIP ? p : null;
      }, node);
      const webIp = web.status!.podIP!;
      assert(webIp.startsWith("10.200.0."), `web's IP ${webIp} is an ENI's of the VPC`);
      await cluster.admin.create(
        "/api/v1/namespaces/default/pods",
        workload(
          "client",
          `ping -c 2 -W 5 ${webIp}`,
          { never: true },
        ),
        PodSchema,
      );
      const client: Pod = await until("client Succeeded or Failed", async () => {
        const p = await cluster.admin.get("/api/v1/namespaces/default/pods/client", PodSchema);
        return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : null;
      }, node);
      if (client.status?.phase !== "Succeeded") {
        throw new Error(`client ${client.status?.phase}:\n${await node.logs(3000)}`);
      }

      // More ENIs than the node has left: the real scheduler keeps the pod Pending.
      await cluster.admin.create(
        "/api/v1/namespaces/default/pods",
        workload("greedy", "exec sleep 3600", { enis: ENIS + 1 }),
        PodSchema,
      );
      const greedy = await until("greedy judged by the scheduler", async () => {
        const p = await cluster.admin.get("/api/v1/namespaces/default/pods/greedy", PodSchema);
        const c = p.status?.conditions?.find((c) => c.type === "PodScheduled");
        return c ? p : null;
      }, node);
      assertEquals(greedy.status?.phase, "Pending");
      assertEquals(greedy.spec.nodeName, undefined);

      // Deleting web DELs it: its ENI is free again (the agent's status through the API).
      await cluster.admin.delete("/api/v1/namespaces/default/pods/web", {
        gracePeriodSeconds: 1,
      });
      await until("web gone", async () => {
        const p = await cluster.admin.find("/api/v1/namespaces/default/pods/web", PodSchema);
        return p === null ? true : null;
      }, node);
    } finally {
      await node?.close();
      await vpc.close();
    }
  },
});
