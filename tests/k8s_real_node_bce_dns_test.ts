/**
 * A brand-new cluster on Baidu Cloud (issue 50, point 4, end to end): no cluster DNS yet
 * (the kube-dns Service at 10.96.0.10 exists, as kubeadm makes it, with no endpoint: its
 * CoreDNS pods cannot start before pods get networks; a question sent there from the node
 * gets no answer) and no warm ENI, with the shipped BCE
 * overlay (deploy/kubernetes/bce, rendered as `kubectl apply -k` renders it: credentials
 * from a Secret) on the real node of tests/support/k8s/real_node.ts (real kubelet and
 * containerd 2.x, enim's shipped image).
 *
 * The agent reaches the cloud by its hostname (`bcc.bj.baidubce.com`, as on BCE), which
 * the node's resolver (a responder at {@linkcode NODE_DNS} in the node's namespace,
 * tests/support/dns_responder_main.ts) answers with the fake BCE's loopback address
 * (tests/support/bce_fake_main.ts: the API and the metadata service, in the node's
 * namespace; the agent's pod is hostNetwork). Asserted: cluster DNS does not answer; the
 * agent's pod turns Ready; the node's resolver got the agent's question for the cloud's
 * name; the first workload pod, created through the API, runs with an address of an ENI
 * the fake cloud created and attached after that pod was created (none before); every
 * request the fake cloud answered was signed with the Secret's key (it checks signatures
 * and knows no other key).
 *
 * The ConfigMap keeps the overlay's agent configuration, with what a test cloud needs:
 * the endpoint (by name, the fake's port), the metadata service's URL, the fake's security
 * group, and no warm ENI (`warmPool.minIdle` 0). Skips, saying why, without Go, gcc, or root.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { z } from "zod";
import { parse as parseJsonc, type ParseError } from "jsonc-parser";
import { nodeBuildMissing } from "./support/k8s/build.ts";
import { KubeCluster, NODE_CONTROLLERS } from "./support/k8s/cluster.ts";
import { NODE_DNS, RealNode } from "./support/k8s/real_node.ts";
import { NodeSchema, PodSchema } from "./support/k8s/kubelet.ts";
import {
  applyManifests,
  MANIFEST_DIR,
  type ManifestDoc,
  readKustomization,
} from "./support/k8s/manifests.ts";
import { StoredSchema } from "./support/k8s/rest.ts";
import { buildImage } from "../scripts/image.ts";
import { SimulatedVpc } from "./support/vpc.ts";
import { ensureBuiltSync } from "../scripts/build.ts";
import { FakeBceProcess } from "./support/bce_fake_main.ts";
import { PodListSchema, SHIPPED_IMAGE, waitFor, workloadPod } from "./support/k8s/enim_node.ts";
import { DnsResponder } from "./support/dns_responder_main.ts";
import { runFromRoot } from "./support/command.ts";

const ROOT = Deno.uid() === 0;
const MISSING = nodeBuildMissing() ?? (ROOT ? null : "needs root (namespaces, mounts, cgroups)");

const NODE = "real-node-bce";
/** The cloud's API by name, as BCE users have it (resolved by the test's resolver only). */
const CLOUD_HOST = "bcc.bj.baidubce.com";
const CLUSTER_DNS = "10.96.0.10";
const SUBNET = "10.200.0.0/24";
const INSTANCE = "i-rdnsnode01";
const SECURITY_GROUP = "g-rdns0001";
const AK = "AKIDenimRDNS0000001";
/** The Secret's key (only in the Secret and the fake's list). */
const SECRET = "SK-rdns-secret-5c0d1f9e";

/** BCE's answers to a request whose signature or key it refuses (tests/support/bce_fake.ts). */
const SIGNATURE_CODES = [
  "InvalidHTTPAuthHeader",
  "InvalidAccessKeyId",
  "AccessDenied",
  "SignatureDoesNotMatch",
  "RequestExpired",
];

const ConfigMapSchema = z.looseObject({ data: z.record(z.string(), z.string()) });
const BceSettingsSchema = z.looseObject({
  provider: z.looseObject({ name: z.literal("bce"), bce: z.looseObject({}) }),
});

/** The overlay's agent configuration (JSONC) with the test cloud's endpoint and no warm ENI. */
function testCloudConfig(jsonc: string, endpoint: string, metadataUrl: string): string {
  const errors: ParseError[] = [];
  const cfg = BceSettingsSchema.parse(parseJsonc(jsonc, errors, { allowTrailingComma: true }));
  assertEquals(errors, [], "the overlay's agent.jsonc parses");
  Object.assign(cfg.provider.bce, {
    endpoint,
    metadataUrl,
    securityGroupIds: [SECURITY_GROUP],
    warmPool: { minIdle: 0, maxIdle: 2 },
  });
  return JSON.stringify(cfg, null, 2);
}

/** The overlay's documents with the test cloud's configuration and the Secret's test key. */
function forTestCloud(docs: ManifestDoc[], endpoint: string, metadataUrl: string): ManifestDoc[] {
  return docs.map((d) => {
    const obj = JSON.parse(d.text);
    if (d.kind === "ConfigMap" && d.name === "enim-agent-config") {
      const data = ConfigMapSchema.parse(obj).data;
      obj.data = {
        ...data,
        "agent.jsonc": testCloudConfig(data["agent.jsonc"], endpoint, metadataUrl),
      };
    } else if (d.kind === "Secret" && d.name === "enim-bce-credentials") {
      obj.stringData = {
        "credentials.json": JSON.stringify({ accessKeyId: AK, secretAccessKey: SECRET }),
      };
    } else return d;
    return { ...d, text: JSON.stringify(obj) };
  });
}

Deno.test({
  name:
    "a new cluster on BCE: no cluster DNS, no warm ENI; the shipped bce overlay's agent reaches the cloud by name through the node's resolver and the first pod gets a new ENI",
  ignore: MISSING !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    ensureBuiltSync();
    const t0 = performance.now();
    const say = (l: string) => console.error(l);
    await using cluster = await KubeCluster.start({ controllers: NODE_CONTROLLERS, progress: say });
    const vpc = await SimulatedVpc.create({ subnets: { ipv4: SUBNET } });
    let node: RealNode | null = null;
    let dns: DnsResponder | null = null;
    let fake: FakeBceProcess | null = null;
    const diag = async () =>
      `${await node?.logs(6000)}\n--- fake BCE ---\n${
        fake?.output().slice(-40).join("\n")
      }\n--- DNS ---\n${JSON.stringify(dns?.queries())}`;
    try {
      // The node's resolver: NODE_DNS on the node namespace's lo (nothing routes it there
      // otherwise), answering the cloud's name with the fake's address.
      const lo = await runFromRoot([
        "/usr/sbin/ip",
        "-n",
        vpc.node.name,
        "addr",
        "add",
        `${NODE_DNS}/32`,
        "dev",
        "lo",
      ]);
      assertEquals(lo.code, 0, lo.stderr);
      dns = await DnsResponder.start(vpc.node.name, {
        address: NODE_DNS,
        table: { [CLOUD_HOST]: "127.0.0.1" },
      });
      fake = await FakeBceProcess.start({
        nodeNetns: vpc.node.name,
        vpcNetns: vpc.vpc.name,
        bridge: vpc.bridge,
        subnet: { subnetId: "sbn-rdns0001", cidr: SUBNET, zoneName: "cn-bj-a" },
        securityGroups: [SECURITY_GROUP],
        instanceId: INSTANCE,
        eniQuota: 4,
        credentials: [{ accessKeyId: AK, secretAccessKey: SECRET }],
      });
      const url = new URL(fake.url);
      assertEquals(url.hostname, "127.0.0.1");
      const endpoint = `http://${CLOUD_HOST}:${url.port}`;

      const nic = await vpc.nodeNic();
      node = await RealNode.start(cluster, {
        name: NODE,
        netns: vpc.node.name,
        shareNetns: [vpc.vpc.name],
        nodeIp: nic.ipv4!,
        cniPlugins: ["/usr/lib/cni/loopback", "/usr/lib/cni/host-local"],
        progress: say,
      });
      // The in-cluster API (the agent's NetworkPolicy is on when it has a service account:
      // the overlay's default) through the real kube-proxy; and cluster DNS's Service, as
      // kubeadm makes it, with no endpoint yet: its pods wait for networks.
      await node.serveKubernetesService();
      await cluster.admin.create("/api/v1/namespaces/kube-system/services", {
        apiVersion: "v1",
        kind: "Service",
        metadata: { name: "kube-dns", namespace: "kube-system", labels: { "k8s-app": "kube-dns" } },
        spec: {
          clusterIP: CLUSTER_DNS,
          selector: { "k8s-app": "kube-dns" },
          ports: [
            { name: "dns", port: 53, protocol: "UDP", targetPort: 53 },
            { name: "dns-tcp", port: 53, protocol: "TCP", targetPort: 53 },
          ],
        },
      }, StoredSchema);

      // Cluster DNS does not answer from the node; the node's resolver does.
      const toCluster = await dns.ask(CLUSTER_DNS, "kubernetes.default.svc.cluster.local");
      assertEquals(toCluster.answered, false, JSON.stringify(toCluster));
      say(`cluster DNS ${CLUSTER_DNS} from the node: ${toCluster.error}`);
      const control = await dns.ask(NODE_DNS, CLOUD_HOST);
      assertEquals([control.answered, control.rcode, control.addresses], [true, 0, ["127.0.0.1"]]);
      const asked = dns.queries().length;

      const image = await buildImage({ outDir: `${node.base}/images/enim`, ref: SHIPPED_IMAGE });
      await node.importImage(image.archive, SHIPPED_IMAGE);
      const docs = forTestCloud(
        await readKustomization(`${MANIFEST_DIR}/bce`, cluster.bins.version),
        endpoint,
        fake.metadataUrl,
      );
      assertEquals(
        docs.map((d) => `${d.kind}/${d.name}`).filter((k) => k.startsWith("Secret/")),
        ["Secret/enim-bce-credentials"],
      );
      await applyManifests(cluster.admin, docs);
      const tApplied = performance.now();

      const agentPod = await waitFor("the agent's pod Ready", async () => {
        const list = await cluster.admin.get(
          "/api/v1/namespaces/kube-system/pods",
          PodListSchema,
          { labelSelector: "app.kubernetes.io/name=enim" },
        );
        const p = list.items[0];
        const ready = p?.status?.conditions?.find((c) => c.type === "Ready");
        return p && ready?.status === "True" ? p : null;
      }, diag);
      assertEquals(agentPod.spec.nodeName, NODE);
      const tReady = performance.now();

      // The agent asked the node's resolver for the cloud's name.
      const agentAsks = dns.queries().slice(asked).filter((q) => q.name === CLOUD_HOST);
      if (!agentAsks.some((q) => q.qtype === 1)) {
        throw new Error(`The node's resolver got no question for ${CLOUD_HOST}\n${await diag()}`);
      }

      await node.waitReady(180_000);
      await waitFor("enim.dev/eni in the Node's allocatable", async () => {
        const n = await cluster.admin.get(`/api/v1/nodes/${NODE}`, NodeSchema);
        const eni = Number(n.status?.allocatable?.["enim.dev/eni"] ?? "0");
        return eni > 0 ? eni : null;
      }, diag);

      // No warm ENI: the cloud has none before the first pod.
      const before = await fake.state();
      assertEquals(before.enis, [], "no ENI before the first pod");
      const nBefore = before.requests.length;

      await cluster.admin.create(
        "/api/v1/namespaces/default/pods",
        workloadPod("first", "exec sleep 3600"),
        PodSchema,
      );
      const tCreated = performance.now();
      const first = await waitFor("the first pod Running with an IP", async () => {
        const p = await cluster.admin.get("/api/v1/namespaces/default/pods/first", PodSchema);
        return p.status?.phase === "Running" && p.status.podIP ? p : null;
      }, diag);
      const tFirst = performance.now();
      const ip = first.status!.podIP!;

      const after = await fake.state();
      assertEquals(after.enis.length, 1, JSON.stringify(after.enis));
      const eni = after.enis[0];
      assertEquals(eni.status, "inuse");
      assertEquals(eni.instanceId, INSTANCE);
      assertEquals(eni.subnetId, "sbn-rdns0001");
      assertEquals(eni.privateIpSet.map((a) => a.privateIpAddress), [ip]);
      assert(ip.startsWith("10.200.0."), `the pod's IP ${ip} is of the fake cloud's subnet`);
      const since = after.requests.slice(nBefore);
      const created = since.filter((r) => r.method === "POST" && r.path === "/v1/eni");
      assertEquals(created.map((r) => r.status), [200], "created after the pod");
      const attached = since.filter((r) =>
        r.method === "PUT" && r.path === `/v1/eni/${eni.eniId}` && "attach" in r.query
      );
      assertEquals(attached.map((r) => r.status), [200], "attached after the pod");
      // The fake checks every signature against the one key it knows, the Secret's: none
      // refused, and it answered the agent (its metadata and API calls).
      const refused = after.requests.filter((r) => SIGNATURE_CODES.includes(r.code ?? ""));
      assertEquals(refused, [], "no request refused for its signature");
      assert(after.requests.length > 0);

      const s = (a: number, b: number) => `${((b - a) / 1000).toFixed(1)} s`;
      say(
        `wall: manifests applied → agent Ready ${s(tApplied, tReady)}; first pod created → ` +
          `Running ${s(tCreated, tFirst)}; test start → first pod Running ${s(t0, tFirst)}; ` +
          `${agentAsks.length} queries for ${CLOUD_HOST} (types ${
            agentAsks.map((q) => q.qtype).join(",")
          }), ${after.requests.length} cloud requests (${since.length} after the pod)`,
      );
    } finally {
      await node?.close();
      await fake?.close();
      await dns?.close();
      await vpc.close();
    }
  },
});
