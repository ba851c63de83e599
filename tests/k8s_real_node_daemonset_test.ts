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
 * (the cloud is simulated: docs/testing.md); the install is tests/support/k8s/enim_node.ts,
 * shared with tests/k8s_real_node_lifecycle_test.ts and `deno task node`.
 *
 * Skips, saying why, without Go, gcc, or root.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { nodeBuildMissing } from "./support/k8s/build.ts";
import { NODE_DNS } from "./support/k8s/real_node.ts";
import { PodSchema } from "./support/k8s/kubelet.ts";
import {
  agentClient,
  EnimNode,
  waitFor as until,
  workloadPod as workload,
} from "./support/k8s/enim_node.ts";
import { ensureBuiltSync } from "../scripts/build.ts";

const ROOT = Deno.uid() === 0;
const MISSING = nodeBuildMissing() ?? (ROOT ? null : "needs root (namespaces, mounts, cgroups)");

const NODE = "real-node-ds";
const ENIS = 3;

Deno.test({
  name:
    "the shipped DaemonSet runs on a real kubelet and containerd 2.x, and its plugin gives pods ENIs",
  ignore: MISSING !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    ensureBuiltSync();
    const say = (l: string) => console.error(l);
    // The control plane, the simulated VPC, the real node, enim's image imported and the
    // shipped manifests applied; the DaemonSet's pod and the Node Ready.
    await using env = await EnimNode.start({ name: NODE, enis: ENIS, progress: say });
    const { cluster, node, install: { agentPod, allocatableEnis } } = env;
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
    assertEquals(allocatableEnis, String(ENIS));

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
      workload("client", `ping -c 2 -W 5 ${webIp}`, { never: true }),
      PodSchema,
    );
    const client = await until("client Succeeded or Failed", async () => {
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

    // Deleting web DELs it; client, finished, had its sandbox stopped by kubelet: no
    // attachment is left and every ENI is free again (the agent's API on its socket).
    await cluster.admin.delete("/api/v1/namespaces/default/pods/web", { gracePeriodSeconds: 1 });
    await until("web gone", async () => {
      const p = await cluster.admin.find("/api/v1/namespaces/default/pods/web", PodSchema);
      return p === null ? true : null;
    }, node);
    const api = agentClient(node);
    const pool = await until(
      "every ENI free again",
      async () => {
        const s = await api.status();
        const a = await api.attachments();
        return a.length === 0 && s.pool.recycling === 0 ? s.pool : null;
      },
      node,
      60_000,
    );
    assertEquals(pool.free + pool.attachable, ENIS, JSON.stringify(pool));
  },
});
