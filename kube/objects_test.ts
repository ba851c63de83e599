/**
 * The NetworkPolicy schema against `networking.k8s.io/v1` (types.go and the concept
 * page): every field class is read as the API server sends it, and what cannot be read
 * is kept, marked, with a spec that fails closed.
 */
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { NetworkPolicySchema, PodSchema } from "./objects.ts";

const META = { name: "p", namespace: "shop", uid: "u1", resourceVersion: "7" };
const parse = (spec: unknown) =>
  NetworkPolicySchema.parse({
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: { ...META, generation: 3, annotations: { a: "b" } },
    spec,
  });

Deno.test("every field class of a v1 NetworkPolicy is read as the API server sends it", async (t) => {
  const cases: [string, unknown, unknown][] = [
    ["an empty spec: an empty podSelector", {}, { podSelector: {} }],
    ["no spec at all: the zero spec", undefined, { podSelector: {} }],
    [
      "policyTypes, as the API server defaults them",
      { podSelector: {}, policyTypes: ["Ingress", "Egress"] },
      { podSelector: {}, policyTypes: ["Ingress", "Egress"] },
    ],
    [
      "matchLabels and the four matchExpressions operators",
      {
        podSelector: {
          matchLabels: { app: "db" },
          matchExpressions: [
            { key: "tier", operator: "In", values: ["a", "b"] },
            { key: "env", operator: "NotIn", values: ["dev"] },
            { key: "team", operator: "Exists" },
            { key: "legacy", operator: "DoesNotExist", values: [] },
          ],
        },
      },
      {
        podSelector: {
          matchLabels: { app: "db" },
          matchExpressions: [
            { key: "tier", operator: "In", values: ["a", "b"] },
            { key: "env", operator: "NotIn", values: ["dev"] },
            { key: "team", operator: "Exists" },
            { key: "legacy", operator: "DoesNotExist", values: [] },
          ],
        },
      },
    ],
    [
      "peers: podSelector, namespaceSelector, both, ipBlock of each family with except",
      {
        podSelector: {},
        ingress: [{
          from: [
            { podSelector: { matchLabels: { app: "web" } } },
            { namespaceSelector: {} },
            { namespaceSelector: { matchLabels: { team: "a" } }, podSelector: {} },
            { ipBlock: { cidr: "10.0.0.0/8", except: ["10.1.0.0/16"] } },
            { ipBlock: { cidr: "2001:db8::/32", except: ["2001:db8:1::/48"] } },
          ],
        }],
      },
      {
        podSelector: {},
        ingress: [{
          from: [
            { podSelector: { matchLabels: { app: "web" } } },
            { namespaceSelector: {} },
            { namespaceSelector: { matchLabels: { team: "a" } }, podSelector: {} },
            { ipBlock: { cidr: "10.0.0.0/8", except: ["10.1.0.0/16"] } },
            { ipBlock: { cidr: "2001:db8::/32", except: ["2001:db8:1::/48"] } },
          ],
        }],
      },
    ],
    [
      "ports: TCP, UDP, SCTP, no protocol, a number, a name, a range, no port",
      {
        podSelector: {},
        egress: [{
          ports: [
            { protocol: "TCP", port: 80 },
            { protocol: "UDP", port: "dns" },
            { protocol: "SCTP", port: 7777, endPort: 7780 },
            { port: 443 },
            { protocol: "UDP" },
            {},
          ],
        }],
      },
      {
        podSelector: {},
        egress: [{
          ports: [
            { protocol: "TCP", port: 80 },
            { protocol: "UDP", port: "dns" },
            { protocol: "SCTP", port: 7777, endPort: 7780 },
            { port: 443 },
            { protocol: "UDP" },
            {},
          ],
        }],
      },
    ],
    [
      "empty lists stay empty (an empty ingress list isolates; a rule's empty from admits all)",
      { podSelector: {}, ingress: [], egress: [{ to: [], ports: [] }] },
      { podSelector: {}, ingress: [], egress: [{ to: [], ports: [] }] },
    ],
    [
      "nulls are absent fields",
      {
        podSelector: { matchLabels: null, matchExpressions: null },
        ingress: [{ from: null, ports: [{ protocol: null, port: 80, endPort: null }] }],
        egress: null,
        policyTypes: null,
      },
      { podSelector: {}, ingress: [{ ports: [{ port: 80 }] }] },
    ],
    [
      "a null podSelector is the empty one (Go decodes null into the zero selector)",
      { podSelector: null },
      { podSelector: {} },
    ],
    [
      "a sloppy IPv4 CIDR (leading zeros) reads as decimal; host bits are kept for the compiler",
      { ingress: [{ from: [{ ipBlock: { cidr: "010.001.0.0/16", except: [" 10.1.2.3/24"] } }] }] },
      {
        podSelector: {},
        ingress: [{ from: [{ ipBlock: { cidr: "10.1.0.0/16", except: ["10.1.2.3/24"] } }] }],
      },
    ],
  ];
  for (const [name, spec, want] of cases) {
    await t.step(name, () => {
      const p = parse(spec);
      assertEquals(p.unreadable, undefined, JSON.stringify(p.unreadable));
      assertEquals(p.spec, want);
      assertEquals(p.metadata, META, "the metadata enim keeps");
    });
  }
});

Deno.test("a NetworkPolicy that cannot be read is kept, marked, with a spec that isolates and admits nothing", async (t) => {
  const DB = { matchLabels: { app: "db" } };
  const cases: {
    name: string;
    spec: unknown;
    reason: RegExp;
    podSelector: unknown;
    policyTypes: string[];
    wholeNamespace?: boolean;
  }[] = [
    {
      name: "a protocol of a newer release",
      spec: { podSelector: DB, ingress: [{ ports: [{ protocol: "FOO", port: 80 }] }] },
      reason: /^spec\.ingress\.0\.ports\.0\.protocol: .*"SCTP".* \(got "FOO"\)$/,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "a selector operator v1 does not have, in the podSelector: the whole namespace",
      spec: {
        podSelector: { matchExpressions: [{ key: "n", operator: "Gt", values: ["1"] }] },
        ingress: [{}],
      },
      reason: /^spec\.podSelector\.matchExpressions\.0\.operator: .* \(got "Gt"\)$/,
      podSelector: {},
      policyTypes: ["Ingress"],
      wholeNamespace: true,
    },
    {
      name: "an operator v1 does not have in a peer's namespaceSelector: the selected pods",
      spec: {
        podSelector: DB,
        policyTypes: ["Egress"],
        egress: [{
          to: [{ namespaceSelector: { matchExpressions: [{ key: "k", operator: "Lt" }] } }],
        }],
      },
      reason: /^spec\.egress\.0\.to\.0\.namespaceSelector\.matchExpressions\.0\.operator: /,
      podSelector: DB,
      policyTypes: ["Egress"],
    },
    {
      name: "NotIn without values",
      spec: {
        podSelector: DB,
        ingress: [{
          from: [{ podSelector: { matchExpressions: [{ key: "a", operator: "NotIn" }] } }],
        }],
      },
      reason: /Expected values for In and NotIn/,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "Exists with values",
      spec: {
        podSelector: { matchExpressions: [{ key: "a", operator: "Exists", values: ["x"] }] },
      },
      reason: /none for Exists and DoesNotExist/,
      podSelector: {},
      policyTypes: ["Ingress"],
      wholeNamespace: true,
    },
    {
      name: "a field v1 does not have",
      spec: { podSelector: DB, ingress: [{ from: [{ podSelector: {}, serviceAccount: "a" }] }] },
      reason: /^spec\.ingress\.0\.from\.0: Unrecognized key: "serviceAccount"$/,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "a field v1 does not have in the podSelector (matchFields): the whole namespace",
      spec: { podSelector: { matchFields: [{ key: "metadata.name" }] }, policyTypes: ["Egress"] },
      reason: /^spec\.podSelector: Unrecognized key: "matchFields"$/,
      podSelector: {},
      policyTypes: ["Egress"],
      wholeNamespace: true,
    },
    {
      name: "a port that is neither a number nor a string",
      spec: { podSelector: DB, ingress: [{ ports: [{ port: { name: "http" } }] }] },
      reason: /^spec\.ingress\.0\.ports\.0\.port: /,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "a fractional port",
      spec: { podSelector: DB, ingress: [{ ports: [{ port: 80.5 }] }] },
      reason: /^spec\.ingress\.0\.ports\.0\.port: /,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "an ipBlock cidr that is no CIDR",
      spec: { podSelector: DB, ingress: [{ from: [{ ipBlock: { cidr: "10.0.0.0/33" } }] }] },
      reason: /^spec\.ingress\.0\.from\.0\.ipBlock\.cidr: Expected a CIDR, got "10\.0\.0\.0\/33"$/,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "an ipBlock without its cidr",
      spec: { podSelector: DB, ingress: [{ from: [{ ipBlock: { except: ["10.0.0.0/8"] } }] }] },
      reason: /^spec\.ingress\.0\.from\.0\.ipBlock\.cidr: /,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "an except that is no CIDR",
      spec: {
        podSelector: DB,
        ingress: [{ from: [{ ipBlock: { cidr: "10.0.0.0/8", except: ["x"] } }] }],
      },
      reason: /except\.0: Expected a CIDR, got "x"$/,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "a null inside a list",
      spec: { podSelector: DB, ingress: [null] },
      reason: /^spec\.ingress\.0: /,
      podSelector: DB,
      policyTypes: ["Ingress"],
    },
    {
      name: "without policyTypes, egress rules make it isolate egress too",
      spec: { podSelector: DB, egress: [{ to: [{ ipBlock: { cidr: "nowhere" } }] }] },
      reason: /^spec\.egress\.0\.to\.0\.ipBlock\.cidr: /,
      podSelector: DB,
      policyTypes: ["Ingress", "Egress"],
    },
    {
      name: "an egress that is not a list at all isolates egress too",
      spec: { podSelector: DB, egress: "all" },
      reason: /^spec\.egress: /,
      podSelector: DB,
      policyTypes: ["Ingress", "Egress"],
    },
    {
      name: "a policyType v1 does not have: both directions",
      spec: { podSelector: DB, policyTypes: ["Ingress", "Sideways"], ingress: [{}] },
      reason: /^spec\.policyTypes\.1: .* \(got "Sideways"\)$/,
      podSelector: DB,
      policyTypes: ["Ingress", "Egress"],
    },
    {
      name: "a spec that is no object: the whole namespace, both directions",
      spec: "deny",
      reason: /^spec: /,
      podSelector: {},
      policyTypes: ["Ingress", "Egress"],
      wholeNamespace: true,
    },
  ];
  for (const c of cases) {
    await t.step(c.name, () => {
      const p = parse(c.spec);
      assert(p.unreadable, "marked unreadable");
      assertMatch(p.unreadable.reason, c.reason);
      assertEquals(p.unreadable.wholeNamespace, c.wholeNamespace ?? false);
      assertEquals(p.spec, { podSelector: c.podSelector, policyTypes: c.policyTypes });
      assertEquals(p.metadata, META);
    });
  }
});

Deno.test("a NetworkPolicy without a name cannot be kept (it has no key); one with a name always can", () => {
  assertEquals(
    NetworkPolicySchema.safeParse({ metadata: { namespace: "a" }, spec: {} }).success,
    false,
  );
  assertEquals(NetworkPolicySchema.safeParse({ spec: {} }).success, false);
  const odd = NetworkPolicySchema.safeParse({ metadata: { name: "x", labels: { a: 7 } }, spec: 7 });
  assert(odd.success, "its labels are not read, its spec fails closed");
  assertEquals(odd.data.unreadable?.wholeNamespace, true);
});

const pod = (metadata: Record<string, unknown>) =>
  PodSchema.parse({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "b", namespace: "y", uid: "u-1", ...metadata },
    status: { phase: "Running", podIPs: [{ ip: "10.0.0.2" }] },
  });

Deno.test("PodSchema keeps a pod's uid, and when its deletion began with what grace", () => {
  const running = pod({});
  assertEquals(running.metadata, { name: "b", namespace: "y", uid: "u-1" });
  assertEquals(running.deleting, undefined);
  const terminating = pod({
    deletionTimestamp: "2026-12-01T10:00:30Z",
    deletionGracePeriodSeconds: 30,
  });
  assertEquals(terminating.metadata, { name: "b", namespace: "y", uid: "u-1" });
  assertEquals(terminating.deleting, { at: "2026-12-01T10:00:30Z", graceSeconds: 30 });
  assertEquals(
    pod({ deletionTimestamp: "2026-12-01T10:00:30Z" }).deleting,
    { at: "2026-12-01T10:00:30Z", graceSeconds: null },
  );
  assertEquals(terminating.phase, "Running");
  assertEquals(terminating.ips, ["10.0.0.2"]);
});
