/**
 * The real node (issue 50, point 1): kubelet at the pinned release, containerd 2.x and
 * runc, built from their Go modules (tests/support/k8s/build.ts `ensureNodeBinaries`),
 * run in a simulated node's network namespace and a private mount namespace
 * (tests/support/k8s/real_node.ts), registered with the real control plane. A pod created
 * through the API runs a real container from the busybox image built here, with a network
 * from the reference plugins (the node's own /opt/cni/bin and /etc/cni/net.d, folders of
 * the test); the machine's kernel tunables, /run/netns, cgroups and folders are as they
 * were after the run.
 *
 * Skips, saying why, without Go at /usr/local/go/bin/go, gcc, or root.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import type { z } from "zod";
import { existsSync } from "../lib/fs.ts";
import { nodeBuildMissing } from "./support/k8s/build.ts";
import { KubeCluster, NODE_CONTROLLERS } from "./support/k8s/cluster.ts";
import { BUSYBOX_IMAGE, KUBELET_SYSCTLS, RealNode } from "./support/k8s/real_node.ts";
import { PodSchema } from "./support/k8s/kubelet.ts";
import { SimulatedVpc } from "./support/vpc.ts";

const ROOT = Deno.uid() === 0;
const MISSING = nodeBuildMissing() ?? (ROOT ? null : "needs root (namespaces, mounts, cgroups)");

/** The machine's values of kubelet's kernel tunables, read only. */
async function machineSysctls(): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const k of KUBELET_SYSCTLS) out[k] = (await Deno.readTextFile(`/proc/sys/${k}`)).trim();
  return out;
}

/** What kubelet writes (pkg/kubelet/cm setupKernelTunables: its desired values). */
const KUBELET_WANTS: Record<(typeof KUBELET_SYSCTLS)[number], string> = {
  "vm/overcommit_memory": "1",
  "vm/panic_on_oom": "0",
  "kernel/panic": "10",
  "kernel/panic_on_oops": "1",
  "kernel/keys/root_maxkeys": "1000000",
  "kernel/keys/root_maxbytes": "25000000",
};

/** The reference plugins' bridge network for the node's pods. */
const BRIDGE_CONFLIST = JSON.stringify({
  cniVersion: "1.0.0",
  name: "test-bridge",
  plugins: [{
    type: "bridge",
    bridge: "cni0",
    isGateway: true,
    ipMasq: false,
    ipam: { type: "host-local", ranges: [[{ subnet: "10.244.7.0/24" }]] },
  }],
});

async function waitPod(
  cluster: KubeCluster,
  ns: string,
  name: string,
  ok: (p: z.infer<typeof PodSchema>) => boolean,
  node: RealNode,
  timeoutMs = 120_000,
): Promise<z.infer<typeof PodSchema>> {
  const t0 = performance.now();
  let last: unknown = null;
  for (;;) {
    const p = await cluster.admin.find(`/api/v1/namespaces/${ns}/pods/${name}`, PodSchema);
    if (p && ok(p)) return p;
    last = p?.status;
    if (performance.now() - t0 > timeoutMs) {
      throw new Error(
        `Pod ${ns}/${name} not as expected in ${timeoutMs} ms: ${JSON.stringify(last)}\n${await node
          .logs(4000)}`,
      );
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}

Deno.test({
  name:
    "a real kubelet on containerd 2.x runs a pod of the real API server, and nothing of the machine changes",
  ignore: MISSING !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const before = await machineSysctls();
    await using cluster = await KubeCluster.start({ controllers: NODE_CONTROLLERS });
    const vpc = await SimulatedVpc.create({ subnets: { ipv4: "10.98.0.0/24" } });
    let node: RealNode | null = null;
    try {
      const nic = await vpc.nodeNic();
      node = await RealNode.start(cluster, {
        name: "real-node-1",
        netns: vpc.node.name,
        nodeIp: nic.ipv4!,
        cniPlugins: ["/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"],
        cniConfigs: { "10-bridge.conflist": BRIDGE_CONFLIST },
        ...(Deno.env.get("ENIM_NODE_RUNC") ? { runc: Deno.env.get("ENIM_NODE_RUNC") } : {}),
        progress: (l) => console.error(l),
      });
      const ready = await node.waitReady();
      assertEquals(
        ready.status?.addresses?.find((a) => a.type === "InternalIP")?.address,
        nic.ipv4,
      );

      await cluster.admin.create("/api/v1/namespaces/default/pods", {
        apiVersion: "v1",
        kind: "Pod",
        metadata: { name: "sleeper" },
        spec: {
          nodeName: "real-node-1",
          terminationGracePeriodSeconds: 1,
          containers: [{
            name: "main",
            image: BUSYBOX_IMAGE,
            imagePullPolicy: "Never",
            command: ["/bin/sh", "-c", "echo hello from a real container; exec sleep 3600"],
          }],
        },
      }, PodSchema);
      const pod = await waitPod(
        cluster,
        "default",
        "sleeper",
        (p) => p.status?.phase === "Running" && !!p.status.podIP,
        node,
      );
      assert(pod.status?.podIP?.startsWith("10.244.7."), `pod IP ${pod.status?.podIP}`);
      const logs = await Deno.readTextFile(
        [...Deno.readDirSync(node.host("/var/log/pods"))].map((e) =>
          `${node!.host("/var/log/pods")}/${e.name}/main/0.log`
        )[0],
      );
      assert(logs.includes("hello from a real container"), logs);

      // kubelet wrote its tunables into the stand-ins, not into the machine's /proc/sys.
      for (const k of KUBELET_SYSCTLS) {
        assertEquals((await Deno.readTextFile(node.sysctlStandIn(k))).trim(), KUBELET_WANTS[k], k);
      }
      assertEquals(await machineSysctls(), before);
      // The pod's network namespace is pinned in the node's own /run/netns only.
      const podNetns = [...Deno.readDirSync(node.host("/run/netns"))].map((e) => e.name)
        .filter((n) => n.startsWith("cni-"));
      assertEquals(podNetns.length, 1, `the node's /run/netns: ${podNetns}`);
      assert(!podNetns.some((n) => existsSync(`/run/netns/${n}`)), "in the machine's /run/netns");

      await cluster.admin.delete("/api/v1/namespaces/default/pods/sleeper");
      await waitPod(cluster, "default", "sleeper", () => false, node, 60_000).catch(() => {});
    } finally {
      const root = node?.cgroupRoot;
      await node?.close();
      await vpc.close();
      if (root) {
        for (const c of [...Deno.readDirSync("/sys/fs/cgroup")].map((e) => e.name)) {
          let there = true;
          try {
            Deno.statSync(`/sys/fs/cgroup/${c}${root}`);
          } catch {
            there = false;
          }
          assert(!there, `cgroup ${c}${root} left behind`);
        }
      }
    }
    assertEquals(await machineSysctls(), before);
  },
});
