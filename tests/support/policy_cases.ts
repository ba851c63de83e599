/**
 * The NetworkPolicy cases of the end-to-end tests (issue 35's Build 2, the upstream e2e
 * suite's shapes): three namespaces of three pods, each case's policies and the
 * reachability matrix they give, written by hand from the API's meaning (not enim's
 * compiler). Run on simulated nodes by tests/network_policy_e2e_test.ts, a subset on the
 * real node (kubelet, containerd, the shipped DaemonSet) by
 * tests/k8s_real_node_policy_test.ts, and against the compiler alone, on a larger matrix,
 * by policy/compile_test.ts.
 *
 * @module
 */
import type { ContainerPorts } from "./policy_cluster.ts";

/** The namespaces and their labels. */
export const NAMESPACES: Record<string, Record<string, string>> = {
  alpha: { team: "a", env: "prod" },
  beta: { team: "b", env: "prod" },
  gamma: { team: "c", env: "dev" },
};

/** The pods of each namespace: labels and named container ports. */
export const APPS: Record<
  string,
  { labels: Record<string, string>; ports: (ns: string) => ContainerPorts }
> = {
  web: {
    labels: { app: "web", tier: "front" },
    ports: (ns) => [{ name: "http", containerPort: ns === "gamma" ? 8081 : 8080 }],
  },
  db: {
    labels: { app: "db", tier: "back" },
    ports: () => [{ name: "sql", containerPort: 5432 }, { name: "http", containerPort: 9050 }],
  },
  job: {
    labels: { app: "job" },
    ports: () => [{ name: "dns", containerPort: 53, protocol: "UDP" }],
  },
};

/**
 * A probe's end as a case's expectation sees it: a pod, or (`ns` and `app` absent) an
 * address outside the cluster, which no selector matches (policy/compile_test.ts's world
 * has one; the end-to-end tests probe between pods only).
 */
export interface End {
  id: string;
  ns?: string;
  app?: string;
  tier?: string;
  v4: string;
  v6: string;
}

/**
 * Whether traffic from `s` to `d` is admitted, by protocol, port (undefined for ICMP) and
 * family. The end-to-end tests probe TCP and UDP; policy/compile_test.ts adds SCTP and
 * ICMP.
 */
export type Expect = (
  s: End,
  d: End,
  proto: "tcp" | "udp" | "sctp" | "icmp",
  port: number | undefined,
  fam: 4 | 6,
) => boolean;

/** The pods by id, for a case's policies that name addresses. */
export type Pods = Record<string, { v4: string; v6: string }>;

/** One policy case: the policies in place (namespace, name, spec) and the matrix they give. */
export interface Case {
  name: string;
  policies: [string, string, unknown][] | ((p: Pods) => [string, string, unknown][]);
  expect: Expect;
  /** Probe IPv6 too (default IPv4 only). */
  ipv6?: boolean;
  /**
   * A policy no kube-apiserver of enim's releases stores (its validation refuses it: 422), as
   * a newer server's field or value would reach an older agent: run on the test API server
   * only, which stores what it is given.
   */
  newerServer?: true;
}

/** Why a {@linkcode Case.newerServer} case does not run on the real server. */
export const NEWER_SERVER =
  "the real kube-apiserver refuses it (422), as a newer release might not";

export const DB = { matchLabels: { app: "db" } };
export const WEB = { matchLabels: { app: "web" } };
export const JOB = { matchLabels: { app: "job" } };
export const TEAM = (t: string) => ({ namespaceSelector: { matchLabels: { team: t } } });

/** The port a pod's container calls `http`: web's (8081 in gamma), db's 9050; job has none. */
export const httpPort = (d: End) =>
  d.app === "web" ? (d.ns === "gamma" ? 8081 : 8080) : d.app === "db" ? 9050 : undefined;

/** The /24 holding IPv4 address `v4` (every pod's: one subnet of the VPC). */
const subnet24 = (v4: string) => `${v4.split(".").slice(0, 3).join(".")}.0/24`;

/** Each point of issue 35's Build 2, as a case. */
export const CASES: Case[] = [
  {
    name: "with no policy every pod reaches every pod on every port (default allow)",
    policies: [],
    expect: () => true,
  },
  {
    name: "a default-deny ingress policy isolates every pod of its namespace for ingress only",
    policies: [["alpha", "deny", { podSelector: {}, policyTypes: ["Ingress"] }]],
    expect: (_s, d) => d.ns !== "alpha",
  },
  {
    name: "a default-deny egress policy isolates every pod of its namespace for egress only",
    policies: [["alpha", "deny", { podSelector: {}, policyTypes: ["Egress"] }]],
    expect: (s) => s.ns !== "alpha",
  },
  {
    name:
      "a default-deny-all policy isolates both directions; each pod still reaches itself (IPv4 and IPv6)",
    policies: [["alpha", "deny", { podSelector: {}, policyTypes: ["Ingress", "Egress"] }]],
    ipv6: true,
    expect: (s, d) => s.ns !== "alpha" && d.ns !== "alpha",
  },
  {
    name: "policies are additive: an allow-all ingress policy beside a default deny allows all",
    policies: [
      ["alpha", "deny", { podSelector: {}, policyTypes: ["Ingress"] }],
      ["alpha", "allow", { podSelector: {}, ingress: [{}] }],
    ],
    expect: () => true,
  },
  {
    name: "spec.podSelector matchLabels isolates only the pods it selects",
    policies: [["alpha", "db", { podSelector: DB, policyTypes: ["Ingress"] }]],
    expect: (_s, d) => d.id !== "alpha/db",
  },
  {
    name: "a podSelector peer alone selects pods of the policy's own namespace only",
    policies: [["alpha", "db", { podSelector: DB, ingress: [{ from: [{ podSelector: WEB }] }] }]],
    expect: (s, d) => d.id !== "alpha/db" || s.id === "alpha/web",
  },
  {
    name: "a namespaceSelector peer alone selects every pod of the selected namespaces",
    policies: [["alpha", "db", { podSelector: DB, ingress: [{ from: [TEAM("b")] }] }]],
    expect: (s, d) => d.id !== "alpha/db" || s.ns === "beta",
  },
  {
    name: "namespaceSelector and podSelector in one peer select the pods matching both (AND)",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ...TEAM("b"), podSelector: WEB }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.id === "beta/web",
  },
  {
    name: "namespaceSelector and podSelector as two peers select either (OR)",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [TEAM("b"), { podSelector: WEB }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.ns === "beta" || s.id === "alpha/web",
  },
  {
    name: "an empty namespaceSelector with a podSelector selects those pods in every namespace",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ namespaceSelector: {}, podSelector: WEB }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.app === "web",
  },
  {
    name: "matchExpressions In selects pods whose label has one of the values",
    policies: [["alpha", "in", {
      podSelector: { matchExpressions: [{ key: "app", operator: "In", values: ["web", "job"] }] },
      policyTypes: ["Ingress"],
    }]],
    expect: (_s, d) => !(d.ns === "alpha" && (d.app === "web" || d.app === "job")),
  },
  {
    name: "matchExpressions NotIn selects pods whose label is absent or has none of the values",
    policies: [["alpha", "notin", {
      podSelector: { matchExpressions: [{ key: "tier", operator: "NotIn", values: ["front"] }] },
      policyTypes: ["Ingress"],
    }]],
    expect: (_s, d) => !(d.ns === "alpha" && d.app !== "web"),
  },
  {
    name: "matchExpressions Exists selects pods that carry the key",
    policies: [["alpha", "exists", {
      podSelector: { matchExpressions: [{ key: "tier", operator: "Exists" }] },
      policyTypes: ["Ingress"],
    }]],
    expect: (_s, d) => !(d.ns === "alpha" && d.tier !== undefined),
  },
  {
    name: "matchExpressions DoesNotExist selects pods without the key",
    policies: [["alpha", "dne", {
      podSelector: { matchExpressions: [{ key: "tier", operator: "DoesNotExist" }] },
      policyTypes: ["Ingress"],
    }]],
    expect: (_s, d) => d.id !== "alpha/job",
  },
  {
    name: "matchLabels and matchExpressions of one namespaceSelector are ANDed",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{
        from: [{
          namespaceSelector: {
            matchLabels: { env: "prod" },
            matchExpressions: [{ key: "team", operator: "NotIn", values: ["a"] }],
          },
        }],
      }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.ns === "beta",
  },
  {
    name: "a namespace is selected by name through its kubernetes.io/metadata.name label",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{
        from: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "gamma" } } }],
      }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.ns === "gamma",
  },
  {
    name: "a numeric port admits that TCP port only (protocol defaults to TCP), from anyone",
    policies: [["alpha", "db", { podSelector: DB, ingress: [{ ports: [{ port: 5432 }] }] }]],
    expect: (_s, d, proto, port) => d.id !== "alpha/db" || (proto === "tcp" && port === 5432),
  },
  {
    name: "a UDP port admits that UDP port only",
    policies: [["alpha", "job", {
      podSelector: JOB,
      ingress: [{ ports: [{ protocol: "UDP", port: 53 }] }],
    }]],
    expect: (_s, d, proto, port) => d.id !== "alpha/job" || (proto === "udp" && port === 53),
  },
  {
    name: "a port item with a protocol and no port admits every port of that protocol",
    policies: [["alpha", "job", { podSelector: JOB, ingress: [{ ports: [{ protocol: "UDP" }] }] }]],
    expect: (_s, d, proto) => d.id !== "alpha/job" || proto === "udp",
  },
  {
    name: "endPort admits the range port..endPort inclusive",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ ports: [{ port: 8081, endPort: 9050 }] }],
    }]],
    expect: (_s, d, proto, port) =>
      d.id !== "alpha/db" ||
      (proto === "tcp" && port !== undefined && port >= 8081 && port <= 9050),
  },
  {
    name: "an ingress named port resolves against each target pod's own container ports",
    policies: [["gamma", "http", { podSelector: {}, ingress: [{ ports: [{ port: "http" }] }] }]],
    expect: (_s, d, proto, port) => d.ns !== "gamma" || (proto === "tcp" && port === httpPort(d)),
  },
  {
    name: "an ingress named port must match the container port's protocol too",
    policies: [["alpha", "job", {
      podSelector: JOB,
      ingress: [{ ports: [{ protocol: "TCP", port: "dns" }, { protocol: "UDP", port: "dns" }] }],
    }]],
    expect: (_s, d, proto, port) => d.id !== "alpha/job" || (proto === "udp" && port === 53),
  },
  {
    name: "an egress named port with no `to` admits that port of every destination pod",
    policies: [["alpha", "http", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ ports: [{ port: "http" }] }],
    }]],
    expect: (s, d, proto, port) => s.ns !== "alpha" || (proto === "tcp" && port === httpPort(d)),
  },
  {
    name: "an egress named port resolves against the selected destination pods' ports",
    policies: [["alpha", "sql", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ to: [{ namespaceSelector: {}, podSelector: DB }], ports: [{ port: "sql" }] }],
    }]],
    expect: (s, d, proto, port) =>
      s.ns !== "alpha" || (d.app === "db" && proto === "tcp" && port === 5432),
  },
  {
    name: "an ingress ipBlock admits its CIDR minus its excepts",
    policies: (p) => [["alpha", "db", {
      podSelector: DB,
      ingress: [{
        from: [{
          ipBlock: {
            cidr: subnet24(p["beta/web"].v4),
            except: [`${p["beta/web"].v4}/32`, `${p["beta/db"].v4}/32`],
          },
        }],
      }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || (s.id !== "beta/web" && s.id !== "beta/db"),
  },
  {
    name: "an egress ipBlock admits the destinations it covers by address",
    policies: (p) => [["alpha", "out", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{
        to: [{ ipBlock: { cidr: `${p["gamma/web"].v4}/32` } }, {
          ipBlock: { cidr: `${p["gamma/db"].v4}/32` },
        }],
      }],
    }]],
    expect: (s, d) => s.ns !== "alpha" || d.id === "gamma/web" || d.id === "gamma/db",
  },
  {
    name: "an IPv6 ipBlock admits IPv6 sources only (dual-stack pods)",
    policies: (p) => [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: `${p["beta/web"].v6}/128` } }] }],
    }]],
    ipv6: true,
    expect: (s, d, _p, _port, fam) => d.id !== "alpha/db" || (fam === 6 && s.id === "beta/web"),
  },
  {
    name:
      "without policyTypes a policy applies to ingress always and to egress when it has egress rules",
    policies: [["alpha", "web", { podSelector: WEB, egress: [{ to: [{ podSelector: DB }] }] }]],
    expect: (s, d) => d.id !== "alpha/web" && (s.id !== "alpha/web" || d.id === "alpha/db"),
  },
  {
    name: "policyTypes [Egress] leaves ingress alone even when the policy has ingress rules",
    policies: [["alpha", "web", {
      podSelector: WEB,
      policyTypes: ["Egress"],
      ingress: [{ from: [{ podSelector: DB }] }],
    }]],
    expect: (s) => s.id !== "alpha/web",
  },
  {
    name: "a rule with ports and no `from` admits those ports from every source",
    policies: [["alpha", "web", { podSelector: WEB, ingress: [{ ports: [{ port: 8080 }] }] }]],
    expect: (_s, d, proto, port) => d.id !== "alpha/web" || (proto === "tcp" && port === 8080),
  },
  {
    name: "a rule with `from` and no ports admits every protocol and port",
    policies: [["alpha", "web", { podSelector: WEB, ingress: [{ from: [{ podSelector: DB }] }] }]],
    expect: (s, d) => d.id !== "alpha/web" || s.id === "alpha/db",
  },
  {
    name: "two policies selecting a pod admit the union of their rules",
    policies: [
      ["alpha", "p1", { podSelector: WEB, ingress: [{ from: [TEAM("b")] }] }],
      ["alpha", "p2", {
        podSelector: WEB,
        ingress: [{ from: [TEAM("c")], ports: [{ port: 8080 }] }],
      }],
    ],
    expect: (s, d, proto, port) =>
      d.id !== "alpha/web" || s.ns === "beta" ||
      (s.ns === "gamma" && proto === "tcp" && port === 8080),
  },
  {
    name: "replies are allowed: a pod that may open nothing still answers what it admits",
    policies: [["alpha", "db", {
      podSelector: DB,
      policyTypes: ["Ingress", "Egress"],
      ingress: [{ from: [{ namespaceSelector: {} }] }],
    }]],
    // From every pod (an address outside the cluster is none).
    expect: (s, d) => s.id !== "alpha/db" && (d.id !== "alpha/db" || s.ns !== undefined),
  },
  {
    name: "an egress rule with ports and no `to` admits those ports to every destination",
    policies: [["alpha", "dns", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ ports: [{ protocol: "UDP", port: 53 }] }],
    }]],
    expect: (s, _d, proto, port) => s.ns !== "alpha" || (proto === "udp" && port === 53),
  },
  {
    name: "an egress podSelector peer selects pods of the policy's namespace",
    policies: [["alpha", "db", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ to: [{ podSelector: DB }] }],
    }]],
    expect: (s, d) => s.ns !== "alpha" || d.id === "alpha/db",
  },
  {
    name: "policies of two namespaces each isolate their own pods, in both directions",
    policies: [
      ["alpha", "in", { podSelector: {}, ingress: [{ from: [TEAM("c")] }] }],
      ["gamma", "out", {
        podSelector: WEB,
        policyTypes: ["Egress"],
        egress: [{ to: [{ namespaceSelector: { matchLabels: { env: "prod" } } }] }],
      }],
    ],
    expect: (s, d) =>
      (d.ns !== "alpha" || s.ns === "gamma") &&
      (s.id !== "gamma/web" || d.ns === "alpha" || d.ns === "beta"),
  },
  {
    name:
      "a policy with a protocol enim does not know (FOO) isolates the pods it selects and admits nothing through it",
    policies: [["alpha", "future", {
      podSelector: DB,
      ingress: [{ ports: [{ protocol: "FOO", port: 5432 }] }, { from: [TEAM("b")] }],
    }]],
    expect: (_s, d) => d.id !== "alpha/db",
    newerServer: true,
  },
  {
    name:
      "a policy whose podSelector enim cannot read (operator Gt) isolates every pod of its namespace, in the directions it names, and admits nothing",
    policies: [["alpha", "gt", {
      podSelector: { matchExpressions: [{ key: "app", operator: "Gt", values: ["1"] }] },
      policyTypes: ["Ingress", "Egress"],
      ingress: [{}],
      egress: [{}],
    }]],
    expect: (s, d) => s.ns !== "alpha" && d.ns !== "alpha",
    newerServer: true,
  },
];
