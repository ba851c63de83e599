/**
 * NetworkPolicy on the real node (issue 50, point 3): the upstream-style cases of
 * tests/network_policy_e2e_test.ts (the case table of tests/support/policy_cases.ts, its
 * hand-written matrices) against pods the real kubelet started.
 *
 * One real node (tests/support/k8s/real_node.ts: kubelet, containerd 2.x, runc) runs the
 * shipped DaemonSet (deploy/kubernetes/, enim's image from scripts/image.ts imported into
 * containerd) with NetworkPolicy as it ships: `networkPolicy.enabled` left at its default
 * (`auto`: on in a pod), the agent reading the API through the `kubernetes` Service (the
 * real kube-proxy in the node) as the shipped RBAC's ServiceAccount. Three namespaces of
 * three busybox pods are created through the API; each pod's container listens on the
 * cases' TCP ports (busybox `nc -ll -e`, answering its `namespace/name`). Busybox has no
 * applet that answers arbitrary UDP (no udpsvd in Debian's busybox-static, nc without
 * `-u`): the UDP ports (53, 5353) are answered by tests/support/answer_server.ts started
 * in the pod's network namespace (its sandbox's, found through the CRI), as are the probes
 * (tests/support/prober.ts): enim's rules see the pod's addresses, whichever process
 * sends or answers.
 *
 * Every case of the table runs but those that need what this node does not have: a
 * policy naming pods' IPv6 addresses (the mock provider here hands out IPv4 ENIs only; a
 * case that probes IPv6 too runs its IPv4 half) and the policies a real kube-apiserver
 * refuses (`newerServer`, run on the test API server only). Each matrix is
 * the whole 9 × 9 pods × 6 ports over IPv4, asserted equal to the expected one; then an
 * allowed flow runs while a pod's and a namespace's labels and a policy change, never
 * dropped.
 *
 * Skips, saying why, without Go, gcc, or root.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { z } from "zod";
import { nodeBuildMissing } from "./support/k8s/build.ts";
import { KubeCluster, NODE_CONTROLLERS } from "./support/k8s/cluster.ts";
import { BUSYBOX_IMAGE, RealNode } from "./support/k8s/real_node.ts";
import { PodSchema } from "./support/k8s/kubelet.ts";
import { FIELD_MANAGER } from "./support/k8s/manifests.ts";
import { StoredSchema } from "./support/k8s/rest.ts";
import { installEnim, VPC_SUBNET, waitFor } from "./support/k8s/enim_node.ts";
import { SimulatedVpc } from "./support/vpc.ts";
import { ensureBuiltSync } from "../scripts/build.ts";
import { SocketAgentClient } from "../api/client.ts";
import { POD_PORTS } from "./support/policy_cluster.ts";
import { passed, Prober } from "./support/prober.ts";
import {
  assertMatrix,
  type Cell,
  cellText,
  matrixCells,
  probeBySource,
  type Probed,
} from "./support/policy_matrix.ts";
import { Servers, who } from "./support/traffic.ts";
import {
  APPS,
  CASES,
  DB,
  type End,
  type Expect,
  NAMESPACES,
  NEWER_SERVER,
  type Pods,
  WEB,
} from "./support/policy_cases.ts";

const ROOT = Deno.uid() === 0;
const MISSING = nodeBuildMissing() ?? (ROOT ? null : "needs root (namespaces, mounts, cgroups)");

const NODE = "real-node-policy";
/** Nine pods, one ENI each, and one spare. */
const ENIS = 10;
const NSENTER = "/usr/bin/nsenter";

const TCP_PORTS = POD_PORTS.filter((p) => p.proto === "tcp").map((p) => p.port);
const UDP_PORTS = POD_PORTS.filter((p) => p.proto === "udp").map((p) => p.port);

/** What containerd's verbose PodSandboxStatus says of a sandbox (the part read here). */
const SandboxInfoSchema = z.looseObject({ pid: z.number().int().positive() });

/** A pod of the test, as the cases see it, with its prober. */
interface RealPod extends End {
  prober: Prober;
}

/**
 * The container's command: one persistent `nc` listener per TCP port of the matrix, each
 * answering `<namespace>/<name>` and closing.
 */
function listeners(id: string): string {
  return [...TCP_PORTS.map((p) => `nc -ll -p ${p} -e echo ${id} &`), "wait"].join(" ");
}

/** The resources of the API the agent watches, and the last resourceVersion of each written. */
type Resource = "namespaces" | "pods" | "networkpolicies";

class Harness {
  readonly lastRv = new Map<Resource, number>();
  readonly pods = new Map<string, RealPod>();
  readonly servers = new Servers();
  current: [string, string][] = [];
  constructor(
    readonly cluster: KubeCluster,
    readonly node: RealNode,
    readonly agent: SocketAgentClient,
  ) {}

  seen(resource: Resource, rv: string) {
    this.lastRv.set(resource, Math.max(Number(rv), this.lastRv.get(resource) ?? 0));
  }

  async namespace(name: string, labels: Record<string, string>, first = false) {
    const stored = await this.cluster.admin.apply(
      `/api/v1/namespaces/${name}`,
      { apiVersion: "v1", kind: "Namespace", metadata: { name, labels } },
      StoredSchema,
      FIELD_MANAGER,
    );
    this.seen("namespaces", stored.metadata.resourceVersion);
    if (first) await this.cluster.waitServiceAccount(name, "default");
  }

  async relabel(id: string, labels: Record<string, string>) {
    const [ns, name] = id.split("/");
    const stored = await this.cluster.admin.patch(
      `/api/v1/namespaces/${ns}/pods/${name}`,
      { metadata: { labels } },
      StoredSchema,
      "merge",
    );
    this.seen("pods", stored.metadata.resourceVersion);
  }

  /** Replaces the policies in place with `policies`, then waits until the agent enforces them. */
  async setPolicies(policies: [string, string, unknown][]) {
    const admin = this.cluster.admin;
    for (const [ns, name] of this.current) {
      const collection = `/apis/networking.k8s.io/v1/namespaces/${ns}/networkpolicies`;
      const before = await admin.find(`${collection}/${name}`, StoredSchema);
      if (!before) continue;
      // The DELETE answers a Status; the DELETED event carries the deletion's version.
      const gone = await admin.watchFor(collection, {
        resourceVersion: before.metadata.resourceVersion,
        fieldSelector: `metadata.name=${name}`,
        match: (e) => e.type === "DELETED",
        started: () => admin.delete(`${collection}/${name}`, {}, false),
      });
      this.seen("networkpolicies", gone.object.metadata.resourceVersion);
    }
    this.current = [];
    for (const [namespace, name, spec] of policies) {
      const stored = await admin.apply(
        `/apis/networking.k8s.io/v1/namespaces/${namespace}/networkpolicies/${name}`,
        {
          apiVersion: "networking.k8s.io/v1",
          kind: "NetworkPolicy",
          metadata: { namespace, name },
          spec,
        },
        StoredSchema,
        FIELD_MANAGER,
      );
      this.seen("networkpolicies", stored.metadata.resourceVersion);
      this.current.push([namespace, name]);
    }
    await this.settle();
  }

  /**
   * Waits until the agent (its status on its socket, the node's /run/enim) has synced and
   * put in place every write of the test so far.
   */
  async settle(timeoutMs = 30_000) {
    const want = new Map(this.lastRv);
    const t0 = performance.now();
    let last = "";
    for (;;) {
      const s = (await this.agent.status()).policy;
      last = JSON.stringify(s ?? null);
      const done = s !== undefined && s !== null && s.synced && s.pendingEvents === 0 &&
        [...want].every(([resource, rv]) => {
          const c = s.caches.find((x) => x.resource === resource);
          return c !== undefined && Number(c.enforcedResourceVersion ?? 0) >= rv;
        }) && !s.pods.some((p) => p.state === "retrying");
      if (done) return;
      if (performance.now() - t0 > timeoutMs) {
        throw new Error(`The agent did not put the cluster's changes in place: ${last}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  ends(): End[] {
    return [...this.pods.values()];
  }

  podsById(): Pods {
    return Object.fromEntries(this.pods);
  }

  async close() {
    for (const p of this.pods.values()) await p.prober.close().catch(() => {});
    await this.servers[Symbol.asyncDispose]().catch(() => {});
  }
}

/** The pid of the sandbox (pause process) of pod `ns/name`: its network namespace's. */
async function sandboxPid(node: RealNode, ns: string, name: string): Promise<number> {
  const sb = (await node.cri.listPodSandbox()).find((s) =>
    s.metadata.namespace === ns && s.metadata.name === name && s.state === "SANDBOX_READY"
  );
  if (!sb) throw new Error(`No ready sandbox of ${ns}/${name}`);
  const st = await node.cri.podSandboxStatus(sb.id);
  return SandboxInfoSchema.parse(JSON.parse(st.info.info ?? "{}")).pid;
}

/**
 * Probes `cells` in rounds, each round every source probing one destination (the Latin
 * square of {@linkcode roundOf}): a port gets one connection at a time. busybox's
 * `nc -ll` accepts slowly (a fork and an exec each) and its listen queue is short: 30
 * connections at once to one port lose a third of their SYNs for a second (measured in a
 * namespace of this machine), more than a probe's time.
 */
async function probeCells(h: Harness, cells: Cell<RealPod>[], timeoutMs: number) {
  const ids = [...h.pods.keys()];
  const roundOf = (x: Cell<RealPod>) =>
    (ids.indexOf(x.d.id) - ids.indexOf(x.s.id) + ids.length) % ids.length;
  const out: Probed<RealPod>[] = [];
  for (let round = 0; round < ids.length; round++) {
    const these = cells.filter((x) => roundOf(x) === round);
    out.push(...await probeBySource(these, timeoutMs, (s) => s.prober));
  }
  return out;
}

/**
 * The whole IPv4 matrix (every pod to every pod, itself included, on every port) against
 * `expect` (tests/support/policy_matrix.ts), probed in rounds. An answer came from the
 * right pod (and, over UDP, saw the client's own address). Returns how many cells were
 * probed.
 */
async function checkMatrix(h: Harness, expect: Expect): Promise<number> {
  const cells = matrixCells([...h.pods.values()], [4]);
  const { first, again } = await assertMatrix(
    cells,
    expect,
    (cells, timeoutMs) => probeCells(h, cells, timeoutMs),
  );
  for (const { cell, result } of [...first, ...again]) {
    if (!result.startsWith("open ")) continue;
    const line = result.slice(5);
    if (cell.proto === "udp") assertEquals(who(line), `${cell.d.id} ${cell.s.v4}`, cellText(cell));
    else assertEquals(line, cell.d.id, cellText(cell));
  }
  return cells.length;
}

/** Why a case of the table does not run here (null: it runs). */
function skipWhy(k: (typeof CASES)[number]): string | null {
  // A case that probes IPv6 too runs its IPv4 half, unless its policy names pods' IPv6
  // addresses (none here).
  if (k.ipv6 && typeof k.policies === "function") {
    return "its policy names IPv6 addresses: the node's mock provider hands out IPv4 ENIs only";
  }
  if (k.newerServer) return NEWER_SERVER;
  return null;
}

Deno.test({
  name:
    "NetworkPolicy on the real node: the shipped DaemonSet enforces the upstream-style cases between pods the real kubelet started",
  ignore: MISSING !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn(t) {
    ensureBuiltSync();
    const t0 = performance.now();
    const say = (l: string) => console.error(l);
    await using cluster = await KubeCluster.start({ controllers: NODE_CONTROLLERS, progress: say });
    const vpc = await SimulatedVpc.create({ subnets: { ipv4: VPC_SUBNET.cidr } });
    let node: RealNode | null = null;
    let h: Harness | null = null;
    try {
      const nic = await vpc.nodeNic();
      node = await RealNode.start(cluster, {
        name: NODE,
        netns: vpc.node.name,
        shareNetns: [vpc.vpc.name],
        nodeIp: nic.ipv4!,
        cniPlugins: ["/usr/lib/cni/loopback", "/usr/lib/cni/host-local"],
        progress: say,
      });
      // The agent reaches the API as a pod does: the `kubernetes` Service's ClusterIP.
      await node.serveKubernetesService();
      await installEnim(cluster, node, vpc, {
        enis: ENIS,
        networkPolicy: "shipped",
        progress: say,
      });
      const agent = new SocketAgentClient(node.host("/run/enim/enim.sock"), 30_000);
      const harness = new Harness(cluster, node, agent);
      h = harness;
      const status = await agent.status();
      assert(status.policy, "NetworkPolicy is on in the shipped DaemonSet's agent");

      // Three namespaces of three pods, through the API.
      for (const [ns, labels] of Object.entries(NAMESPACES)) {
        await harness.namespace(ns, labels, true);
      }
      for (const ns of Object.keys(NAMESPACES)) {
        for (const [app, def] of Object.entries(APPS)) {
          await cluster.admin.create(`/api/v1/namespaces/${ns}/pods`, {
            apiVersion: "v1",
            kind: "Pod",
            metadata: { name: app, namespace: ns, labels: def.labels },
            spec: {
              terminationGracePeriodSeconds: 1,
              containers: [{
                name: "main",
                image: BUSYBOX_IMAGE,
                imagePullPolicy: "Never",
                command: ["/bin/sh", "-c", listeners(`${ns}/${app}`)],
                ports: def.ports(ns),
                resources: { limits: { "enim.dev/eni": "1" }, requests: { "enim.dev/eni": "1" } },
              }],
            },
          }, StoredSchema);
        }
      }
      const tPods = performance.now();
      for (const ns of Object.keys(NAMESPACES)) {
        for (const app of Object.keys(APPS)) {
          const id = `${ns}/${app}`;
          const pod = await waitFor(`${id} Running with an IP`, async () => {
            const p = await cluster.admin.get(`/api/v1/namespaces/${ns}/pods/${app}`, PodSchema);
            return p.status?.phase === "Running" && p.status.podIP ? p : null;
          }, node);
          harness.seen("pods", pod.metadata.resourceVersion);
          const v4 = pod.status!.podIP!;
          assert(v4.startsWith("10.200.0."), `${id}'s IP ${v4} is an ENI's of the VPC`);
          const pid = await sandboxPid(node, ns, app);
          const enter = [NSENTER, `--net=/proc/${pid}/ns/net`, "--"];
          await harness.servers.start(
            { label: id, argv: enter },
            id,
            UDP_PORTS.map((port) => ({ proto: "udp" as const, port, bind: "0.0.0.0" })),
            1800,
          );
          const prober = await Prober.startWith(id, enter);
          const labels = APPS[app].labels;
          harness.pods.set(id, { id, ns, app, tier: labels.tier, v4, v6: "", prober });
        }
      }
      await harness.settle(60_000);
      say(
        `nine pods Running with ENIs in ${((performance.now() - tPods) / 1000).toFixed(1)} s`,
      );

      const tCases = performance.now();
      let probes = 0, ran = 0;
      for (const k of CASES) {
        const why = skipWhy(k);
        await t.step({
          name: why ? `${k.name} (not here: ${why})` : k.ipv6 ? `${k.name} (IPv4 here)` : k.name,
          ignore: why !== null,
          fn: async () => {
            await harness.setPolicies(
              typeof k.policies === "function" ? k.policies(harness.podsById()) : k.policies,
            );
            probes += await checkMatrix(harness, k.expect);
            ran++;
          },
        });
      }
      const casesSec = (performance.now() - tCases) / 1000;
      await t.step(`${ran} cases, ${probes} probes in ${casesSec.toFixed(1)} s`, () => {
        assertEquals(ran, CASES.filter((k) => skipWhy(k) === null).length);
        assert(ran >= 25, `${ran} cases`);
      });

      await changesWhileTrafficRuns(t, harness);
      await harness.setPolicies([]);
      say(`wall time ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    } catch (err) {
      if (node) console.error(await node.logs(8000));
      throw err;
    } finally {
      await h?.close();
      await node?.close();
      await vpc.close();
    }
  },
});

/**
 * A pod's label change, a namespace's label change and a policy's deletion while the
 * pods run and an allowed flow (alpha/web → alpha/db, TCP 5432) runs all along, never
 * dropped.
 */
async function changesWhileTrafficRuns(t: Deno.TestContext, h: Harness) {
  const P = h.pods;
  const db = P.get("alpha/db")!;
  await h.setPolicies([["alpha", "db", {
    podSelector: DB,
    ingress: [{
      from: [{ podSelector: WEB }, { namespaceSelector: { matchLabels: { access: "db" } } }],
      ports: [{ port: 5432 }],
    }],
  }]]);
  const probe = async (from: RealPod, ms: number) =>
    (await from.prober.probe([{ proto: "tcp", addr: db.v4, port: 5432 }], ms))[0];
  /** Reached or not; a first answer that differs from `want` is asked again, longer. */
  const reach = async (from: RealPod, want: boolean) => {
    let r = await probe(from, want ? 2_000 : 1_000);
    if (passed(r) !== want) r = await probe(from, 3_000);
    return passed(r);
  };
  let stop = false;
  let rounds = 0;
  const failures: string[] = [];
  const traffic = (async () => {
    while (!stop) {
      const r = await probe(P.get("alpha/web")!, 2_000);
      rounds++;
      if (r !== "open alpha/db") failures.push(r);
      await new Promise((ok) => setTimeout(ok, 20));
    }
  })();
  try {
    await t.step("a pod's label change lets it in, and its change back keeps it out", async () => {
      assertEquals(await reach(P.get("alpha/job")!, false), false);
      await h.relabel("alpha/job", { app: "web" });
      await h.settle();
      assertEquals(await reach(P.get("alpha/job")!, true), true);
      await h.relabel("alpha/job", { app: "job" });
      await h.settle();
      assertEquals(await reach(P.get("alpha/job")!, false), false);
    });
    await t.step("a namespace's label change lets its pods in", async () => {
      assertEquals(await reach(P.get("gamma/db")!, false), false);
      await h.namespace("gamma", { ...NAMESPACES.gamma, access: "db" });
      await h.settle();
      assertEquals(await reach(P.get("gamma/db")!, true), true);
      assertEquals(await reach(P.get("beta/db")!, false), false);
    });
    await t.step("deleting the policy lets everyone in again", async () => {
      assertEquals(await reach(P.get("beta/web")!, false), false);
      await h.setPolicies([]);
      assertEquals(await reach(P.get("beta/web")!, true), true);
    });
  } finally {
    stop = true;
    await traffic;
  }
  await t.step(`the allowed flow ran ${rounds} times through every change, never dropped`, () => {
    assertEquals(failures, []);
    assert(rounds >= 5, `${rounds} rounds`);
  });
}
