/**
 * `deno task node`: enim installed as an operator installs it (docs/install.md), on one real
 * node of this machine. Builds or finds everything (the control plane's and the node's
 * components: tests/support/k8s/build.ts; the bundle; the image of `deno task image`),
 * starts the real control plane and one real node (kubelet, containerd 2.x, runc in network
 * and mount namespaces of their own: tests/support/k8s/real_node.ts) on a simulated VPC,
 * imports the image into the node's containerd under the name the manifests give, applies
 * deploy/kubernetes/ (rbac.yaml, configmap.yaml, daemonset.yaml and the two admission
 * policies; not podmonitor.yaml, which needs Prometheus Operator's CRDs, nor the Kyverno
 * variant or the uninstall Job), waits until the DaemonSet's pod and the Node are Ready and
 * `enim.dev/eni` is in the Node's allocatable, then runs three pods with ENIs: two web
 * servers behind a ClusterIP Service and a client that pings and fetches from both by their
 * pod IPs and from the Service's ClusterIP (through the real kube-proxy on the node and
 * enim's host link). Prints each step with its time, tears everything down (also on Ctrl-C
 * and SIGTERM) and exits 0 only when every step worked (1 when one failed, 2 when it cannot
 * run here: it needs root, Go and gcc).
 *
 * The one change from the shipped manifests is the agent's ConfigMap: the mock provider's
 * subnet is the simulated VPC's and its device simulator plugs the ENIs (the cloud is
 * simulated here: docs/testing.md). Operator tooling importing the test support, as
 * scripts/cluster.ts does.
 *
 * @module
 */
import { z } from "zod";
import { isRoot } from "./_deps.ts";
import { ensureBuiltSync } from "./build.ts";
import { buildImage } from "./image.ts";
import {
  ensureK8sBinaries,
  ensureNodeBinaries,
  nodeBuildMissing,
} from "../tests/support/k8s/build.ts";
import { KubeCluster, NODE_CONTROLLERS } from "../tests/support/k8s/cluster.ts";
import { BUSYBOX_IMAGE, RealNode } from "../tests/support/k8s/real_node.ts";
import { NodeSchema, PodSchema } from "../tests/support/k8s/kubelet.ts";
import { applyManifests } from "../tests/support/k8s/manifests.ts";
import { SHIPPED_IMAGE, simulatedManifests, VPC_SUBNET } from "../tests/support/k8s/enim_node.ts";
import { StoredListSchema, StoredSchema } from "../tests/support/k8s/rest.ts";
import { SimulatedVpc } from "../tests/support/vpc.ts";

/** The manifests, in the order docs/install.md applies them. */
const MANIFESTS = [
  "rbac.yaml",
  "configmap.yaml",
  "daemonset.yaml",
  "eni-request-policy.yaml",
  "raw-capabilities-policy.yaml",
];
const NODE = `enim-node-${crypto.randomUUID().slice(0, 4)}`;
const ENIS = 3;
const SERVICE_IP = "10.96.0.80";
const WAIT_MS = 180_000;

const PodListSchema = StoredListSchema.extend({
  items: z.array(
    PodSchema.extend({ apiVersion: z.optional(z.string()), kind: z.optional(z.string()) }),
  ),
});
type Pod = z.infer<typeof PodSchema>;

const t0 = performance.now();
const since = () => `${((performance.now() - t0) / 1000).toFixed(1).padStart(6)} s`;
const out = (s = "") => console.log(s);
let failures = 0;
const step = (pass: boolean, text: string) => {
  if (!pass) failures++;
  out(`[${since()}] ${pass ? "ok  " : "FAIL"} ${text}`);
};
const progress = (l: string) => console.error(`           ${l}`);

if (!isRoot()) {
  console.error(
    "deno task node runs kubelet and containerd in namespaces of their own: run it as root.",
  );
  Deno.exit(2);
}
const missing = nodeBuildMissing();
if (missing) {
  console.error(`deno task node builds kubelet, containerd and runc: ${missing}.`);
  Deno.exit(2);
}

function pod(name: string, labels: Record<string, string>, command: string, never = false) {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, labels },
    spec: {
      terminationGracePeriodSeconds: 1,
      restartPolicy: never ? "Never" : "Always",
      containers: [{
        name: "main",
        image: BUSYBOX_IMAGE,
        imagePullPolicy: "Never",
        command: ["/bin/sh", "-c", command],
        ports: [{ name: "http", containerPort: 8080 }],
        resources: { limits: { "enim.dev/eni": "1" }, requests: { "enim.dev/eni": "1" } },
      }],
    },
  };
}

// Teardown, once: from the finally below, or from Ctrl-C / SIGTERM mid-run.
let cluster: KubeCluster | null = null;
let vpc: SimulatedVpc | null = null;
let node: RealNode | null = null;
let torn: Promise<void> | null = null;
let interrupted: number | null = null;
function teardown(): Promise<void> {
  torn ??= (async () => {
    out(`[${since()}] tearing down: the node, the simulated VPC, the control plane`);
    await node?.close().catch((e) => console.error(`the node: ${e}`));
    await vpc?.close().catch((e) => console.error(`the VPC: ${e}`));
    await cluster?.stop().catch((e) => console.error(`the control plane: ${e}`));
  })();
  return torn;
}
for (const [sig, code] of [["SIGINT", 130], ["SIGTERM", 143]] as const) {
  Deno.addSignalListener(sig, () => {
    console.error(`\n${sig}: stopping`);
    interrupted ??= code;
    teardown().finally(() => {
      out(`[${since()}] interrupted (${sig}): everything stopped`);
      Deno.exit(code);
    });
  });
}

async function until<T>(what: string, f: () => Promise<T | null>, ms = WAIT_MS): Promise<T> {
  const start = performance.now();
  for (;;) {
    const v = await f();
    if (v !== null) return v;
    if (performance.now() - start > ms) {
      throw new Error(`${what}: not within ${ms / 1000} s\n${await node?.logs(6000) ?? ""}`);
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}

async function getPod(name: string): Promise<Pod> {
  return await cluster!.admin.get(`/api/v1/namespaces/default/pods/${name}`, PodSchema);
}

/** A container's log, read from the node's /var/log/pods (kubelet writes it there). */
function containerLog(p: Pod): string {
  const dir = node!.host(
    `/var/log/pods/default_${p.metadata.name}_${p.metadata.uid}/main`,
  );
  return [...Deno.readDirSync(dir)].map((e) => Deno.readTextFileSync(`${dir}/${e.name}`))
    .join("");
}

try {
  out("deno task node: enim's shipped DaemonSet on a real kubelet and containerd 2.x\n");
  const k8s = await ensureK8sBinaries({ progress });
  step(
    true,
    `control plane components: Kubernetes v${k8s.version} (${
      k8s.built ? `built in ${k8s.buildSeconds} s` : "cached"
    })`,
  );
  const nodeBins = await ensureNodeBinaries({ progress });
  step(
    true,
    `node components: kubelet v${nodeBins.version}, containerd v${nodeBins.containerdVersion}, ` +
      `runc v${nodeBins.runcVersion} (${
        nodeBins.built ? `built in ${nodeBins.buildSeconds} s` : "cached"
      })`,
  );
  const bundle = ensureBuiltSync();
  step(true, `the bundle: ${bundle}`);
  const image = await buildImage({ ref: SHIPPED_IMAGE });
  step(
    true,
    `the image ${SHIPPED_IMAGE}: ${image.archive}, ${image.digest}, ${image.size} bytes ` +
      `(Debian layer ${image.rootfsCached ? "cached" : "built"})`,
  );

  cluster = await KubeCluster.start({ binaries: k8s, controllers: NODE_CONTROLLERS, progress });
  step(true, `control plane up: etcd, kube-apiserver, kube-controller-manager, kube-scheduler`);
  vpc = await SimulatedVpc.create({ subnets: { ipv4: VPC_SUBNET.cidr } });
  const nic = await vpc.nodeNic();
  step(
    true,
    `simulated VPC ${VPC_SUBNET.cidr} (namespaces ${vpc.vpc.name}, ${vpc.node.name}); ` +
      `the node's NIC ${nic.ipv4}`,
  );
  node = await RealNode.start(cluster, {
    name: NODE,
    netns: vpc.node.name,
    shareNetns: [vpc.vpc.name],
    nodeIp: nic.ipv4!,
    binaries: nodeBins,
    // A node as an operator has it: the reference plugins only.
    cniPlugins: ["/usr/lib/cni/loopback", "/usr/lib/cni/host-local"],
    progress,
  });
  step(
    true,
    `node ${NODE}: containerd and kubelet started, the Node registered (NotReady: no CNI yet)`,
  );

  await node.importImage(image.archive, SHIPPED_IMAGE);
  step(true, `ctr -n k8s.io images import: ${SHIPPED_IMAGE} in the node's containerd`);

  const docs = (await simulatedManifests(cluster.bins.version, vpc, { enis: ENIS }))
    .filter((d) => MANIFESTS.includes(d.file))
    .sort((a, b) => MANIFESTS.indexOf(a.file) - MANIFESTS.indexOf(b.file));
  for (const r of await applyManifests(cluster.admin, docs)) {
    const what = `${r.doc.file}: ${r.doc.kind} ${
      r.doc.namespace ? `${r.doc.namespace}/` : ""
    }${r.doc.name}`;
    step("applied" in r, "applied" in r ? `applied ${what}` : `${what}: ${r.notServed}`);
  }

  const agent = await until("the DaemonSet's pod Ready", async () => {
    const list = await cluster!.admin.get("/api/v1/namespaces/kube-system/pods", PodListSchema, {
      labelSelector: "app.kubernetes.io/name=enim,app.kubernetes.io/component!=uninstall",
    });
    const p = list.items[0];
    return p?.status?.conditions?.find((c) => c.type === "Ready")?.status === "True" ? p : null;
  });
  step(
    agent.spec.nodeName === NODE,
    `the DaemonSet's pod kube-system/${agent.metadata.name} Ready on ${agent.spec.nodeName} ` +
      `(init container installed /opt/cni/bin/enim; the agent wrote the conflist)`,
  );
  await node.waitReady(WAIT_MS);
  step(true, `Node ${NODE} Ready (containerd loaded enim's conflist: CNI STATUS)`);
  const eni = await until("enim.dev/eni in the Node's allocatable", async () => {
    const n = await cluster!.admin.get(`/api/v1/nodes/${NODE}`, NodeSchema);
    return n.status?.allocatable?.["enim.dev/eni"] ?? null;
  });
  step(eni === String(ENIS), `allocatable enim.dev/eni: ${eni} (the agent's device plugin)`);

  await node.serveKubernetesService();
  step(true, "kube-proxy (iptables mode) running in the node's network namespace");
  await cluster.admin.create("/api/v1/namespaces/default/services", {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name: "web" },
    spec: {
      clusterIP: SERVICE_IP,
      selector: { app: "web" },
      ports: [{ name: "http", port: 80, targetPort: 8080, protocol: "TCP" }],
    },
  }, StoredSchema);
  step(true, `Service default/web: ClusterIP ${SERVICE_IP}:80 → the web pods' port 8080`);

  const webIps: string[] = [];
  for (const name of ["web-1", "web-2"]) {
    await cluster.admin.create(
      "/api/v1/namespaces/default/pods",
      pod(
        name,
        { app: "web" },
        `mkdir -p /www && echo ${name} > /www/index.html && exec httpd -f -p 8080 -h /www`,
      ),
      PodSchema,
    );
    const p = await until(`${name} Running`, async () => {
      const p = await getPod(name);
      return p.status?.phase === "Running" && p.status.podIP ? p : null;
    });
    const ip = p.status!.podIP!;
    webIps.push(ip);
    step(ip.startsWith("10.200.0."), `pod ${name} Running with its ENI's address ${ip}`);
  }

  // busybox's wget looks up the "http" service through glibc's NSS, which the static
  // busybox cannot load in a bare image (it segfaults): HTTP by nc, port given by number.
  const script = [
    "set -e",
    `get() { r=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 "$1" "$2" | tail -n 1); ` +
    `test -n "$r" && echo "$r"; }`,
    ...webIps.flatMap((ip) => [
      `ping -c 2 -W 5 ${ip}`,
      `r=$(get ${ip} 8080); echo "by pod IP ${ip}: $r"`,
    ]),
    // kube-proxy programs the Service a moment after its endpoints are ready.
    `for i in $(seq 1 30); do if r=$(get ${SERVICE_IP} 80); then ` +
    `echo "by ClusterIP ${SERVICE_IP}: $r"; exit 0; fi; sleep 1; done; ` +
    `echo "ClusterIP ${SERVICE_IP}: no answer"; exit 1`,
  ].join("\n");
  await cluster.admin.create(
    "/api/v1/namespaces/default/pods",
    pod("client", { app: "client" }, script, true),
    PodSchema,
  );
  const client = await until("client finished", async () => {
    const p = await getPod("client");
    return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : null;
  });
  const log = containerLog(client);
  step(
    client.status?.podIP?.startsWith("10.200.0.") ?? false,
    `pod client ran with its ENI's address ${client.status?.podIP}`,
  );
  for (const ip of webIps) {
    step(
      log.includes(`${ip}: web-`),
      `client → ${ip}:8080 (ping and HTTP): ${
        log.split("\n").find((l) => l.includes(`by pod IP ${ip}`))?.replace(/^\S+ \S+ \S+ /, "") ??
          "no answer"
      }`,
    );
  }
  const svc = log.split("\n").find((l) => l.includes(`ClusterIP ${SERVICE_IP}`));
  step(
    client.status?.phase === "Succeeded" && (svc?.includes(": web-") ?? false),
    `client → Service web at ${SERVICE_IP}:80 (the real kube-proxy): ${
      svc?.replace(/^\S+ \S+ \S+ /, "") ?? "no answer"
    }`,
  );
  if (client.status?.phase !== "Succeeded") out(log);
} catch (err) {
  failures++;
  // A signal's teardown pulls the cluster from under the step that was running.
  if (interrupted === null) {
    out(`[${since()}] FAIL ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
  }
} finally {
  await teardown();
}
out(
  `\n[${since()}] ${
    failures === 0 ? "ok: every step worked" : `${failures} step(s) failed`
  }; everything stopped`,
);
Deno.exit(interrupted ?? (failures === 0 ? 0 : 1));
