/**
 * What the compiler costs at cluster scale (not asserted anywhere): 30,000 pods in 100
 * namespaces, 3,000 NetworkPolicies (30 a namespace, each with pod, namespace+pod,
 * ipBlock and named-port peers, both directions), 50 local pods on the node.
 *
 * - a full compile: index the cluster, compile the 50 local pods (their sets filled);
 * - one pod's label change elsewhere in the cluster (set deltas only);
 * - one local pod's label change (its rules compiled again);
 * - one namespace's label change (namespace-selector sets);
 * - one policy's change (its namespace's local pods compiled again);
 * - one local pod's compiled policy (its sets' members, sorted);
 * - rendering: one pod's ruleset, and the node's for all 50.
 *
 * `deno bench -A --config tests/deno.json bench/policy_compile_bench.ts`
 *
 * @module
 */
import {
  type Namespace,
  NamespaceSchema,
  type NetworkPolicy,
  NetworkPolicySchema,
  type Pod,
  PodSchema,
} from "../kube/objects.ts";
import { type LocalPod, PolicyEngine, type PolicyView } from "../policy/compile.ts";
import { nodeRuleset, podRuleset } from "../policy/nft.ts";

const NAMESPACES = 100, PODS_PER_NS = 300, POLICIES_PER_NS = 30, LOCALS = 50, APPS = 30;

function pod(ns: number, j: number, labels?: Record<string, string>): Pod {
  return PodSchema.parse({
    metadata: {
      name: `pod-${j}`,
      namespace: `ns-${ns}`,
      labels: labels ??
        { app: `app-${j % APPS}`, tier: ["front", "back", "data"][j % 3], version: `v${j % 5}` },
    },
    spec: {
      nodeName: `node-${(ns * PODS_PER_NS + j) % 600}`,
      containers: [{
        ports: [{ name: "http", containerPort: 8000 + (j % APPS) }, {
          name: "metrics",
          containerPort: 9100,
        }],
      }],
    },
    status: {
      phase: "Running",
      podIPs: [{ ip: `10.${ns}.${j >> 8}.${j & 255}` }, { ip: `fd00::${ns}:${j}` }],
    },
  });
}

function namespace(ns: number, labels?: Record<string, string>): Namespace {
  return NamespaceSchema.parse({
    metadata: {
      name: `ns-${ns}`,
      labels: labels ?? {
        "kubernetes.io/metadata.name": `ns-${ns}`,
        team: `t${ns % 10}`,
        env: ns % 3 === 0 ? "prod" : "dev",
      },
    },
  });
}

function policy(ns: number, k: number, extraPort = 0): NetworkPolicy {
  const app = (n: number) => ({ matchLabels: { app: `app-${n % APPS}` } });
  return NetworkPolicySchema.parse({
    metadata: { name: `pol-${k}`, namespace: `ns-${ns}` },
    spec: {
      podSelector: app(k),
      policyTypes: ["Ingress", "Egress"],
      ingress: [
        {
          from: [
            { podSelector: app(k + 1) },
            {
              namespaceSelector: { matchLabels: { team: `t${k % 10}` } },
              podSelector: { matchLabels: { tier: "front" } },
            },
          ],
          ports: [{ port: "http" }, { port: 9100 }, ...(extraPort ? [{ port: extraPort }] : [])],
        },
        { from: [{ ipBlock: { cidr: "10.200.0.0/16", except: ["10.200.1.0/24"] } }] },
      ],
      egress: [
        { to: [{ podSelector: { matchLabels: { tier: "data" } } }], ports: [{ port: 5432 }] },
        {
          to: [{
            namespaceSelector: { matchLabels: { env: "prod" } },
            podSelector: {
              matchExpressions: [{ key: "app", operator: "In", values: [`app-${(k + 2) % APPS}`] }],
            },
          }],
          ports: [{ port: "http" }],
        },
        { ports: [{ protocol: "UDP", port: 53 }] },
      ],
    },
  });
}

const pods: Pod[] = [];
for (let ns = 0; ns < NAMESPACES; ns++) {
  for (let j = 0; j < PODS_PER_NS; j++) pods.push(pod(ns, j));
}
const namespaces = Array.from({ length: NAMESPACES }, (_, ns) => namespace(ns));
const policies: NetworkPolicy[] = [];
for (let ns = 0; ns < NAMESPACES; ns++) {
  for (let k = 0; k < POLICIES_PER_NS; k++) policies.push(policy(ns, k));
}
const view: PolicyView = {
  pods: () => pods,
  namespaces: () => namespaces,
  networkPolicies: () => policies,
};
// One local pod in each of the first 50 namespaces.
const locals: LocalPod[] = Array.from({ length: LOCALS }, (_, i) => ({
  namespace: `ns-${i}`,
  name: `pod-${i}`,
  ips: pods[i * PODS_PER_NS + i].ips,
}));
const NODE = { nodeAddresses: ["10.250.0.1"] };

function fullCompile(): PolicyEngine {
  const engine = new PolicyEngine(view, NODE);
  for (const l of locals) engine.addLocal(l);
  return engine;
}

const engine = fullCompile();
let flip = 0;

Deno.bench("full compile: index 30,000 pods, 3,000 policies; compile 50 local pods", {
  n: 5,
  warmup: 1,
}, () => {
  fullCompile();
});

Deno.bench("a remote pod's label change (set deltas)", { n: 2000, warmup: 100 }, () => {
  const i = 60 + (flip++ % 200);
  const tier = flip % 2 ? "front" : "data";
  engine.upsertPod(pod(i % NAMESPACES, i, { app: `app-${i % APPS}`, tier, version: "v0" }));
});

Deno.bench("a local pod's label change (its rules compiled again)", { n: 500, warmup: 20 }, () => {
  const i = flip++ % LOCALS;
  const app = `app-${(i + (flip % 2)) % APPS}`;
  engine.upsertPod(pod(i, i, { app, tier: "front", version: "v0" }));
});

Deno.bench("a namespace's label change (namespace-selector sets)", {
  n: 200,
  warmup: 10,
}, () => {
  const ns = 70 + (flip++ % 20);
  engine.upsertNamespace(namespace(ns, { team: flip % 2 ? "t1" : "t2", env: "prod" }));
});

Deno.bench("a policy's change (its namespace's local pods compiled again)", {
  n: 500,
  warmup: 20,
}, () => {
  const ns = flip++ % LOCALS;
  engine.upsertPolicy(policy(ns, ns % APPS, flip % 2 ? 7000 : 0));
});

const compiled = locals.map((l) => engine.compiled(l.namespace, l.name)!);

Deno.bench("one local pod's compiled policy, with its sets' members sorted", {
  n: 500,
  warmup: 20,
}, () => {
  engine.compiled(locals[0].namespace, locals[0].name);
});

Deno.bench("render one pod's ruleset", { n: 500, warmup: 20 }, () => {
  podRuleset(compiled[0], { eni: "eth0" });
});

Deno.bench("render the node's ruleset for 50 pods", { n: 50, warmup: 5 }, () => {
  nodeRuleset(compiled.map((c, i) => ({ nodeEnd: `enimh${i}`, policy: c })), {
    node: { ipv4: ["10.250.0.1"], ipv6: [] },
  });
});

const sizes = compiled.map((c) => c.sets.reduce((n, s) => n + s.ipv4.length + s.ipv6.length, 0));
console.log(
  `local pods ${LOCALS}; sets per pod ${compiled[0].sets.length}; ` +
    `elements per pod ${Math.min(...sizes)}..${Math.max(...sizes)}; ` +
    `pod ruleset ${podRuleset(compiled[0], { eni: "eth0" }).length} bytes`,
);
