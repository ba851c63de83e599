/**
 * `deno task cluster`: the real Kubernetes control plane on this machine, with enim's agent
 * against it. Builds (or finds in the cache) etcd, kube-apiserver, kube-controller-manager
 * and kube-scheduler (tests/support/k8s/build.ts; `ENIM_K8S_VERSION` picks the release),
 * starts them on 127.0.0.1, prints each one's version and readiness, applies everything in
 * deploy/kubernetes/ (the RBAC, the DaemonSet, the ConfigMaps, the admission policy),
 * registers a Node as kubelet would, creates pods (showing the `enim.dev/eni` request the
 * admission policy gave them) and a NetworkPolicy, starts the agent (the built bundle, fake
 * devices, the mock provider) as the ServiceAccount of deploy/kubernetes/rbac.yaml through
 * a YAML kubeconfig with a TokenRequest token, prints what it synced (`enim status --json`),
 * rotates its token, stops everything and exits 0 (1 when a step failed, 2 when it cannot
 * run here).
 *
 * @module
 */
import { isRoot } from "./_deps.ts";
import { goMissing } from "../tests/support/k8s/build.ts";
import { KubeCluster } from "../tests/support/k8s/cluster.ts";
import { applyManifests, readManifests } from "../tests/support/k8s/manifests.ts";
import { PodSchema, SimulatedKubelet } from "../tests/support/k8s/kubelet.ts";
import { ClusterAgent } from "../tests/support/k8s/agent.ts";
import { FIELD_MANAGER, waitEniPolicy } from "../tests/support/k8s/manifests.ts";
import { StoredListSchema, StoredSchema } from "../tests/support/k8s/rest.ts";
import { runEnim } from "../tests/support/enim.ts";
import { StatusSchema } from "../api/schema.ts";

const out = (s = "") => console.log(s);
let failures = 0;
const step = (pass: boolean, text: string) => {
  if (!pass) failures++;
  out(`  ${pass ? "ok  " : "FAIL"} ${text}`);
};

if (!isRoot()) {
  console.error("deno task cluster runs the agent in a private mount namespace: run it as root.");
  Deno.exit(2);
}
const missing = goMissing();
if (missing) {
  console.error(`deno task cluster builds the Kubernetes components with Go: ${missing}.`);
  Deno.exit(2);
}

const NODE = "enim-node-1";
const t0 = performance.now();
const since = () => `${((performance.now() - t0) / 1000).toFixed(1)} s`;
const cluster = await KubeCluster.start({ progress: (l) => console.error(l) });
let agent: ClusterAgent | null = null;
try {
  out(
    `The control plane (Kubernetes v${cluster.bins.version}, built ${
      cluster.bins.built ? `now in ${cluster.bins.buildSeconds} s` : "earlier"
    }; ready at ${since()}):`,
  );
  for (const s of await cluster.states()) {
    out(`  ${s.component.padEnd(24)} ${s.version}`);
    out(`  ${"".padEnd(24)} pid ${s.pid}, ${s.ready}`);
  }

  out("\ndeploy/kubernetes/, server-side applied (strict field validation):");
  for (const r of await applyManifests(cluster.admin, await readManifests(cluster.bins.version))) {
    const what = `${r.doc.file}: ${r.doc.kind} ${
      r.doc.namespace ? `${r.doc.namespace}/` : ""
    }${r.doc.name}`;
    if ("applied" in r) {
      step(
        true,
        `${what} (${r.applied.apiVersion}, resourceVersion ${r.applied.metadata.resourceVersion})`,
      );
    } else out(`  --   ${what}: not applied, ${r.notServed}`);
  }

  out(`\nNode ${NODE}, registered as kubelet registers it:`);
  const kubelet = await SimulatedKubelet.of(cluster, NODE);
  const node = await kubelet.register({ addresses: ["10.99.0.250"], enis: 4 });
  step(
    node.status?.capacity?.["enim.dev/eni"] === "4",
    `capacity enim.dev/eni ${node.status?.capacity?.["enim.dev/eni"]}, ` +
      `Ready ${node.status?.conditions?.find((c) => c.type === "Ready")?.status}`,
  );

  out("\nPods (namespace demo, labelled enim.dev/eni-pods=true):");
  await cluster.admin.apply(
    "/api/v1/namespaces/demo",
    {
      apiVersion: "v1",
      kind: "Namespace",
      metadata: { name: "demo", labels: { "enim.dev/eni-pods": "true", team: "demo" } },
    },
    StoredSchema,
    FIELD_MANAGER,
  );
  await cluster.waitServiceAccount("demo", "default");
  const waited = await waitEniPolicy(cluster.admin, "demo");
  out(`  (the admission policy acted ${waited} ms after the namespace was there: a new policy`);
  out("   runs once the API server's own watch has it)");
  const ips: Record<string, string> = { web: "10.99.0.11", db: "10.99.0.12" };
  for (const [app, ip] of Object.entries(ips)) {
    const pod = await cluster.admin.create("/api/v1/namespaces/demo/pods", {
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: app, labels: { app } },
      spec: {
        containers: [{
          name: app,
          image: "registry.example.com/demo:1",
          ports: [{ name: "http", containerPort: 8080 }],
          // An ENI pod drops NET_RAW (raw-capabilities-policy.yaml refuses it otherwise).
          securityContext: { capabilities: { drop: ["NET_RAW"] } },
        }],
      },
    }, PodSchema);
    const limit = pod.spec.containers[0].resources?.limits?.["enim.dev/eni"];
    step(limit === "1", `demo/${app}: the admission policy set limits enim.dev/eni=${limit}`);
    let bound = pod.spec.nodeName;
    for (let i = 0; i < 300 && !bound; i++) {
      await new Promise((r) => setTimeout(r, 100));
      bound = (await kubelet.pod("demo", app)).spec.nodeName;
    }
    step(bound === NODE, `demo/${app}: the scheduler bound it to ${bound}`);
    await kubelet.starting("demo", app);
    await kubelet.running("demo", app, [ip]);
  }
  await cluster.admin.apply(
    "/apis/networking.k8s.io/v1/namespaces/demo/networkpolicies/db",
    {
      apiVersion: "networking.k8s.io/v1",
      kind: "NetworkPolicy",
      metadata: { name: "db", namespace: "demo" },
      spec: {
        podSelector: { matchLabels: { app: "db" } },
        ingress: [{
          from: [{ podSelector: { matchLabels: { app: "web" } } }],
          ports: [{ port: 5432 }],
        }],
      },
    },
    StoredSchema,
    FIELD_MANAGER,
  );

  out("\nThe agent (the bundle, fake devices, the mock provider) as kube-system/enim-agent:");
  agent = await ClusterAgent.start(cluster, { nodeName: NODE });
  const a = agent;
  const synced = async (want: (s: Awaited<ReturnType<typeof a.policy>>) => boolean) => {
    for (let i = 0; i < 600; i++) {
      const p = await a.policy();
      if (p.synced && want(p)) return p;
      await new Promise((r) => setTimeout(r, 100));
    }
    return await a.policy();
  };
  const count = (p: Awaited<ReturnType<typeof a.policy>>, r: string) =>
    p.caches.find((c) => c.resource === r)?.objects ?? -1;
  const pods = (await cluster.admin.get("/api/v1/pods", StoredListSchema)).items ?? [];
  const namespaces = (await cluster.admin.get("/api/v1/namespaces", StoredListSchema)).items ?? [];
  const p = await synced((s) => count(s, "networkpolicies") === 1);
  step(p.synced, "synced with the API server");
  step(count(p, "pods") === pods.length, `pods: ${count(p, "pods")} (the API: ${pods.length})`);
  step(
    count(p, "namespaces") === namespaces.length,
    `namespaces: ${count(p, "namespaces")} (the API: ${namespaces.length})`,
  );
  step(count(p, "networkpolicies") === 1, `networkpolicies: ${count(p, "networkpolicies")}`);

  out("\nenim status --json (its policy section):");
  const st = await runEnim(["status", "--json"], { sandbox: a.sandbox });
  step(st.code === 0, `enim status exit ${st.code}`);
  const status = StatusSchema.parse(JSON.parse(st.stdout));
  for (const c of status.policy?.caches ?? []) {
    out(
      `  ${
        c.resource.padEnd(16)
      } synced ${c.synced}, ${c.objects} objects, relists ${c.relists}, ` +
        `errors ${c.errors}, enforced resourceVersion ${c.enforcedResourceVersion ?? "-"}`,
    );
  }

  out("\nThe token rotated (the old one revoked), then a second NetworkPolicy:");
  const old = a.token.issued.at(-1)!;
  await a.token.rotate();
  let revoked = false;
  for (let i = 0; i < 300 && !revoked; i++) {
    revoked = !(await a.token.accepted(old.token));
    if (!revoked) await new Promise((r) => setTimeout(r, 100));
  }
  step(revoked, "the API server refuses the old token");
  await cluster.admin.apply(
    "/apis/networking.k8s.io/v1/namespaces/demo/networkpolicies/web",
    {
      apiVersion: "networking.k8s.io/v1",
      kind: "NetworkPolicy",
      metadata: { name: "web", namespace: "demo" },
      spec: { podSelector: { matchLabels: { app: "web" } }, policyTypes: ["Egress"] },
    },
    StoredSchema,
    FIELD_MANAGER,
  );
  const p2 = await synced((s) => count(s, "networkpolicies") === 2);
  step(
    count(p2, "networkpolicies") === 2,
    `the agent read the new token and sees ${count(p2, "networkpolicies")} NetworkPolicies`,
  );
} catch (err) {
  failures++;
  console.error(err);
  if (agent) console.error(await agent.log());
} finally {
  await agent?.close().catch(() => {});
  await cluster.stop();
  out(
    `\n${
      failures === 0 ? "ok" : `${failures} step(s) failed`
    }: everything stopped after ${since()}`,
  );
}

Deno.exit(failures === 0 ? 0 : 1);
