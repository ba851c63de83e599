/**
 * Issue 51, item 2: enim rolled out from the previous release (N−1, 0.1.0, built from
 * history) to this one (N) and back, with pods running, on the real node of
 * tests/support/k8s/real_node.ts (real kubelet, containerd 2.x, runc; the real control
 * plane and kube-proxy).
 *
 * - The images: N's is `deno task image` (scripts/image.ts) of this tree. N−1's is the same
 *   packaging (scripts/image.ts, `release` option) around 0.1.0's own bundle and its own
 *   deno.json permission set (tests/support/releases.ts builds the bundle at 0.1.0's commit).
 *   0.1.0 shipped a `deno compile` binary (its deploy/Containerfile), which needs denort,
 *   downloaded from dl.deno.land: not reachable here. So 0.1.0's own manifests (read from
 *   git at its commit) are applied with one change to its init container: its three lines
 *   copying the binary become the image's installer (`withImageInstaller`); it still writes
 *   the conflist from its ConfigMap, as 0.1.0 did.
 * - Both agents' ConfigMaps are for the simulated VPC (`simulatedAgentConfig`): 0.1.0's
 *   strict schema refuses N's `metrics` and `cniConfig`, so a rollback is applying N−1's
 *   manifests, ConfigMap included, as an operator does (docs/upgrading.md).
 * - PODS workload pods (busybox httpd on 8080 and an echo server on 9000, each with an ENI)
 *   behind a NodePort Service; a client outside the node (tests/support/rollout_client.ts
 *   in the simulated VPC's namespace) sends requests to every pod by its ENI's address and
 *   to the NodePort through the real kube-proxy, and holds a TCP connection to each pod's
 *   echo server and one through the NodePort, through four rollouts: N−1 → N, N → N
 *   (`kubectl rollout restart`), N → N−1 (the rollback), N−1 → N.
 * - NetworkPolicy on in both releases, as they ship (`auto`: on in a pod, the agent reading
 *   the API through the `kubernetes` Service as the release's own RBAC allows). A
 *   NetworkPolicy selects the web pods and admits the client's address in the VPC only (the
 *   node's own addresses, kubelet's probes and the NodePort's masqueraded flows, enim admits
 *   always). Two "stranger" pods with an ENI on the node probe the web pods from their own
 *   network namespaces (tests/support/deny_loop.ts, a prober entered through each one's
 *   sandbox pid), TCP, to web pods' ENI addresses (a port answering the pod's name, a port
 *   nothing listens on) and to the Service's ClusterIP: before the policy they get through
 *   (the path works), once 0.1.0's agent enforces it they are dropped, and the loop runs
 *   through all four rollouts.
 * - While an agent is being replaced, pods are created and deleted (their ADD and DEL go
 *   to the plugin while no agent serves).
 * - Asserted 0 in every rollout: failed requests, broken connections, moments a workload
 *   pod is missing or not ready in the Service's EndpointSlice (sampled every 500 ms), ENIs
 *   lost or owned twice and web pods whose ENI changed (the agent's ENIs and attachments
 *   after each rollout), plugin calls that failed other than 0.1.0's plugin finding no agent
 *   (the plugin's log; N's own records carry `pluginVersion`), pods that did not start,
 *   deny probes that got through (an answer or a reset); and the deny loop alive (each
 *   stranger sent at least MIN_BATCHES batches in each rollout's window).
 * - The Node's Ready condition (sampled every 500 ms), kubelet's FailedCreatePodSandBox
 *   events and every failed plugin call: asserted 0 in each rollout into N (N−1 → N twice,
 *   N → N). N's DaemonSet surges (maxSurge 1): its pod installs N's plugin while the old
 *   agent still serves and waits as a standby for its lock, so 0.1.0's plugin never answers
 *   without its agent. Measured and reported in the rollback to 0.1.0, whose own manifests
 *   replace the old pod first and whose plugin answers STATUS 50 and ADD 11 until its agent
 *   serves (docs/upgrading.md, "Rolling back to 0.1.0").
 * - Then the DaemonSet is deleted (no uninstall): how soon the Node goes NotReady is
 *   measured (it must go).
 *
 * Figures are printed at the end (`rollout:` lines) and recorded in docs/upgrading.md.
 * Skips, saying why, without Go, gcc, or root.
 *
 * @module
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { existsSync } from "node:fs";
import { netSnapshot } from "./support/net_snapshot.ts";
import { z } from "zod";
import { nodeBuildMissing } from "./support/k8s/build.ts";
import { KubeCluster, NODE_CONTROLLERS } from "./support/k8s/cluster.ts";
import { RealNode } from "./support/k8s/real_node.ts";
import { NodeSchema, PodSchema } from "./support/k8s/kubelet.ts";
import { applyManifests, type ManifestDoc, readManifests } from "./support/k8s/manifests.ts";
import { StoredListSchema, StoredSchema } from "./support/k8s/rest.ts";
import {
  agentPods,
  type ListedPod,
  PodListSchema,
  releaseManifests,
  simulatedAgentConfig,
  uninstallJob,
  VPC_SUBNET,
  waitFor,
  withAgentConfig,
  withImage,
  withImageInstaller,
  workloadPod,
} from "./support/k8s/enim_node.ts";
import { releaseBuild } from "./support/releases.ts";
import { breachSummary, DenyLoop, type DenyProbe, Timeline } from "./support/deny_loop.ts";
import { passed, Prober } from "./support/prober.ts";
import { type ClientArgs, type ClientLine, ClientLineSchema } from "./support/rollout_client.ts";
import { buildImage } from "../scripts/image.ts";
import { SimulatedVpc } from "./support/vpc.ts";
import { ensureBuiltSync } from "../scripts/build.ts";
import { unixRequest } from "../api/client.ts";
import { VERSION } from "../lib/version.ts";
import { ROOT } from "../scripts/_paths.ts";

const ROOT_USER = Deno.uid() === 0;
const MISSING = nodeBuildMissing() ??
  (ROOT_USER ? null : "needs root (namespaces, mounts, cgroups)");

const OLD = "0.1.0";
const OLD_IMAGE = `ghcr.io/example/enim:${OLD}`;
const NEW_IMAGE = `ghcr.io/example/enim:${VERSION}`;
const NODE = "real-node-rollout";
/** Workload pods behind the Service, each with an ENI. */
const PODS = 20;
/** Pods created while each agent is replaced (and deleted during the next replacement). */
const CHURN = 2;
/** Pods with an ENI that NetworkPolicy keeps out of the web pods: the deny loop's sources. */
const STRANGERS = 2;
const ENIS = PODS + 2 * CHURN + STRANGERS + 1;
const HTTP_NODEPORT = 30080;
const ECHO_NODEPORT = 30900;
const NSENTER = "/usr/bin/nsenter";
/** A web pod's port answering its name at once (a deny probe that got through says so). */
const HELLO_PORT = 7070;
/** A port nothing listens on in a web pod (a deny probe that got through meets a reset). */
const CLOSED_PORT = 8081;
/** The Service's ports to those two (ClusterIP probes). */
const SVC_HELLO = 7070;
const SVC_CLOSED = 81;
/** The web pods each stranger probes by their ENI's address (the strangers: distinct ones). */
const TARGETS_PER_STRANGER = 5;
/** The probes of each port of the ClusterIP in a stranger's batch. */
const CLUSTERIP_PROBES = 3;
/** How long each deny batch waits for what gets through. */
const DENY_TIMEOUT_MS = 1000;
/** Each stranger's deny batches in a rollout's window, at least (the loop alive). */
const MIN_BATCHES = 5;

const say = (l: string) => console.error(l);
/** The test's clock: ms since it started (the client's `at` is wall-clock ms: minus T0). */
const T0 = Date.now();
const now = () => Date.now() - T0;
const secs = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

function webPod(name: string) {
  return workloadPod(
    name,
    `mkdir -p /www && echo ${name} > /www/index.html && httpd -p 8080 -h /www && ` +
      `{ nc -ll -p ${HELLO_PORT} -e echo ${name} & } && exec nc -ll -p 9000 -e /bin/cat`,
    {
      labels: { app: "web" },
      container: {
        ports: [{ name: "http", containerPort: 8080 }, { name: "echo", containerPort: 9000 }],
        readinessProbe: { httpGet: { path: "/", port: 8080 }, periodSeconds: 5 },
      },
    },
  );
}

/**
 * A pod created while the agent is replaced: no `enim.dev/eni` request, so the scheduler
 * places it while the agent's device plugin is away too, and its ADD reaches the plugin
 * during the replacement (the plugin gives any pod of the node an ENI).
 */
function churnPod(name: string) {
  return workloadPod(name, "exec sleep 3600", { enis: 0, labels: { app: "churn" } });
}

const EniListSchema = z.object({
  enis: z.array(z.looseObject({
    id: z.string(),
    state: z.string(),
    owner: z.nullable(z.looseObject({ containerId: z.optional(z.string()) })),
  })),
});
const AttachmentListSchema = z.object({
  attachments: z.array(z.looseObject({
    containerId: z.string(),
    pod: z.string(),
    eniId: z.nullable(z.string()),
    state: z.string(),
  })),
});

/** The agent's ENIs and attachments, as it answers on its socket. */
interface Snapshot {
  enis: z.infer<typeof EniListSchema>["enis"];
  attachments: z.infer<typeof AttachmentListSchema>["attachments"];
}

async function snapshot(node: RealNode): Promise<Snapshot> {
  const socket = node.host("/run/enim/enim.sock");
  return await waitFor(
    "the agent's ENIs and attachments",
    async () => {
      try {
        const e = await unixRequest(socket, "GET", "/v1/enis", undefined, 10_000);
        const a = await unixRequest(socket, "GET", "/v1/attachments", undefined, 10_000);
        if (e.status !== 200 || a.status !== 200) return null;
        return {
          enis: EniListSchema.parse(JSON.parse(e.body)).enis,
          attachments: AttachmentListSchema.parse(JSON.parse(a.body)).attachments,
        };
      } catch {
        return null;
      }
    },
    node,
    60_000,
  );
}

/** What is wrong with a snapshot: ENIs missing, owned twice, owners without attachments. */
function eniProblems(s: Snapshot): string[] {
  const out: string[] = [];
  if (s.enis.length !== ENIS) out.push(`${s.enis.length} ENIs, not ${ENIS}`);
  const ids = new Set(s.enis.map((e) => e.id));
  if (ids.size !== s.enis.length) out.push("an ENI listed twice");
  const byEni = new Map<string, string[]>();
  for (const a of s.attachments) {
    if (!a.eniId) continue;
    byEni.set(a.eniId, [...(byEni.get(a.eniId) ?? []), a.pod]);
    if (!ids.has(a.eniId)) out.push(`${a.pod}'s ENI ${a.eniId} is not the node's`);
  }
  for (const [eni, pods] of byEni) {
    if (pods.length > 1) out.push(`ENI ${eni} owned twice: ${pods.join(", ")}`);
  }
  for (const e of s.enis) {
    if (e.state === "lost") out.push(`ENI ${e.id} lost`);
    if (e.state === "owned" && !byEni.has(e.id)) out.push(`ENI ${e.id} owned by no attachment`);
  }
  return out;
}

/** Each workload pod's ENI (`default/web-00` → `eni-…`). */
function webEnis(s: Snapshot): Record<string, string | null> {
  return Object.fromEntries(
    s.attachments.filter((a) => a.pod.startsWith("default/web-"))
      .map((a): [string, string | null] => [a.pod, a.eniId])
      .sort((a, b) => a[0] < b[0] ? -1 : 1),
  );
}

const SliceListSchema = StoredListSchema.extend({
  items: z.array(z.looseObject({
    endpoints: z.nullable(z.optional(z.array(z.looseObject({
      addresses: z.array(z.string()),
      conditions: z.optional(z.looseObject({ ready: z.optional(z.boolean()) })),
    })))),
  })),
});
const DaemonSetSchema = StoredSchema.extend({
  status: z.optional(z.looseObject({
    observedGeneration: z.optional(z.number()),
    desiredNumberScheduled: z.number(),
    updatedNumberScheduled: z.optional(z.number()),
    numberAvailable: z.optional(z.number()),
  })),
});
const EventListSchema = StoredListSchema.extend({
  items: z.array(z.looseObject({
    reason: z.optional(z.string()),
    message: z.optional(z.string()),
    involvedObject: z.looseObject({ name: z.optional(z.string()) }),
  })),
});
/** A plugin call's record in the plugin's log (0.1.0's and N's carry these fields). */
const CallRecordSchema = z.looseObject({
  ts: z.optional(z.string()),
  verb: z.nullable(z.optional(z.string())),
  pod: z.optional(z.string()),
  code: z.number(),
  msg: z.optional(z.string()),
  durationMs: z.number(),
  /** Set by N's plugin process when it answered alone (0.1.0's sets none). */
  pluginVersion: z.optional(z.string()),
});
type CallRecord = z.infer<typeof CallRecordSchema>;

/**
 * Whether a failed call is 0.1.0's plugin finding no agent (its STATUS 50, its ADD 11):
 * 0.1.0's plugin answers alone without a version and says the agent is not reachable.
 * Anything else that failed is N's (its plugin, or an agent's answer).
 */
function oldPluginAlone(c: CallRecord): boolean {
  return c.pluginVersion === undefined && /not reachable/.test(c.msg ?? "");
}

/**
 * `docs` with the DaemonSet's pod template annotated as `kubectl rollout restart` does: a
 * rollout of the same release (N to N), the case every later upgrade is.
 */
function withRestart(docs: ManifestDoc[]): ManifestDoc[] {
  return docs.map((d) => {
    if (d.kind !== "DaemonSet") return d;
    const obj = JSON.parse(d.text);
    obj.spec.template.metadata.annotations = {
      ...obj.spec.template.metadata.annotations,
      "kubectl.kubernetes.io/restartedAt": new Date().toISOString(),
    };
    return { ...d, text: JSON.stringify(obj) };
  });
}

/** The Node's Ready condition and the Service's EndpointSlice, sampled every 500 ms. */
class Watcher {
  readySamples = 0;
  notReady: { at: number; status: string }[] = [];
  /** Transitions of the Node's Ready condition: [ms since start, status]. */
  readyTimeline: [number, string][] = [];
  sliceSamples = 0;
  /** Moments a workload pod's address was missing or not ready in the EndpointSlice. */
  sliceGaps: { at: number; ip: string; why: string }[] = [];
  #stop = false;
  #done: Promise<void> | null = null;

  constructor(
    private cluster: KubeCluster,
    private ips: () => string[],
    private checkSlice: () => boolean,
  ) {}

  start(): void {
    this.#done = (async () => {
      let last = "";
      while (!this.#stop) {
        try {
          const n = await this.cluster.admin.get(`/api/v1/nodes/${NODE}`, NodeSchema);
          const s = n.status?.conditions?.find((c) => c.type === "Ready")?.status ?? "absent";
          this.readySamples++;
          if (s !== last) this.readyTimeline.push([now(), s]);
          last = s;
          if (s !== "True") this.notReady.push({ at: now(), status: s });
          if (this.checkSlice()) {
            const slices = await this.cluster.admin.get(
              "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
              SliceListSchema,
              { labelSelector: "kubernetes.io/service-name=web" },
            );
            this.sliceSamples++;
            const ready = new Map<string, boolean>();
            for (const sl of slices.items) {
              for (const e of sl.endpoints ?? []) {
                for (const a of e.addresses) ready.set(a, e.conditions?.ready !== false);
              }
            }
            for (const ip of this.ips()) {
              if (!ready.has(ip)) this.sliceGaps.push({ at: now(), ip, why: "missing" });
              else if (!ready.get(ip)) this.sliceGaps.push({ at: now(), ip, why: "not ready" });
            }
          }
        } catch (err) {
          say(`watcher: ${err instanceof Error ? err.message : String(err)}`);
        }
        await new Promise((r) => setTimeout(r, 500));
      }
    })();
  }

  async stop(): Promise<void> {
    this.#stop = true;
    await this.#done;
  }
}

const ServiceSchema = StoredSchema.extend({ spec: z.looseObject({ clusterIP: z.string() }) });
const JobSchema = StoredSchema.extend({
  status: z.optional(z.looseObject({
    succeeded: z.optional(z.number()),
    failed: z.optional(z.number()),
  })),
});

/**
 * What a container of a pod printed: its log file on the node (kubelet's
 * `/var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log`, CRI lines), for a Job's pod
 * found by the Job's name.
 */
async function podLog(node: RealNode, ns: string, job: string, container: string) {
  const root = node.host("/var/log/pods");
  for await (const e of Deno.readDir(root)) {
    if (!e.name.startsWith(`${ns}_${job}-`)) continue;
    const text = await Deno.readTextFile(`${root}/${e.name}/${container}/0.log`);
    // `<time> stdout F <text>`: the text.
    return text.split("\n").filter((l) => l).map((l) => l.split(" ").slice(3).join(" "))
      .join("\n");
  }
  throw new Error(`No log of ${ns}/${job}'s ${container} on the node`);
}

/**
 * The NetworkPolicy of the web pods: ingress from the client's address in the VPC (the
 * simulated VPC's gateway on its bridge, the source of what the client sends to a pod's
 * ENI) and nothing else. What reaches them from the node itself (kubelet's readiness
 * probes, the NodePort's flows, which kube-proxy masquerades to the node's address) enim
 * admits always (docs/network_policy.md).
 */
function webPolicy() {
  return {
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: { name: "web" },
    spec: {
      podSelector: { matchLabels: { app: "web" } },
      policyTypes: ["Ingress"],
      ingress: [{ from: [{ ipBlock: { cidr: `${VPC_SUBNET.gateway}/32` } }] }],
    },
  };
}

/**
 * A stranger's deny batch, TCP: to each of `targets`' ENI address (its name answered on
 * HELLO_PORT, a reset from CLOSED_PORT) and, CLUSTERIP_PROBES times each, to those two
 * ports of the Service's ClusterIP (kube-proxy's DNAT to any web pod, a new source port
 * each). Every one is a packet the web policy denies.
 */
function strangerProbes(targets: [string, string][], clusterIp: string): DenyProbe[] {
  const base = { proto: "tcp" as const, where: "same" as const, family: 4 as const };
  const svc = { ...base, target: "default/web", path: "clusterip" as const, addr: clusterIp };
  return [
    ...targets.flatMap(([target, addr]) => [
      { ...base, target, path: "pod" as const, addr, port: HELLO_PORT },
      { ...base, target, path: "pod" as const, addr, port: CLOSED_PORT },
    ]),
    ...Array.from({ length: CLUSTERIP_PROBES }, () => [
      { ...svc, port: SVC_HELLO },
      { ...svc, port: SVC_CLOSED },
    ]).flat(),
  ];
}

/** The client in the simulated VPC's namespace (tests/support/rollout_client.ts). */
class OutsideClient {
  lines: ClientLine[] = [];
  #proc: Deno.ChildProcess;
  #reading: Promise<void>;
  #ready: Promise<void>;

  constructor(netns: string, args: ClientArgs) {
    const proc = new Deno.Command(NSENTER, {
      args: [
        `--net=/run/netns/${netns}`,
        "--",
        Deno.execPath(),
        "run",
        "--quiet",
        "--config",
        `${ROOT}/tests/deno.json`,
        "--allow-net",
        `${ROOT}/tests/support/rollout_client.ts`,
        JSON.stringify(args),
      ],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#proc = proc;
    let ready: () => void = () => {};
    let failed: (e: Error) => void = () => {};
    this.#ready = new Promise((res, rej) => {
      ready = res;
      failed = rej;
    });
    this.#reading = (async () => {
      let rest = "";
      const lines = async function* (stream: ReadableStream<string>) {
        for await (const chunk of stream) {
          const parts = (rest + chunk).split("\n");
          rest = parts.pop() ?? "";
          yield* parts;
        }
      };
      for await (const l of lines(proc.stdout.pipeThrough(new TextDecoderStream()))) {
        if (!l.trim()) continue;
        const line = ClientLineSchema.parse(JSON.parse(l));
        this.lines.push(line);
        if (line.kind === "ready") ready();
        if (line.kind !== "ready" && line.kind !== "summary") say(`client: ${l}`);
      }
      failed(new Error("the client ended before it was ready"));
    })();
  }

  ready(): Promise<void> {
    return this.#ready;
  }

  failures(): number {
    return this.lines.filter((l) => l.kind === "fail" || l.kind === "broken").length;
  }

  /** Closes its stdin; returns its totals. */
  async stop(): Promise<Extract<ClientLine, { kind: "summary" }>> {
    await this.#proc.stdin.close().catch(() => {});
    await this.#reading;
    const status = await this.#proc.status;
    const summary = this.lines.find((l) => l.kind === "summary");
    if (!summary || summary.kind !== "summary") {
      throw new Error(`the client exited with ${status.code} without its totals`);
    }
    return summary;
  }

  kill(): void {
    try {
      this.#proc.kill("SIGKILL");
    } catch { /* gone */ }
  }
}

Deno.test({
  name: `enim rolls out from ${OLD} (built from history) to ${VERSION}, restarts, rolls back ` +
    "and out again on a real node with pods serving: no request failed, no connection broken, " +
    "no pod out of its Service, no ENI lost, no packet through that NetworkPolicy denies; " +
    "the Node Ready and no plugin call failed through every rollout into 0.2.0",
  ignore: MISSING !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    ensureBuiltSync();
    // The Job controller too: the uninstall Job at the end.
    await using cluster = await KubeCluster.start({
      controllers: [...NODE_CONTROLLERS, "job-controller"],
      progress: say,
    });
    const k8s = cluster.bins.version;
    const vpc = await SimulatedVpc.create({ subnets: { ipv4: VPC_SUBNET.cidr } });
    let node: RealNode | null = null;
    let client: OutsideClient | null = null;
    let watcher: Watcher | null = null;
    const strangers: { id: string; prober: Prober; probes: DenyProbe[] }[] = [];
    const timeline = new Timeline();
    let denyLoop: DenyLoop | null = null;
    try {
      const nic = await vpc.nodeNic();
      const nodeIp = nic.ipv4!;
      node = await RealNode.start(cluster, {
        name: NODE,
        netns: vpc.node.name,
        shareNetns: [vpc.vpc.name],
        nodeIp,
        cniPlugins: ["/usr/lib/cni/loopback", "/usr/lib/cni/host-local"],
        progress: say,
      });
      const n = node;
      await n.serveKubernetesService();

      // The two images, imported under the tags the manifests name.
      const old = await releaseBuild(OLD);
      const oldImage = await buildImage({
        outDir: `${n.base}/images/enim-old`,
        ref: OLD_IMAGE,
        bundleDir: `${old.dir}/bundle`,
        release: { version: OLD, root: old.dir! },
      });
      const newImage = await buildImage({ outDir: `${n.base}/images/enim-new`, ref: NEW_IMAGE });
      await n.importImage(oldImage.archive, OLD_IMAGE);
      await n.importImage(newImage.archive, NEW_IMAGE);
      say(`rollout: images ${OLD_IMAGE} (${oldImage.id}) and ${NEW_IMAGE} (${newImage.id})`);

      const oldDocs = withImage(
        withImageInstaller(
          withAgentConfig(
            await releaseManifests(OLD, k8s),
            simulatedAgentConfig(vpc, { enis: ENIS, release: OLD, networkPolicy: "shipped" }),
          ),
        ),
        OLD_IMAGE,
      );
      const newDocs = withImage(
        withAgentConfig(
          await readManifests(k8s),
          simulatedAgentConfig(vpc, { enis: ENIS, networkPolicy: "shipped" }),
        ),
        NEW_IMAGE,
      );

      // The node's network before enim (kube-proxy's tables in it, as after the uninstall).
      const bare = await netSnapshot(vpc.node.name, { nft: "tables" });
      // N−1 installed as it shipped.
      await applyManifests(cluster.admin, oldDocs);
      await waitFor(
        "0.1.0's agent Ready",
        async () => {
          const p = (await agentPods(cluster.admin))[0];
          return p?.status?.conditions?.find((c) => c.type === "Ready")?.status === "True"
            ? p
            : null;
        },
        n,
        180_000,
      );
      await n.waitReady(180_000);
      await waitFor(`enim.dev/eni ${ENIS} in the Node's allocatable`, async () => {
        const nd = await cluster.admin.get(`/api/v1/nodes/${NODE}`, NodeSchema);
        return nd.status?.allocatable?.["enim.dev/eni"] === String(ENIS) ? true : null;
      }, n);
      say(`rollout: [${secs(now())}] ${OLD} installed, the Node Ready`);

      // The Service and its pods.
      const svc = await cluster.admin.create("/api/v1/namespaces/default/services", {
        apiVersion: "v1",
        kind: "Service",
        metadata: { name: "web" },
        spec: {
          type: "NodePort",
          selector: { app: "web" },
          ports: [
            { name: "http", port: 80, targetPort: 8080, nodePort: HTTP_NODEPORT },
            { name: "echo", port: 9000, targetPort: 9000, nodePort: ECHO_NODEPORT },
            { name: "hello", port: SVC_HELLO, targetPort: HELLO_PORT },
            { name: "closed", port: SVC_CLOSED, targetPort: CLOSED_PORT },
          ],
        },
      }, ServiceSchema);
      const clusterIp = svc.spec.clusterIP;
      const names = Array.from({ length: PODS }, (_, i) => `web-${String(i).padStart(2, "0")}`);
      const tPods = now();
      const strangerNames = Array.from({ length: STRANGERS }, (_, i) => `stranger-${i}`);
      await Promise.all([
        ...names.map((name) =>
          cluster.admin.create("/api/v1/namespaces/default/pods", webPod(name), PodSchema)
        ),
        ...strangerNames.map((name) =>
          cluster.admin.create(
            "/api/v1/namespaces/default/pods",
            workloadPod(name, "exec sleep 3600", { labels: { role: "stranger" } }),
            PodSchema,
          )
        ),
      ]);
      const listWeb = async () =>
        (await cluster.admin.get("/api/v1/namespaces/default/pods", PodListSchema, {
          labelSelector: "app=web",
        })).items;
      const web = await waitFor(
        `${PODS} web pods Ready`,
        async () => {
          const ps = await listWeb();
          const ready = ps.filter((p) =>
            p.status?.podIP &&
            p.status.conditions?.find((c) => c.type === "Ready")?.status === "True"
          );
          return ready.length === PODS ? ready : null;
        },
        n,
        600_000,
      );
      const ips = web.map((p) => p.status!.podIP!);
      for (const ip of ips) assert(ip.startsWith("10.200.0."), `${ip} is an ENI's address`);
      say(`rollout: [${secs(now())}] ${PODS} web pods Ready in ${secs(now() - tPods)}`);
      await waitFor("every web pod ready in the EndpointSlice", async () => {
        const slices = await cluster.admin.get(
          "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
          SliceListSchema,
          { labelSelector: "kubernetes.io/service-name=web" },
        );
        const ready = slices.items.flatMap((s) =>
          (s.endpoints ?? []).filter((e) => e.conditions?.ready !== false).flatMap((e) =>
            e.addresses
          )
        );
        return ips.every((ip) => ready.includes(ip)) ? true : null;
      }, n);

      // The strangers: ENI pods of the node that the web policy keeps out. Their probes
      // pass before the policy (the path works), are all dropped once it is enforced (by
      // 0.1.0's agent), and the loop runs through every rollout.
      for (const name of strangerNames) {
        const pod = await waitFor(`${name} Running`, async () => {
          const p = await cluster.admin.get(`/api/v1/namespaces/default/pods/${name}`, PodSchema);
          return p.status?.phase === "Running" && p.status.podIP ? p : null;
        }, n);
        const sb = (await n.sandboxesOf(pod.metadata.uid)).find((x) => x.ready);
        if (!sb) throw new Error(`No ready sandbox of ${name}`);
        const pid = await n.sandboxPid(sb.id);
        const prober = await Prober.startWith(name, [NSENTER, `--net=/proc/${pid}/ns/net`, "--"]);
        const i = strangerNames.indexOf(name);
        const targets = web.filter((_, k) => k % STRANGERS === i).slice(0, TARGETS_PER_STRANGER)
          .map((p): [string, string] => [`default/${p.metadata.name}`, p.status!.podIP!]);
        strangers.push({
          id: `default/${name}`,
          prober,
          probes: strangerProbes(targets, clusterIp),
        });
      }
      const tryAll = async (want: boolean) => {
        const all = await Promise.all(
          strangers.map((st) => st.prober.probe(st.probes, want ? 3000 : DENY_TIMEOUT_MS)),
        );
        return all.flat().every((r) => passed(r) === want) ? all.flat() : null;
      };
      const open = await waitFor(
        "the strangers' probes through before the policy",
        async () => await tryAll(true),
        n,
        60_000,
      );
      say(
        `rollout: [${secs(now())}] before the policy the strangers' probes got ${
          JSON.stringify(open)
        }`,
      );
      await cluster.admin.create(
        "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
        webPolicy(),
        StoredSchema,
      );
      const tPolicy = now();
      await waitFor(
        "the web policy enforced (the strangers' probes dropped)",
        async () => await tryAll(false),
        n,
        60_000,
      );
      say(
        `rollout: [${secs(now())}] the web policy enforced by ${OLD}'s agent ${
          secs(now() - tPolicy)
        } after its creation`,
      );
      denyLoop = new DenyLoop(timeline, DENY_TIMEOUT_MS);
      for (const st of strangers) denyLoop.add(st.id, st.prober, st.probes);

      // The client outside the node; the NodePort answers before it starts.
      const args: ClientArgs = {
        http: [...ips.map((ip) => `${ip}:8080`), `${nodeIp}:${HTTP_NODEPORT}`],
        hold: [...ips.map((ip) => `${ip}:9000`), `${nodeIp}:${ECHO_NODEPORT}`],
        concurrency: 2,
        pauseMs: 50,
        timeoutMs: 5000,
      };
      client = new OutsideClient(vpc.vpc.name, args);
      await client.ready();
      watcher = new Watcher(cluster, () => ips, () => true);
      watcher.start();
      await new Promise((r) => setTimeout(r, 5000));
      assertEquals(client.failures(), 0, "the client fails before any rollout: the setup");

      // The pods whose ADD and DEL land while an agent is replaced.
      let churn: string[] = [];
      const churnCreated = new Map<string, number>();
      const churnRunning = new Map<string, number>();
      const createChurn = async (prefix: string) => {
        const made: string[] = [];
        for (let i = 0; i < CHURN; i++) {
          const name = `churn-${prefix}-${i}`;
          churnCreated.set(name, now());
          await cluster.admin.create("/api/v1/namespaces/default/pods", churnPod(name), PodSchema);
          made.push(name);
        }
        return made;
      };
      churn = await createChurn("base");

      const before = await snapshot(n);
      assertEquals(eniProblems(before), [], "ENIs before the first rollout");
      const webEni0 = webEnis(before);
      assertEquals(Object.keys(webEni0).length, PODS);

      /** Applies `docs` and waits until the DaemonSet's one pod runs `image`, Ready. */
      const rollout = async (label: string, docs: ManifestDoc[], image: string) => {
        const tStart = now();
        const loop = denyLoop!;
        const endSpan = timeline.begin(label);
        const probes0 = loop.total;
        const bySource0 = new Map(loop.bySource);
        const breaches0 = loop.breaches.length;
        const oldPod = (await agentPods(cluster.admin))[0];
        await applyManifests(cluster.admin, docs);
        // As soon as the old agent is being stopped: pods created and deleted.
        await waitFor(
          `${label}: the old agent stopping`,
          async () => {
            const ps = await agentPods(cluster.admin);
            const p = ps.find((x) => x.metadata.uid === oldPod.metadata.uid);
            return !p || p.metadata.deletionTimestamp ? true : null;
          },
          n,
          120_000,
        );
        const tStop = now();
        const gone = churn;
        const made = await createChurn(label);
        await Promise.all(
          gone.map((name) =>
            cluster.admin.delete(`/api/v1/namespaces/default/pods/${name}`, {
              gracePeriodSeconds: 1,
            })
          ),
        );
        churn = made;
        const agent: ListedPod = await waitFor(
          `${label}: the new agent Ready`,
          async () => {
            const ps = await agentPods(cluster.admin);
            const p = ps.length === 1 ? ps[0] : null;
            const ok = p && !p.metadata.deletionTimestamp &&
              p.spec.containers.every((c) => c.image === image) &&
              p.status?.conditions?.find((c) => c.type === "Ready")?.status === "True";
            return ok ? p : null;
          },
          n,
          240_000,
        );
        const tReady = now();
        await waitFor(
          `${label}: the DaemonSet's rollout done`,
          async () => {
            const ds = await cluster.admin.get(
              "/apis/apps/v1/namespaces/kube-system/daemonsets/enim-agent",
              DaemonSetSchema,
            );
            const s = ds.status;
            return s && (s.observedGeneration ?? 0) >= (ds.metadata.generation ?? 0) &&
                s.updatedNumberScheduled === s.desiredNumberScheduled &&
                s.numberAvailable === s.desiredNumberScheduled
              ? true
              : null;
          },
          n,
          120_000,
        );
        // The pods created meanwhile run with an ENI; those deleted are gone.
        await waitFor(
          `${label}: the new pods Running`,
          async () => {
            const ps = await Promise.all(
              made.map((m) => cluster.admin.get(`/api/v1/namespaces/default/pods/${m}`, PodSchema)),
            );
            for (const p of ps) {
              if (
                p.status?.phase === "Running" && p.status.podIP &&
                !churnRunning.has(p.metadata.name)
              ) churnRunning.set(p.metadata.name, now());
            }
            return ps.every((p) => p.status?.phase === "Running" && p.status.podIP) ? true : null;
          },
          n,
          240_000,
        );
        await waitFor(
          `${label}: the deleted pods gone`,
          async () => {
            for (const g of gone) {
              if (await cluster.admin.find(`/api/v1/namespaces/default/pods/${g}`, PodSchema)) {
                return null;
              }
            }
            return true;
          },
          n,
          120_000,
        );
        const snap = await snapshot(n);
        // A moment for what the replacement may still cause (a late NotReady, a slice change).
        await new Promise((r) => setTimeout(r, 10_000));
        const end = now();
        endSpan();
        const deny = {
          probes: loop.total - probes0,
          through: loop.breaches.length - breaches0,
          bySource: Object.fromEntries(
            [...loop.bySource].map(([id, c]) => [id, c - (bySource0.get(id) ?? 0)]),
          ),
        };
        say(
          `rollout: [${secs(now())}] ${label}: applied at ${secs(tStart)}, old agent stopping ` +
            `at ${secs(tStop)}, ${agent.metadata.name} (${image}) Ready at ${secs(tReady)} ` +
            `(${secs(tReady - tStop)} from the old agent's stop to the new one Ready)`,
        );
        return { label, start: tStart, end, snap, agentAway: tReady - tStop, deny };
      };

      const phases = [
        { ...(await rollout("up1", newDocs, NEW_IMAGE)), what: `${OLD} -> ${VERSION}`, into: "N" },
        {
          ...(await rollout("restart", withRestart(newDocs), NEW_IMAGE)),
          what: `${VERSION} -> ${VERSION} (rollout restart)`,
          into: "N",
        },
        {
          ...(await rollout("down", oldDocs, OLD_IMAGE)),
          what: `${VERSION} -> ${OLD}`,
          into: "N-1",
        },
        { ...(await rollout("up2", newDocs, NEW_IMAGE)), what: `${OLD} -> ${VERSION}`, into: "N" },
      ];
      await new Promise((r) => setTimeout(r, 5000));

      const loop = denyLoop!;
      await loop.stop();
      denyLoop = null;
      const totals = await client.stop();
      const clientLines = client.lines;
      client = null;
      await watcher.stop();
      const w = watcher;
      watcher = null;

      // The web pods are the same pods, never restarted.
      const webAfter = await listWeb();
      const problems: string[] = [];
      const expect = (ok: boolean, what: string) => {
        if (!ok) problems.push(what);
      };
      expect(
        JSON.stringify(webAfter.map((p) => p.metadata.uid).sort()) ===
          JSON.stringify(web.map((p) => p.metadata.uid).sort()),
        "the web pods are not the same pods",
      );
      expect(
        JSON.stringify(webAfter.map((p) => p.status?.podIP).sort()) ===
          JSON.stringify([...ips].sort()),
        "a web pod's address changed",
      );

      // The plugin's own record of every call (both versions write it).
      const calls = (await Deno.readTextFile(n.host("/var/log/enim/cni.log")).catch(() => ""))
        .split("\n").filter((l) => l.trim().startsWith("{")).map((l) => JSON.parse(l))
        .map((j) => CallRecordSchema.safeParse(j)).filter((r) => r.success).map((r) => r.data);
      const events = await cluster.admin.get("/api/v1/namespaces/default/events", EventListSchema);
      const sandboxFailures = events.items.filter((e) => e.reason === "FailedCreatePodSandBox");
      const inPhase = (at: number, p: { start: number; end: number }) =>
        at >= p.start && at <= p.end;
      let longestAdd = 0;
      for (const p of phases) {
        const mine = calls.filter((c) => c.pod?.startsWith(`default/churn-${p.label}-`));
        const adds = mine.filter((c) => c.verb === "ADD");
        const failed = mine.filter((c) => c.code !== 0);
        // Every failed call of the phase (STATUS included, whichever pod), and those that are
        // not 0.1.0's plugin finding no agent: N's, which must be none.
        const phaseFailed = calls.filter((c) =>
          c.code !== 0 && c.ts !== undefined && inPhase(Date.parse(c.ts) - T0, p) &&
          ["STATUS", "ADD", "DEL", "CHECK"].includes(c.verb ?? "")
        );
        const nFailed = phaseFailed.filter((c) => !oldPluginAlone(c));
        const longest = Math.max(0, ...adds.filter((c) => c.code === 0).map((c) => c.durationMs));
        longestAdd = Math.max(longestAdd, longest);
        const sandbox = sandboxFailures.filter((e) =>
          e.involvedObject.name?.startsWith(`churn-${p.label}-`)
        );
        const notReady = w.notReady.filter((x) => inPhase(x.at, p));
        const gaps = w.sliceGaps.filter((x) => inPhase(x.at, p));
        const fails = clientLines.filter((l) =>
          (l.kind === "fail" || l.kind === "broken") && inPhase(l.at - T0, p)
        );
        const starts = [...churnRunning].filter(([name]) => name.startsWith(`churn-${p.label}-`))
          .map(([name, t]) => t - churnCreated.get(name)!);
        say(
          `rollout: ${p.what} (${p.label}, ${secs(p.start)}..${secs(p.end)}): ` +
            `agent stop to new agent Ready ${secs(p.agentAway)}; Node Ready not True in ` +
            `${notReady.length} samples; EndpointSlice gaps ${gaps.length}; client failures ` +
            `${fails.length}; ${adds.length} ADDs of pods made meanwhile (longest successful ` +
            `${longest} ms), ${failed.length} of their calls failed ` +
            `${JSON.stringify(failed.map((c) => [c.verb, c.code]))}; failed plugin calls ` +
            `${JSON.stringify(phaseFailed.map((c) => [c.verb, c.code, c.pluginVersion ?? OLD]))}` +
            ` (${nFailed.length} of them N's); creation to Running ` +
            `${JSON.stringify(starts)} ms; FailedCreatePodSandBox ${sandbox.length} ` +
            `${JSON.stringify(sandbox.slice(0, 2).map((e) => e.message))}; deny loop ` +
            `${p.deny.probes} probes, ${p.deny.through} through ${JSON.stringify(p.deny.bySource)}`,
        );
        // The deny loop alive through the window: every stranger sent its batches.
        for (const st of strangers) {
          const made = p.deny.bySource[st.id] ?? 0;
          expect(
            made >= MIN_BATCHES * st.probes.length,
            `${p.what}: ${st.id} made ${made} deny probes, not ${MIN_BATCHES} batches`,
          );
        }
        expect(p.deny.through === 0, `${p.what}: ${p.deny.through} deny probes through`);
        expect(eniProblems(p.snap).length === 0, `${p.what}: ENIs ${eniProblems(p.snap)}`);
        expect(
          JSON.stringify(webEnis(p.snap)) === JSON.stringify(webEni0),
          `${p.what}: a web pod's ENI changed`,
        );
        // Into N, N's surge hands the node over with N's plugin installed before the old
        // agent stops: nothing fails, the Node stays Ready. Into 0.1.0 (its own manifests, no
        // surge), 0.1.0's plugin answers STATUS 50 and ADD 11 until its agent serves, which N
        // cannot change (docs/upgrading.md): measured and reported. N's own failures: none.
        const ours = p.into === "N";
        expect(nFailed.length === 0, `${p.what}: ${nFailed.length} of N's calls failed`);
        expect(
          !ours || phaseFailed.length === 0,
          `${p.what}: ${phaseFailed.length} plugin calls failed`,
        );
        expect(
          !ours || notReady.length === 0,
          `${p.what}: the Node not Ready ${notReady.length} samples`,
        );
        expect(gaps.length === 0, `${p.what}: ${gaps.length} EndpointSlice gaps`);
        expect(fails.length === 0, `${p.what}: ${fails.length} client failures`);
        expect(
          !ours || failed.length === 0,
          `${p.what}: ${failed.length} failed ADD/DEL calls`,
        );
        expect(
          !ours || sandbox.length === 0,
          `${p.what}: ${sandbox.length} FailedCreatePodSandBox`,
        );
        expect(adds.length >= CHURN, `${p.what}: ${adds.length} ADDs, not ${CHURN}`);
      }
      const statusNot0 = calls.filter((c) => c.verb === "STATUS" && c.code !== 0);

      say(
        `rollout: client: ${totals.sent} requests (${totals.ok} ok, ${totals.failed} failed) ` +
          `to ${Object.keys(totals.perTarget).length} targets; ${totals.held} connections held ` +
          `(${totals.echoes} echoes, ${totals.broken} broken)`,
      );
      say(
        `rollout: Node Ready: ${w.readySamples} samples, ${w.notReady.length} not True; ` +
          `timeline ${JSON.stringify(w.readyTimeline.map(([t, s]) => [secs(t), s]))}`,
      );
      say(
        `rollout: EndpointSlice: ${w.sliceSamples} samples of ${PODS} pods, ` +
          `${w.sliceGaps.length} gaps ${JSON.stringify(w.sliceGaps.slice(0, 10))}`,
      );
      say(
        `rollout: longest successful ADD of a pod made during a replacement ${longestAdd} ms; ` +
          `STATUS answers not 0 over the whole run (the install included) ${statusNot0.length}`,
      );
      say(
        `rollout: deny loop: ${loop.total} probes (${loop.batches} batches from ${STRANGERS} ` +
          `strangers) ${JSON.stringify(Object.fromEntries(loop.counts))}, ` +
          `${loop.breaches.length} through ${JSON.stringify(breachSummary(loop.breaches))}` +
          `${loop.errors.length ? `; prober errors ${JSON.stringify(loop.errors)}` : ""}`,
      );
      expect(loop.breaches.length === 0, `${loop.breaches.length} deny probes through`);
      expect(loop.errors.length === 0, `deny probers failed: ${loop.errors}`);
      expect(totals.failed === 0, `${totals.failed} requests failed`);
      expect(totals.broken === 0, `${totals.broken} connections broken`);
      expect(totals.held === PODS + 1, `${totals.held} connections held`);
      expect(totals.sent > 0 && totals.ok === totals.sent, "requests not all answered");

      // The agent truly gone (the DaemonSet deleted, no uninstall): the Node goes NotReady.
      const tDelete = performance.now();
      await cluster.admin.delete("/apis/apps/v1/namespaces/kube-system/daemonsets/enim-agent", {
        propagationPolicy: "Background",
      });
      await waitFor(
        "the agent's pod gone",
        async () => (await agentPods(cluster.admin)).length === 0 ? true : null,
        n,
        120_000,
      );
      const tGone = performance.now();
      await waitFor(
        "the Node NotReady without its agent",
        async () => {
          const nd = await cluster.admin.get(`/api/v1/nodes/${NODE}`, NodeSchema);
          return nd.status?.conditions?.find((c) => c.type === "Ready")?.status !== "True"
            ? true
            : null;
        },
        n,
        300_000,
      );
      const tNotReady = performance.now();
      say(
        `rollout: agent gone: its pod gone ${secs(tGone - tDelete)} after the DaemonSet's ` +
          `deletion; the Node NotReady ${secs(tNotReady - tGone)} after that ` +
          `(${secs(tNotReady - tDelete)} after the deletion)`,
      );
      assertEquals(problems, [], "what the rollouts broke");

      // Uninstall (issue 51 item 5) as docs/upgrading.md says, the DaemonSet deleted: the
      // shipped Job on this node, releasing its ENIs. Its pods are still there (not drained):
      // uninstall undoes their attachments as their DELs would.
      const job = await uninstallJob(NODE, NEW_IMAGE, "--release-enis");
      const tJob = performance.now();
      await applyManifests(cluster.admin, [job]);
      const finished = await waitFor(
        "the uninstall Job finished",
        async () => {
          const j = await cluster.admin.get(
            `/apis/batch/v1/namespaces/kube-system/jobs/${job.name}`,
            JobSchema,
          );
          return (j.status?.succeeded ?? 0) + (j.status?.failed ?? 0) > 0 ? j : null;
        },
        n,
        180_000,
      );
      const printed = await podLog(n, "kube-system", job.name, "uninstall");
      say(`rollout: uninstall Job done in ${secs(performance.now() - tJob)}:\n${printed}`);
      assertEquals(finished.status?.succeeded, 1, printed);
      for (const w of web) {
        assertStringIncludes(printed, `done      undo default/${w.metadata.name}'s attachment`);
      }
      assert(!/^failed/m.test(printed), printed);
      const gave = printed.split("\n").filter((l) => /^done\s+give eni-/.test(l)).length;
      assertEquals(gave, ENIS, `every ENI given back:\n${printed}`);
      const left = [
        "/opt/cni/bin/enim",
        "/opt/cni/bin/enim.d",
        "/etc/cni/net.d/10-enim.conflist",
        "/var/lib/enim/enim.db",
        "/run/enim/agent.json",
        "/run/enim/enim.sock",
      ].filter((f) => existsSync(n.host(f)));
      assertEquals(left, [], "what uninstall leaves on the node");
      assertEquals(
        await netSnapshot(vpc.node.name, { nft: "tables" }),
        bare,
        "the node's network after uninstall is what it was before enim",
      );
      say(
        `rollout: uninstall: ${web.length} web pods' attachments undone, ${gave} ENIs given ` +
          `back; the node's links, addresses, routes, rules and nftables tables as before enim`,
      );
      say(`rollout: wall time ${secs(now())}`);
    } finally {
      client?.kill();
      await denyLoop?.stop();
      for (const st of strangers) await st.prober.close().catch(() => {});
      await watcher?.stop();
      await node?.close();
      await vpc.close();
    }
  },
});
