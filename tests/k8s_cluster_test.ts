/**
 * enim against the real Kubernetes control plane (issue 43), built from its own Go modules
 * (tests/support/k8s/build.ts: kube-apiserver, kube-controller-manager, kube-scheduler of
 * the pinned release, or `ENIM_K8S_VERSION`'s; etcd v3.6): the components build once per
 * machine and start; everything in deploy/kubernetes/ applies with the server's own
 * validation; the admission policy gives ENI pods their `enim.dev/eni` request, and the
 * scheduler counts them against a Node's capacity; the shipped agent syncs pods,
 * namespaces and NetworkPolicies as the shipped RBAC's ServiceAccount, with a token
 * rotated (and the old one revoked) in its projected-volume file; a permission the RBAC
 * lacks keeps it from syncing; etcd's compaction and an API server restart give it the
 * 410s real clusters give, and it lists again.
 *
 * Without Go at /usr/local/go/bin/go, or without root, these tests skip and say why.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { isRoot } from "../scripts/_deps.ts";
import { ensureK8sBinaries, goMissing, K8S_COMMANDS } from "./support/k8s/build.ts";
import { KubeCluster } from "./support/k8s/cluster.ts";
import {
  applyManifests,
  FIELD_MANAGER,
  readManifests,
  waitEniPolicy,
} from "./support/k8s/manifests.ts";
import { PodSchema, SimulatedKubelet, type StoredPod } from "./support/k8s/kubelet.ts";
import { ClusterAgent } from "./support/k8s/agent.ts";
import { MetaSchema, StoredListSchema, StoredSchema } from "./support/k8s/rest.ts";
import type { PolicyStatus } from "../api/schema.ts";
import { z } from "zod";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { KUBE_PROXY_NEEDS } from "./support/kube_proxy.ts";
import { PolicyCluster, SERVICE_CIDRS } from "./support/policy_cluster.ts";
import { RealApi } from "./support/k8s/policy_api.ts";
import { passed } from "./support/prober.ts";

const SKIP = goMissing() ??
  (isRoot() ? null : "needs root (the agent runs in a private mount namespace)");
if (SKIP) console.error(`k8s_cluster_test: skipped: ${SKIP}`);

const NsSchema = StoredSchema.extend({
  status: z.optional(z.looseObject({ phase: z.optional(z.string()) })),
});

/** Applies a namespace with `labels` and waits for its default ServiceAccount. */
async function namespace(c: KubeCluster, name: string, labels: Record<string, string>) {
  await c.admin.apply(
    `/api/v1/namespaces/${name}`,
    {
      apiVersion: "v1",
      kind: "Namespace",
      metadata: { name, labels },
    },
    NsSchema,
    FIELD_MANAGER,
  );
  await c.waitServiceAccount(name, "default");
}

/** Creates a pod (one container per name in `containers`); returns what the server stored. */
function createPod(
  c: KubeCluster,
  ns: string,
  name: string,
  o: {
    containers?: {
      name: string;
      limits?: Record<string, string>;
      securityContext?: Record<string, unknown>;
    }[];
    hostNetwork?: boolean;
    nodeName?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    dryRun?: boolean;
  } = {},
) {
  const query = o.dryRun ? { dryRun: "All" } : undefined;
  // A dry run stores nothing: its answer has no resourceVersion.
  const schema = o.dryRun
    ? PodSchema.extend({ metadata: MetaSchema.partial({ resourceVersion: true }) })
    : PodSchema;
  return c.admin.create(
    `/api/v1/namespaces/${ns}/pods`,
    {
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name,
        labels: o.labels ?? { app: name },
        ...(o.annotations ? { annotations: o.annotations } : {}),
      },
      spec: {
        ...(o.nodeName ? { nodeName: o.nodeName } : {}),
        ...(o.hostNetwork ? { hostNetwork: true } : {}),
        containers: (o.containers ?? [{ name: "main" }]).map((x) => ({
          name: x.name,
          image: "registry.example.com/enim-test/app:1",
          ...(x.limits ? { resources: { limits: x.limits } } : {}),
          ...(x.securityContext ? { securityContext: x.securityContext } : {}),
        })),
      },
    },
    schema,
    query,
  ) as Promise<StoredPod>;
}

const eniLimits = (p: StoredPod) =>
  p.spec.containers.map((x) => x.resources?.limits?.["enim.dev/eni"] ?? null);

const cacheOf = (p: PolicyStatus, resource: string) => {
  const c = p.caches.find((x) => x.resource === resource);
  assert(c, `no ${resource} cache in ${JSON.stringify(p.caches)}`);
  return c;
};

/** How many objects of `path` the API server holds now. */
async function countOf(c: KubeCluster, path: string): Promise<number> {
  return ((await c.admin.get(path, StoredListSchema)).items ?? []).length;
}

/** Waits until the agent's status satisfies `ok`; fails with the last one. */
async function agentReaches(
  a: ClusterAgent,
  what: string,
  ok: (p: PolicyStatus) => boolean,
  timeoutMs = 90_000,
): Promise<PolicyStatus> {
  let last: PolicyStatus | undefined;
  const got = await poll(async () => {
    last = await a.policy();
    return ok(last) ? last : null;
  }, { timeoutMs, intervalMs: 200 });
  if (!got) {
    throw new Error(
      `The agent did not reach "${what}" in ${timeoutMs} ms: ${JSON.stringify(last)}\n${
        (await a.log()).slice(-6000)
      }`,
    );
  }
  return got;
}

Deno.test({
  name:
    "the real control plane: it builds and starts, the shipped manifests apply, the admission policy and the scheduler count ENIs, and the shipped agent syncs as its ServiceAccount through token rotation, missing permissions and 410s",
  ignore: SKIP !== null,
  async fn(t) {
    const t0 = performance.now();
    const bins = await ensureK8sBinaries();
    console.error(
      `k8s_cluster_test: components ${bins.built ? `built in ${bins.buildSeconds} s` : "cached"} ` +
        `(${((performance.now() - t0) / 1000).toFixed(1)} s here)`,
    );
    const c = await KubeCluster.start({ progress: (l) => console.error(l) });
    let agent: ClusterAgent | null = null;
    let policyApplied = 0;
    try {
      await t.step("each component runs the release asked for and says it is ready", async () => {
        const states = await c.states();
        assertEquals(
          states.map((s) => s.component).sort(),
          [
            "etcd",
            ...K8S_COMMANDS.filter((x) => x !== "kube-proxy"),
          ].sort(),
        );
        for (const s of states) {
          assert(s.ready.endsWith(": ok") || s.ready.includes('"health":"true"'), s.ready);
          const want = s.component === "etcd" ? bins.etcdVersion : `v${bins.version}`;
          assert(s.version.includes(want), `${s.component}: ${s.version}`);
        }
      });

      await t.step(
        "everything in deploy/kubernetes/ applies with the server's strict validation; Kyverno's policy and the PodMonitor only where their CRDs are installed",
        async () => {
          const docs = await readManifests(c.bins.version);
          const out = await applyManifests(c.admin, docs);
          policyApplied = performance.now();
          const applied = out.filter((o) => "applied" in o).map((o) =>
            `${o.doc.kind}/${o.doc.name}`
          );
          const skipped = out.filter((o) => "notServed" in o).map((o) =>
            `${o.doc.kind}/${o.doc.name}`
          );
          // Kyverno's and the Prometheus Operator's kinds, whose CRDs this cluster lacks.
          assertEquals(skipped, ["ClusterPolicy/enim-eni-request", "PodMonitor/enim-agent"]);
          for (
            const want of [
              "ServiceAccount/enim-agent",
              "ClusterRole/enim-agent",
              "ClusterRoleBinding/enim-agent",
              "DaemonSet/enim-agent",
              "ConfigMap/enim-cni-config",
              "ConfigMap/enim-agent-config",
              "MutatingAdmissionPolicy/enim-eni-request",
              "MutatingAdmissionPolicyBinding/enim-eni-request",
              "ValidatingAdmissionPolicy/enim-raw-capabilities",
              "ValidatingAdmissionPolicyBinding/enim-raw-capabilities",
            ]
          ) assert(applied.includes(want), `${want} in ${applied}`);
          // Applying again changes nothing (the manifests are what the server keeps).
          const again = await applyManifests(c.admin, docs);
          for (const [i, o] of again.entries()) {
            const before = out[i];
            if (!("applied" in o) || !("applied" in before)) continue;
            assertEquals(
              o.applied.metadata.resourceVersion,
              before.applied.metadata.resourceVersion,
              `${o.doc.kind}/${o.doc.name} changed on a second apply`,
            );
          }
        },
      );

      await t.step(
        "the admission policy gives the first container of a new pod in a labelled namespace `enim.dev/eni: 1`, and leaves hostNetwork pods, pods that ask already and other namespaces alone",
        async () => {
          // (Its pods keep the runtime's default NET_RAW: out of raw-capabilities-policy.yaml.)
          await namespace(c, "eni-apps", {
            "enim.dev/eni-pods": "true",
            "enim.dev/raw-sockets": "allow",
          });
          await namespace(c, "plain", {});
          // The API server runs a policy once its own watch has loaded it, a moment after
          // it is stored: until then pods are admitted without the request.
          const waited = await waitEniPolicy(c.admin, "eni-apps");
          console.error(
            `k8s_cluster_test: the admission policy acted ${waited} ms after the namespace was there (${
              Math.round(performance.now() - policyApplied)
            } ms after it was applied)`,
          );
          const one = await createPod(c, "eni-apps", "one");
          assertEquals(eniLimits(one), ["1"]);
          // The server defaults requests to limits for a resource that has only a limit.
          assertEquals(one.spec.containers[0].resources?.requests?.["enim.dev/eni"], "1");
          const two = await createPod(c, "eni-apps", "two", {
            containers: [{ name: "app", limits: { memory: "64Mi" } }, { name: "sidecar" }],
          });
          assertEquals(eniLimits(two), ["1", null]);
          assertEquals(two.spec.containers[0].resources?.limits?.memory, "64Mi");
          const host = await createPod(c, "eni-apps", "host", { hostNetwork: true });
          assertEquals(eniLimits(host), [null]);
          const asks = await createPod(c, "eni-apps", "asks", {
            containers: [{ name: "app" }, { name: "net", limits: { "enim.dev/eni": "1" } }],
          });
          assertEquals(eniLimits(asks), [null, "1"]);
          const other = await createPod(c, "plain", "other");
          assertEquals(eniLimits(other), [null]);
        },
      );

      await t.step(
        "the raw-capabilities policy refuses an ENI pod keeping NET_RAW or NET_ADMIN (issue 48), and admits one dropping NET_RAW, one annotated enim.dev/raw-sockets: allow, and any pod of a namespace labelled so",
        async () => {
          await namespace(c, "raw-apps", { "enim.dev/eni-pods": "true" });
          await namespace(c, "raw-allowed", {
            "enim.dev/eni-pods": "true",
            "enim.dev/raw-sockets": "allow",
          });
          /** A dry-run pod's refusal (its message), or null when it is admitted. */
          const refusal = async (
            ns: string,
            containers: { name: string; securityContext?: Record<string, unknown> }[],
            annotations?: Record<string, string>,
          ) => {
            try {
              await createPod(c, ns, "raw-probe", { containers, annotations, dryRun: true });
              return null;
            } catch (err) {
              return String(err);
            }
          };
          const dropsRaw = { capabilities: { drop: ["NET_RAW"] } };
          // The API server runs a new policy a moment after it is stored (as above).
          const refused = await poll(
            () => refusal("raw-apps", [{ name: "main" }]),
            { timeoutMs: 30_000, intervalMs: 100 },
          );
          assert(refused?.includes("keep NET_RAW or NET_ADMIN"), String(refused));
          assert(refused?.includes("main"), String(refused));
          assertEquals(
            await refusal("raw-apps", [{ name: "main", securityContext: dropsRaw }]),
            null,
          );
          const admin = await refusal("raw-apps", [{
            name: "main",
            securityContext: { capabilities: { drop: ["NET_RAW"], add: ["NET_ADMIN"] } },
          }]);
          assert(admin?.includes("keep NET_RAW or NET_ADMIN"), String(admin));
          const privileged = await refusal("raw-apps", [{
            name: "main",
            securityContext: { ...dropsRaw, privileged: true },
          }]);
          assert(privileged !== null, "a privileged container is refused");
          const sidecar = await refusal("raw-apps", [
            { name: "main", securityContext: dropsRaw },
            { name: "sidecar" },
          ]);
          assert(sidecar?.includes("sidecar"), String(sidecar));
          assertEquals(
            await refusal("raw-apps", [{ name: "main" }], { "enim.dev/raw-sockets": "allow" }),
            null,
          );
          assertEquals(await refusal("raw-allowed", [{ name: "main" }]), null);
        },
      );

      await t.step(
        "a Node registered as kubelet registers it, with enim.dev/eni 2, gets two ENI pods from the scheduler; the third stays Pending for want of an ENI",
        async () => {
          const k = await SimulatedKubelet.of(c, "sched-node");
          try {
            const node = await k.register({ addresses: ["10.98.0.250"], enis: 2 });
            assertEquals(node.status?.capacity?.["enim.dev/eni"], "2");
            assertEquals(node.spec.taints ?? [], []);
            await namespace(c, "sched", {
              "enim.dev/eni-pods": "true",
              "enim.dev/raw-sockets": "allow",
            });
            for (const n of ["p1", "p2", "p3"]) await createPod(c, "sched", n);
            const placed = await poll(async () => {
              const pods = await Promise.all(["p1", "p2", "p3"].map((n) => k.pod("sched", n)));
              const bound = pods.filter((p) => p.spec.nodeName === "sched-node");
              const waiting = pods.filter((p) =>
                p.status?.conditions?.some((x) =>
                  x.type === "PodScheduled" && x.status === "False" && x.reason === "Unschedulable"
                )
              );
              return bound.length === 2 && waiting.length === 1 ? waiting[0] : null;
            }, { timeoutMs: 60_000, intervalMs: 200 });
            assert(placed, "two pods bound and one unschedulable");
            const msg = String(
              placed.status?.conditions?.find((x) => x.type === "PodScheduled")?.message,
            );
            assert(msg.includes("Insufficient enim.dev/eni"), msg);
          } finally {
            k.close();
          }
        },
      );

      // The node the agent runs on, and a pod of its own.
      const kubelet = await SimulatedKubelet.of(c, "node-a");
      try {
        await kubelet.register({ addresses: ["10.99.0.250"], enis: 4 });
        await namespace(c, "alpha", { team: "a" });
        await createPod(c, "alpha", "web", { nodeName: "node-a" });
        await kubelet.starting("alpha", "web");
        await kubelet.running("alpha", "web", ["10.99.0.11"]);
        await c.admin.apply(
          "/apis/networking.k8s.io/v1/namespaces/alpha/networkpolicies/deny",
          {
            apiVersion: "networking.k8s.io/v1",
            kind: "NetworkPolicy",
            metadata: { name: "deny", namespace: "alpha" },
            spec: { podSelector: {} },
          },
          StoredSchema,
          FIELD_MANAGER,
        );

        await t.step(
          "the agent syncs every pod, namespace and NetworkPolicy as kube-system/enim-agent with the shipped RBAC, through a YAML kubeconfig with tokenFile",
          async () => {
            agent = await ClusterAgent.start(c, { nodeName: "node-a" });
            const pods = await countOf(c, "/api/v1/pods");
            const nss = await countOf(c, "/api/v1/namespaces");
            const nps = await countOf(c, "/apis/networking.k8s.io/v1/networkpolicies");
            const p = await agentReaches(agent, "synced", (s) =>
              s.synced &&
              cacheOf(s, "pods").objects === pods && cacheOf(s, "namespaces").objects === nss &&
              cacheOf(s, "networkpolicies").objects === nps);
            for (const x of p.caches) assertEquals([x.resource, x.errors], [x.resource, 0]);
            const log = await agent.log();
            assert(!/Forbidden|Unauthorized/.test(log), log.slice(-3000));
            // Every object the real server sent parsed through the agent's schemas.
            assert(!/malformed/.test(log), log.slice(-3000));
          },
        );

        await t.step(
          "a token rotated in the file (the old one revoked) is read again: the agent keeps syncing",
          async () => {
            const a = agent!;
            const old = a.token.issued.at(-1)!;
            for (let round = 1; round <= 2; round++) {
              await a.token.rotate();
              assert(
                await poll(async () => !(await a.token.accepted(old.token)) || null, {
                  timeoutMs: 30_000,
                  intervalMs: 200,
                }),
                "the old token is refused",
              );
              const name = `after-rotation-${round}`;
              await c.admin.apply(
                `/apis/networking.k8s.io/v1/namespaces/alpha/networkpolicies/${name}`,
                {
                  apiVersion: "networking.k8s.io/v1",
                  kind: "NetworkPolicy",
                  metadata: { name, namespace: "alpha" },
                  spec: { podSelector: { matchLabels: { app: "web" } }, policyTypes: ["Egress"] },
                },
                StoredSchema,
                FIELD_MANAGER,
              );
              const want = await countOf(c, "/apis/networking.k8s.io/v1/networkpolicies");
              // Watches end every 10–20 s: each new one authenticates with the file's token.
              await agentReaches(
                a,
                `${want} NetworkPolicies after rotation ${round}`,
                (s) => cacheOf(s, "networkpolicies").objects === want,
              );
            }
          },
        );

        await t.step(
          "a ClusterRole one verb short shows: without `list` of NetworkPolicies the agent never syncs; without `watch` of namespaces every watch is refused and its status says Forbidden",
          async () => {
            const role = "/apis/rbac.authorization.k8s.io/v1/clusterroles/enim-agent";
            const shipped = await c.admin.get(
              role,
              StoredSchema.extend({
                rules: z.array(z.looseObject({
                  apiGroups: z.array(z.string()),
                  resources: z.array(z.string()),
                  verbs: z.array(z.string()),
                })),
              }),
            );
            const without = async (resource: string, verb: string) => {
              await c.admin.apply(
                role,
                {
                  apiVersion: "rbac.authorization.k8s.io/v1",
                  kind: "ClusterRole",
                  metadata: { name: "enim-agent" },
                  rules: shipped.rules.map((r) =>
                    r.resources.includes(resource)
                      ? { ...r, verbs: r.verbs.filter((v) => v !== verb) }
                      : r
                  ),
                },
                StoredSchema,
                FIELD_MANAGER,
              );
              // RBAC takes effect when the API server's own cache of roles has the change.
              const review = await poll(async () => {
                const r = await c.admin.create(
                  "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                  {
                    apiVersion: "authorization.k8s.io/v1",
                    kind: "SubjectAccessReview",
                    spec: {
                      user: "system:serviceaccount:kube-system:enim-agent",
                      groups: ["system:serviceaccounts", "system:authenticated"],
                      resourceAttributes: {
                        verb,
                        resource,
                        group: resource === "networkpolicies" ? "networking.k8s.io" : "",
                      },
                    },
                  },
                  z.looseObject({ status: z.looseObject({ allowed: z.boolean() }) }),
                );
                return r.status.allowed ? null : true;
              }, { timeoutMs: 30_000, intervalMs: 100 });
              assert(review, `${verb} ${resource} is still allowed`);
            };
            try {
              await without("networkpolicies", "list");
              const b = await ClusterAgent.start(c, { nodeName: "node-a" });
              try {
                const s = await agentReaches(b, "a Forbidden NetworkPolicy list", (p) => {
                  const np = cacheOf(p, "networkpolicies");
                  return np.errors > 0 && /403 Forbidden/.test(np.lastError ?? "");
                });
                assertEquals(s.synced, false, "without list the agent is not synced");
                assertEquals(cacheOf(s, "networkpolicies").synced, false);
              } finally {
                await b.close();
              }
              await without("namespaces", "watch");
              const d = await ClusterAgent.start(c, { nodeName: "node-a" });
              try {
                const s = await agentReaches(d, "a Forbidden namespaces watch", (p) => {
                  const ns = cacheOf(p, "namespaces");
                  return ns.errors > 1 && /403 Forbidden/.test(ns.lastError ?? "");
                });
                // Listed once, it stays synced on what it listed, and says why it is stale.
                assertEquals(cacheOf(s, "namespaces").synced, true);
                assert(/403/.test(await d.log()), "the agent logs the 403");
              } finally {
                await d.close();
              }
            } finally {
              await applyManifests(
                c.admin,
                (await readManifests(c.bins.version)).filter((d) => d.file === "rbac.yaml"),
              );
            }
          },
        );

        await t.step(
          "etcd compacted behind the agent's watches: it goes on watching from the watch cache, no list again",
          async () => {
            const a = agent!;
            const before = await a.policy();
            await a.relay.down();
            let last = 0;
            for (let i = 0; i < 5; i++) {
              const ns = await c.admin.patch(
                "/api/v1/namespaces/alpha",
                { metadata: { labels: { round: String(i) } } },
                NsSchema,
                "merge",
              );
              last = Number(ns.metadata.resourceVersion);
            }
            const rev = await c.compactEtcd();
            assert(rev >= last, `compacted at ${rev}, after the last change ${last}`);
            a.relay.up();
            const p = await agentReaches(
              a,
              "the compacted changes",
              (s) =>
                Number(cacheOf(s, "namespaces").enforcedResourceVersion ?? 0) >= last &&
                cacheOf(s, "namespaces").watchRestarts >
                  cacheOf(before, "namespaces").watchRestarts,
            );
            assertEquals(cacheOf(p, "namespaces").relists, cacheOf(before, "namespaces").relists);
          },
        );

        await t.step(
          "etcd compacted and kube-apiserver restarted behind the agent's watches: 410, and it lists again",
          async () => {
            const a = agent!;
            const before = await a.policy();
            await a.relay.down();
            await c.admin.apply(
              "/apis/networking.k8s.io/v1/namespaces/alpha/networkpolicies/while-away",
              {
                apiVersion: "networking.k8s.io/v1",
                kind: "NetworkPolicy",
                metadata: { name: "while-away", namespace: "alpha" },
                spec: { podSelector: {}, policyTypes: ["Ingress"] },
              },
              StoredSchema,
              FIELD_MANAGER,
            );
            await c.compactAsApiserver();
            await c.restartApiserver();
            a.relay.up();
            const want = await countOf(c, "/apis/networking.k8s.io/v1/networkpolicies");
            // Every cache watched from before the restart: each is answered 410 and lists
            // again (each after its own backoff from the time the relay was down).
            await agentReaches(
              a,
              "a relist of every cache after 410",
              (s) =>
                ["pods", "namespaces", "networkpolicies"].every((r) =>
                  cacheOf(s, r).relists > cacheOf(before, r).relists
                ) && cacheOf(s, "networkpolicies").objects === want && s.synced,
            );
            const log = await a.log();
            assert(/resourceVersion is gone/.test(log), "the agent logged the 410");
          },
        );
      } finally {
        kubelet.close();
      }
    } catch (err) {
      if (agent) console.error((await (agent as ClusterAgent).log()).slice(-8000));
      for (const comp of ["kube-apiserver", "kube-controller-manager"] as const) {
        console.error(`--- ${comp}:\n${(await c.log(comp)).slice(-3000)}`);
      }
      throw err;
    } finally {
      await (agent as ClusterAgent | null)?.close();
      await c.stop();
    }
  },
});

const NetworkPolicyStoredSchema = StoredSchema.extend({
  spec: z.looseObject({
    policyTypes: z.array(z.string()),
    ingress: z.optional(z.array(z.looseObject({
      ports: z.optional(z.array(z.looseObject({
        protocol: z.string(),
        port: z.optional(z.union([z.number(), z.string()])),
      }))),
    }))),
  }),
});

const NET_DEPS = SKIP === null
  ? await clientDeps("k8s_cluster_test", [...TRAFFIC_NEEDS, ...KUBE_PROXY_NEEDS])
  : { skip: SKIP };

Deno.test({
  name:
    "on the real kernel, a NetworkPolicy as the real API server stores it (protocol and policyTypes defaulted) is what the agent enforces",
  ignore: SKIP !== null || NET_DEPS.skip !== null,
  async fn(t) {
    const c = await PolicyCluster.start(
      await RealApi.start({ serviceCidrs: [SERVICE_CIDRS.ipv4, SERVICE_CIDRS.ipv6] }),
    );
    try {
      c.namespace("alpha", { team: "a" });
      const a = await c.node("node-a", { nodeNic: true, mock: { enis: 4 } });
      const web = await c.pod(a, "node-a", "alpha", "web", { app: "web" }, []);
      const job = await c.pod(a, "node-a", "alpha", "job", { app: "job" }, [
        { name: "dns", containerPort: 53, protocol: "UDP" },
      ]);
      // Written as users write it: no protocol, no policyTypes.
      c.put("networkpolicies", {
        metadata: { namespace: "alpha", name: "job" },
        spec: {
          podSelector: { matchLabels: { app: "job" } },
          ingress: [{ ports: [{ port: 53 }] }],
        },
      });
      await c.settle();
      const api = c.api as RealApi;
      const stored = await api.cluster.admin.get(
        "/apis/networking.k8s.io/v1/namespaces/alpha/networkpolicies/job",
        NetworkPolicyStoredSchema,
      );
      await t.step("the server stored the defaults: TCP, and policyTypes [Ingress]", () => {
        assertEquals(stored.spec.policyTypes, ["Ingress"]);
        assertEquals(stored.spec.ingress?.[0].ports, [{ protocol: "TCP", port: 53 }]);
      });
      await t.step("the agent's view of the pod is that policy: TCP 53 only", async () => {
        const view = await a.client.policy("alpha/job");
        assertEquals(view.ingress.isolated, true);
        assertEquals(view.egress.isolated, false);
        assertEquals(view.ingress.rules.map((r) => r.ports), [["TCP 53"]]);
      });
      await t.step(
        "UDP 53 is dropped, TCP 53 reaches the pod (a reset: nothing listens)",
        async () => {
          const probe = (proto: "tcp" | "udp") =>
            web.prober.probe([{ proto, addr: job.v4, port: 53 }], 2_000);
          let udp = await probe("udp");
          if (passed(udp[0])) udp = await probe("udp");
          assertEquals(udp, ["timeout"]);
          let tcp = await probe("tcp");
          if (!passed(tcp[0])) tcp = await probe("tcp");
          assertEquals(tcp, ["refused"]);
        },
      );
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});
