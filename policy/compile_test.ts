/**
 * The compiler against the NetworkPolicy API's meaning: each case compiles every pod of
 * a 3-namespace × 3-pod cluster (plus its node and an external host) and checks, with
 * the evaluator, every connection between them on TCP, UDP, SCTP and ICMP against the
 * case's expectation, written out by hand from the API's words. The cases are those of
 * the end-to-end tests (tests/support/policy_cases.ts, run here on this world's larger
 * matrix) and this file's own, which need what only this world has (the node, the
 * external host, hostNetwork and finished pods, SCTP, ICMP) or look at the compiler's
 * warnings and at what it reads of each field.
 */
import fc from "fast-check";
import { assert, assertEquals, assertThrows } from "../lib/assert.ts";
import {
  baseNamespaces,
  basePods,
  EXTERNAL,
  namespaceObject,
  NAMESPACES,
  NODE,
  podObject,
  policyObject,
  type RawPod,
  viewOf,
} from "../tests/support/policy_world.ts";
import {
  type Case as TableCase,
  CASES as TABLE,
  DB,
  type Pods,
  WEB,
} from "../tests/support/policy_cases.ts";
import { compilePolicy, PodNotFoundError, PolicyEngine, type PolicyUpdate } from "./compile.ts";
import { admits, connectionAllowed } from "./evaluate.ts";
import { type CompiledPolicy, CompiledPolicySchema, type PeerSet } from "./types.ts";
import type { LabelSelector, NetworkPolicy } from "../kube/objects.ts";
import { contains, parseCidr, parseIp } from "../lib/ip.ts";
import { blockPrefixes } from "./_blocks.ts";
import { applyUpdate, tableOf, type Tables } from "../tests/support/policy_tables.ts";

/** One end of a connection in the matrix. */
interface E {
  id: string;
  kind: "pod" | "node" | "ext";
  ns?: string;
  app?: string;
  tier?: string;
  hostNetwork?: boolean;
  v4: string;
  v6: string;
  local: boolean;
}

type Proto = "TCP" | "UDP" | "SCTP" | "ICMP";

const PROBES: [Proto, number | undefined][] = [
  ["TCP", 8080],
  ["TCP", 8081],
  ["TCP", 5432],
  ["TCP", 9050],
  ["UDP", 53],
  ["UDP", 5353],
  ["SCTP", 7777],
  ["ICMP", undefined],
];

type Expect = (s: E, d: E, proto: Proto, port: number | undefined, fam: 4 | 6) => boolean;

interface Case {
  name: string;
  policies: [string, string, unknown][];
  expect: Expect;
  world?: (pods: RawPod[]) => void;
  families?: (4 | 6)[];
  warning?: RegExp;
}

/**
 * The warnings the compiler gives on a case of the shared table, by the case's name (the
 * end-to-end tests do not look at warnings).
 */
const TABLE_WARNINGS: Record<string, RegExp> = {
  "an ingress named port resolves against each target pod's own container ports":
    /"http"\/TCP names no port of the pod/,
};

/**
 * The cases of the shared table that do not hold in this world, and why (null: it runs).
 */
function tableSkipWhy(k: TableCase): string | null {
  if (k.name === "an ingress ipBlock admits its CIDR minus its excepts") {
    return "its matrix holds where every pod is in one /24 (the VPC subnet of the end-to-end tests); here each namespace has its own (see this file's own ipBlock-with-except cases)";
  }
  return null;
}

/** This world's pods by id, for a table case's policies that name addresses. */
const PODS: Pods = Object.fromEntries(
  basePods().map((p) => [
    `${p.namespace}/${p.name}`,
    { v4: p.ips.find((a) => !a.includes(":"))!, v6: p.ips.find((a) => a.includes(":"))! },
  ]),
);

/** A case of the shared table as a case of this matrix. */
const fromTable = (k: TableCase): Case => ({
  name: k.name,
  policies: typeof k.policies === "function" ? k.policies(PODS) : k.policies,
  expect: (s, d, proto, port, fam) =>
    k.expect(s, d, proto.toLowerCase() as Lowercase<Proto>, port, fam),
  ...(k.ipv6 ? { families: [4, 6] } : {}),
  ...(TABLE_WARNINGS[k.name] ? { warning: TABLE_WARNINGS[k.name] } : {}),
});

/** This file's own cases. */
const OWN: Case[] = [
  {
    name: "an empty namespaceSelector alone selects every pod, and no address outside the cluster",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ namespaceSelector: {} }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.kind === "pod",
  },
  {
    name: "several matchLabels of a podSelector must all match",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ podSelector: { matchLabels: { app: "db", tier: "front" } } }] }],
    }]],
    expect: (_s, d) => d.id !== "alpha/db",
  },
  {
    name:
      "endPort admits the range port..endPort inclusive: 9000..9100 holds 9050 of the probed ports",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ ports: [{ port: 9000, endPort: 9100 }] }],
    }]],
    expect: (_s, d, proto, port) =>
      d.id !== "alpha/db" || (proto === "TCP" && port! >= 9000 && port! <= 9100),
  },
  {
    name: "an SCTP port admits SCTP to that port only",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ ports: [{ protocol: "SCTP", port: 7777 }] }],
    }]],
    expect: (_s, d, proto, port) => d.id !== "alpha/db" || (proto === "SCTP" && port === 7777),
  },
  {
    name:
      "an ingress named port of another protocol than the container port's admits nothing, and says so",
    policies: [["gamma", "web", {
      podSelector: WEB,
      ingress: [{ ports: [{ protocol: "UDP", port: "http" }] }],
    }]],
    expect: (_s, d) => d.id !== "gamma/web",
    warning: /"http"\/UDP names no port of the pod/,
  },
  {
    name: "an egress named port matches nothing of an ipBlock peer",
    policies: [["alpha", "http", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ to: [{ ipBlock: { cidr: "10.0.0.0/8" } }], ports: [{ port: "http" }] }],
    }]],
    expect: (s) => s.ns !== "alpha",
    warning: /egress port "http" names a pod's port: it matches nothing of ipBlock 10.0.0.0\/8/,
  },
  {
    name:
      "an egress named port resolves against the ports of destination pods of the policy's own namespace",
    policies: [["alpha", "sql", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ to: [{ podSelector: DB }], ports: [{ port: "sql" }] }],
    }]],
    expect: (s, d, proto, port) =>
      s.ns !== "alpha" || (d.id === "alpha/db" && proto === "TCP" && port === 5432),
  },
  {
    name: "an ingress ipBlock admits its CIDR minus its excepts",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: "10.0.0.0/16", except: ["10.0.2.0/24"] } }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || (s.kind === "pod" && s.ns !== "beta"),
  },
  {
    name: "an egress ipBlock admits destinations outside the cluster by address",
    policies: [["alpha", "out", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ to: [{ ipBlock: { cidr: "192.168.5.0/24" } }] }],
    }]],
    expect: (s, d) => s.ns !== "alpha" || d.kind === "ext",
  },
  {
    name: "an egress ipBlock that covers pod addresses admits those pods by address",
    policies: [["alpha", "out", {
      podSelector: {},
      policyTypes: ["Egress"],
      egress: [{ to: [{ ipBlock: { cidr: "10.0.3.0/24" } }] }],
    }]],
    expect: (s, d) => s.ns !== "alpha" || d.ns === "gamma",
  },
  {
    name:
      "an IPv6 ipBlock of a namespace's /112 admits its pods' IPv6 sources only (dual-stack pods)",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: "fd00::2:0/112" } }] }],
    }]],
    families: [4, 6],
    expect: (s, d, _p, _port, fam) => d.id !== "alpha/db" || (fam === 6 && s.ns === "beta"),
  },
  {
    name: "a port list admits no ICMP; a rule without one does",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [
        { from: [{ ipBlock: { cidr: "10.0.0.0/8" } }], ports: [{ protocol: "TCP" }] },
        { from: [{ namespaceSelector: { matchLabels: { team: "b" } } }] },
      ],
    }]],
    expect: (s, d, proto) =>
      d.id !== "alpha/db" || s.ns === "beta" || (s.kind === "pod" && proto === "TCP"),
  },
  {
    name: "the pod's own node is always allowed both ways, even under deny-all",
    policies: [["alpha", "deny", { podSelector: {}, policyTypes: ["Ingress", "Egress"] }]],
    families: [4, 6],
    expect: (s, d) => s.ns !== "alpha" && d.ns !== "alpha",
  },
  {
    name: "a pod always reaches itself, whatever its policy admits",
    policies: [["alpha", "beta-only", {
      podSelector: {},
      ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: "b" } } }] }],
      egress: [{ to: [{ namespaceSelector: { matchLabels: { team: "b" } } }] }],
    }]],
    expect: (s, d) =>
      (s.ns !== "alpha" || d.ns === "beta") && (d.ns !== "alpha" || s.ns === "beta"),
  },
  {
    name: "hostNetwork pods are not matched by selectors (they are peers by address, like nodes)",
    world: (pods) =>
      pods.push({
        namespace: "beta",
        name: "hostnet",
        labels: { app: "web" },
        ports: [],
        ips: ["10.0.9.9"],
        phase: "Running",
        hostNetwork: true,
      }),
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ namespaceSelector: {}, podSelector: WEB }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || (s.app === "web" && !s.hostNetwork),
  },
  {
    name: "an ipBlock admits a hostNetwork pod by its node's address",
    world: (pods) =>
      pods.push({
        namespace: "beta",
        name: "hostnet",
        labels: { app: "web" },
        ports: [],
        ips: ["10.0.9.9"],
        phase: "Running",
        hostNetwork: true,
      }),
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: "10.0.9.0/24" } }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.id === "beta/hostnet",
  },
  {
    name:
      "Pending pods with addresses count as peers; Succeeded, Failed and address-less pods do not",
    world: (pods) => {
      pods.find((p) => p.namespace === "beta" && p.name === "web")!.phase = "Pending";
      pods.find((p) => p.namespace === "beta" && p.name === "db")!.phase = "Succeeded";
      pods.find((p) => p.namespace === "beta" && p.name === "job")!.phase = "Failed";
      pods.find((p) => p.namespace === "gamma" && p.name === "web")!.ips = [];
    },
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: "b" } } }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.id === "beta/web",
  },
  {
    name: "a peer with neither selector nor ipBlock matches nothing, and says so",
    policies: [["alpha", "db", { podSelector: DB, ingress: [{ from: [{}] }] }]],
    expect: (_s, d) => d.id !== "alpha/db",
    warning: /no selector and no ipBlock/,
  },
  {
    name: "an invalid port item (endPort without port, or with a named port) admits nothing",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ ports: [{ endPort: 9000 }, { port: "sql", endPort: 6000 }] }],
    }]],
    expect: (_s, d) => d.id !== "alpha/db",
    warning: /endPort 9000 without a port: ignored/,
  },
  // Every field class of v1 as the API server may send it (nulls, empty lists, sloppy
  // CIDRs, IPv6), then what enim cannot read: it fails closed.
  {
    name: "null fields read as absent: a peer's null namespaceSelector, a rule's null ports",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{
        from: [{ podSelector: WEB, namespaceSelector: null, ipBlock: null }],
        ports: null,
      }],
      egress: null,
      policyTypes: null,
    }]],
    expect: (s, d) => d.id !== "alpha/db" || s.id === "alpha/web",
  },
  {
    name:
      "an empty ingress list isolates and admits nothing; a rule's empty from and ports admit all",
    policies: [
      ["alpha", "none", { podSelector: {}, ingress: [] }],
      ["alpha", "all", { podSelector: DB, ingress: [{ from: [], ports: [] }] }],
    ],
    expect: (_s, d) => d.ns !== "alpha" || d.id === "alpha/db",
  },
  {
    name: "an IPv4 ipBlock with leading zeros reads them as decimal, as ParseCIDRSloppy does",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: "010.000.002.000/24", except: ["10.0.2.03/32"] } }] }],
    }]],
    expect: (s, d) => d.id !== "alpha/db" || (s.ns === "beta" && s.id !== "beta/job"),
  },
  {
    name: "an IPv6 ipBlock's except cuts IPv6 sources out, and admits no IPv4 source",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: "fd00::/96", except: ["fd00::2:0/112"] } }] }],
    }]],
    families: [4, 6],
    expect: (s, d, _p, _port, fam) =>
      d.id !== "alpha/db" || (fam === 6 && s.kind === "pod" && s.ns !== "beta"),
  },
  {
    name:
      "a port of a protocol v1 does not know makes its policy unreadable: the pods it selects are isolated and nothing is admitted through it",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ ports: [{ protocol: "FOO", port: 5432 }] }, { from: [{ podSelector: WEB }] }],
    }]],
    expect: (_s, d) => d.id !== "alpha/db",
    warning:
      /^db: cannot be read \(spec\.ingress\.0\.ports\.0\.protocol: .*\(got "FOO"\)\): it isolates the pods app=db for ingress and admits nothing$/,
  },
  {
    name:
      "an unreadable policy adds isolation and no allowance: another policy selecting the same pod still admits what it says",
    policies: [
      ["alpha", "future", { podSelector: DB, ingress: [{ ports: [{ protocol: "FOO" }] }] }],
      ["alpha", "web", { podSelector: DB, ingress: [{ from: [{ podSelector: WEB }] }] }],
    ],
    expect: (s, d) => d.id !== "alpha/db" || s.id === "alpha/web",
  },
  {
    name:
      "a podSelector with an operator v1 does not know isolates every pod of its namespace, and admits nothing",
    policies: [["alpha", "gt", {
      podSelector: { matchExpressions: [{ key: "app", operator: "Gt", values: ["1"] }] },
      ingress: [{}],
    }]],
    expect: (_s, d) => d.ns !== "alpha",
    warning:
      /^gt: cannot be read \(spec\.podSelector\.matchExpressions\.0\.operator: .*\(got "Gt"\)\): it isolates every pod of its namespace for ingress and admits nothing$/,
  },
  {
    name:
      "a podSelector In without values cannot be read (LabelSelectorAsSelector refuses it): the namespace is isolated",
    policies: [["alpha", "in", {
      podSelector: { matchExpressions: [{ key: "app", operator: "In" }] },
      policyTypes: ["Egress"],
      egress: [{}],
    }]],
    expect: (s) => s.ns !== "alpha",
    warning: /every pod of its namespace for egress/,
  },
  {
    name: "a field v1 does not have makes its policy unreadable, in each direction it names",
    policies: [["alpha", "db", {
      podSelector: DB,
      policyTypes: ["Ingress", "Egress"],
      ingress: [{}],
      egress: [{ to: [{ serviceAccount: { name: "api" } }] }],
    }]],
    expect: (s, d) => s.id !== "alpha/db" && d.id !== "alpha/db",
    warning: /Unrecognized key: "serviceAccount"/,
  },
  {
    name:
      "without policyTypes an unreadable policy with egress rules isolates both directions (the default it would have)",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{}],
      egress: [{ ports: [{ port: 5000, endPort: "6000" }] }],
    }]],
    expect: (s, d) => s.id !== "alpha/db" && d.id !== "alpha/db",
    warning: /for ingress and egress and admits nothing/,
  },
  {
    name: "a policyTypes value v1 does not know isolates both directions",
    policies: [["alpha", "db", {
      podSelector: DB,
      policyTypes: ["Ingress", "Sideways"],
      ingress: [{}],
    }]],
    expect: (s, d) => s.id !== "alpha/db" && d.id !== "alpha/db",
  },
  {
    name: "an ipBlock that is no CIDR makes its policy unreadable, and says so",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: "10.0.0.0/33" } }, { podSelector: WEB }] }],
    }]],
    expect: (_s, d) => d.id !== "alpha/db",
    warning: /Expected a CIDR, got "10.0.0.0\/33"/,
  },
  {
    name:
      "an except that is no CIDR makes its policy unreadable (ignored, it would admit what it leaves out)",
    policies: [["alpha", "db", {
      podSelector: DB,
      ingress: [{ from: [{ ipBlock: { cidr: "10.0.0.0/16", except: ["10.0.2.0/33"] } }] }],
    }]],
    expect: (_s, d) => d.id !== "alpha/db",
    warning: /except\.0: Expected a CIDR/,
  },
];

const CASES: Case[] = [
  ...TABLE.filter((k) => tableSkipWhy(k) === null).map(fromTable),
  ...OWN,
];

function ends(pods: RawPod[]): E[] {
  const out: E[] = pods.filter((p) => p.ips.length > 0).map((p) => ({
    id: `${p.namespace}/${p.name}`,
    kind: "pod",
    ns: p.namespace,
    app: p.labels.app,
    tier: p.labels.tier,
    hostNetwork: p.hostNetwork,
    v4: p.ips.find((a) => !a.includes(":"))!,
    v6: p.ips.find((a) => a.includes(":")) ?? "",
    local: !p.hostNetwork && p.phase !== "Succeeded" && p.phase !== "Failed",
  }));
  out.push({ id: "node", kind: "node", ...NODE, local: false });
  out.push({ id: "ext", kind: "ext", ...EXTERNAL, local: false });
  return out;
}

function compileAll(c: Case) {
  const pods = basePods();
  c.world?.(pods);
  const policies = c.policies.map(([ns, name, spec]) => policyObject(ns, name, spec));
  const view = viewOf(pods.map(podObject), baseNamespaces(), policies);
  const engine = new PolicyEngine(view, { nodeAddresses: [NODE.v4, NODE.v6] });
  const all = ends(pods);
  const compiled = new Map<string, CompiledPolicy>();
  for (const e of all.filter((e) => e.local)) {
    const p = pods.find((p) => `${p.namespace}/${p.name}` === e.id)!;
    compiled.set(
      e.id,
      engine.addLocal({ namespace: p.namespace, name: p.name, ips: p.ips }).compiled,
    );
  }
  return { all, compiled, engine };
}

for (const c of CASES) {
  Deno.test(`compile: ${c.name}`, () => {
    const { all, compiled } = compileAll(c);
    const wrong: string[] = [];
    for (const fam of c.families ?? [4]) {
      for (const s of all) {
        for (const d of all) {
          const sa = fam === 4 ? s.v4 : s.v6, da = fam === 4 ? d.v4 : d.v6;
          if (!sa || !da) continue;
          for (const [proto, port] of PROBES) {
            const got = connectionAllowed(
              { addr: sa, policy: compiled.get(s.id) },
              { addr: da, policy: compiled.get(d.id) },
              proto,
              port,
            );
            const want = s === d || s.kind === "node" || d.kind === "node" ||
              c.expect(s, d, proto, port, fam);
            if (got !== want) {
              wrong.push(`${s.id} → ${d.id} ${proto}/${port ?? "-"} IPv${fam}: got ${got}`);
            }
          }
        }
      }
    }
    assertEquals(wrong.slice(0, 12), [], `${wrong.length} wrong`);
    for (const p of compiled.values()) CompiledPolicySchema.parse(p);
    if (c.warning) {
      const all = [...compiled.values()].flatMap((p) => p.warnings);
      assert(all.some((w) => c.warning!.test(w)), all.join("\n"));
    }
  });
}

Deno.test("compile: the matrix has at least 30 cases, every case of the shared table but those it says why not", () => {
  assert(CASES.length >= 30, String(CASES.length));
  assertEquals(
    TABLE.filter((k) => tableSkipWhy(k) !== null).map((k) => k.name),
    ["an ingress ipBlock admits its CIDR minus its excepts"],
  );
  // Each warning named for a table case names one.
  for (const name of Object.keys(TABLE_WARNINGS)) assert(TABLE.some((k) => k.name === name), name);
});

// ---------------------------------------------------------------------------------------
// The compiled structure itself.

function setOf(p: CompiledPolicy, key: string | null): PeerSet {
  return p.sets.find((s) => s.key === key)!;
}

Deno.test("compile: peer sets carry IPv4 and IPv6 members separately, the pod and node its own", () => {
  const c = compilePolicy(
    viewOf(basePods().map(podObject), baseNamespaces(), [
      policyObject("alpha", "db", {
        podSelector: DB,
        ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: "b" } } }] }],
      }),
    ]),
    { namespace: "alpha", name: "db", ips: ["10.0.1.2", "fd00::1:2"] },
    { nodeAddresses: [NODE.v4, NODE.v6] },
  );
  assertEquals(c.pod, { namespace: "alpha", name: "db", ipv4: ["10.0.1.2"], ipv6: ["fd00::1:2"] });
  assertEquals(c.node, { ipv4: [NODE.v4], ipv6: [NODE.v6] });
  assertEquals(c.ingress.isolated, true);
  assertEquals(c.egress, { isolated: false, entries: [] });
  assertEquals(c.ingress.entries.length, 1);
  const set = setOf(c, c.ingress.entries[0].peer);
  assertEquals(set.kind, "pods");
  assertEquals(set.text, "pods <all> in namespaces team=b");
  assertEquals(set.ipv4, ["10.0.2.1", "10.0.2.2", "10.0.2.3"]);
  assertEquals(set.ipv6, ["fd00::2:1", "fd00::2:2", "fd00::2:3"]);
  assertEquals(c.policies, [{
    name: "db",
    ingress: true,
    egress: false,
    ingressRules: 1,
    egressRules: 0,
  }]);
});

Deno.test("compile: equal selectors written differently share one set; ports merge per peer", () => {
  const c = compilePolicy(
    viewOf(basePods().map(podObject), baseNamespaces(), [
      policyObject("alpha", "a", {
        podSelector: DB,
        ingress: [{
          from: [{ podSelector: { matchLabels: { app: "web" } } }],
          ports: [{ port: 80 }, { port: 81 }, { port: 443 }],
        }],
      }),
      policyObject("alpha", "b", {
        podSelector: DB,
        ingress: [{
          from: [{
            podSelector: { matchExpressions: [{ key: "app", operator: "In", values: ["web"] }] },
          }],
          ports: [{ port: 82, endPort: 90 }, { protocol: "UDP", port: 53 }],
        }],
      }),
    ]),
    { namespace: "alpha", name: "db", ips: ["10.0.1.2"] },
    { nodeAddresses: [] },
  );
  assertEquals(c.sets.length, 1);
  assertEquals(c.ingress.entries, [{
    peer: c.sets[0].key,
    ports: [
      { protocol: "TCP", port: 80, endPort: 90 },
      { protocol: "TCP", port: 443 },
      { protocol: "UDP", port: 53 },
    ],
  }]);
  assertEquals(c.policies.map((p) => p.name), ["a", "b"]);
});

Deno.test("compile: an ipBlock set holds the block minus its excepts as disjoint prefixes", () => {
  assertEquals(blockPrefixes("10.0.0.0/16", ["10.0.2.0/24"])?.prefixes, [
    "10.0.0.0/23",
    "10.0.3.0/24",
    "10.0.4.0/22",
    "10.0.8.0/21",
    "10.0.16.0/20",
    "10.0.32.0/19",
    "10.0.64.0/18",
    "10.0.128.0/17",
  ]);
  assertEquals(blockPrefixes("10.0.0.5/24", ["10.0.0.0/24"])?.prefixes, []);
  assertEquals(blockPrefixes("10.0.0.0/24", ["10.1.0.0/24", "fd00::/8", "x"]), {
    family: 4,
    prefixes: ["10.0.0.0/24"],
    invalid: ["fd00::/8", "x"],
  });
  assertEquals(blockPrefixes("fd00::/120", ["fd00::80/121"])?.prefixes, ["fd00::/121"]);
  assertEquals(blockPrefixes("10.0.0.0/8/1"), null);
});

Deno.test("compile: ipBlock prefixes are the block minus the excepts, address by address", () => {
  fc.assert(
    fc.property(
      fc.integer({ min: 20, max: 30 }),
      fc.array(fc.tuple(fc.integer({ min: 0, max: 4095 }), fc.integer({ min: 20, max: 32 })), {
        maxLength: 4,
      }),
      fc.array(fc.integer({ min: 0, max: 4095 }), { minLength: 1, maxLength: 30 }),
      (len, excepts, probes) => {
        const base = "10.16.0.0";
        const ex = excepts.map(([n, l]) => `10.16.${n >> 8}.${n & 255}/${l}`);
        const b = blockPrefixes(`${base}/${len}`, ex)!;
        for (const n of probes) {
          const ip = parseIp(`10.16.${n >> 8}.${n & 255}`)!;
          const want = contains(parseCidr(`${base}/${len}`)!, ip) &&
            !ex.some((e) => contains(parseCidr(e)!, ip));
          const got = b.prefixes.some((p) => contains(parseCidr(p)!, ip));
          if (got !== want) return false;
        }
        return true;
      },
    ),
    { numRuns: 300 },
  );
});

Deno.test("compile: a local pod that the cache does not hold yet cannot be compiled", () => {
  const engine = new PolicyEngine(viewOf([], [], []), { nodeAddresses: [] });
  const err = assertThrows(() => engine.addLocal({ namespace: "x", name: "y", ips: ["10.0.0.1"] }));
  assert(err instanceof PodNotFoundError);
  assertEquals(err.message, 'Cannot compile the policy of pod "x/y": the pod is not in the cache');
});

// ---------------------------------------------------------------------------------------
// Changes: set edits, not rule changes.

function engineWith(policies: NetworkPolicy[], pods = basePods()) {
  const engine = new PolicyEngine(viewOf(pods.map(podObject), baseNamespaces(), policies), {
    nodeAddresses: [NODE.v4],
  });
  for (const p of pods.filter((p) => p.ips.length > 0)) {
    engine.addLocal({ namespace: p.namespace, name: p.name, ips: p.ips });
  }
  return engine;
}

const rulesOf = (p: CompiledPolicy) => JSON.stringify([p.ingress, p.egress, p.policies]);

Deno.test("compile: a peer's label change becomes a set edit, and the rules stay the same", () => {
  const pods = basePods();
  const engine = engineWith([
    policyObject("alpha", "db", { podSelector: DB, ingress: [{ from: [{ podSelector: WEB }] }] }),
  ], pods);
  const before = engine.compiled("alpha", "db")!;
  const job = pods.find((p) => p.namespace === "alpha" && p.name === "job")!;
  job.labels = { app: "web" };
  const update = engine.upsertPod(podObject(job));
  const after = engine.compiled("alpha", "db")!;
  assertEquals(update.changed, []);
  assertEquals(update.deltas, [{
    key: before.ingress.entries[0].peer!,
    kind: "pods",
    users: ["alpha/db"],
    ipv4: { add: ["10.0.1.3"], delete: [] },
    ipv6: { add: ["fd00::1:3"], delete: [] },
  }]);
  assertEquals(rulesOf(after), rulesOf(before));
  assert(admits(after, { direction: "ingress", peer: "10.0.1.3", protocol: "TCP", port: 1 }));
  // Unchanged since, the set's sorted members are the same list (sorted once, not per call).
  const again = engine.compiled("alpha", "db")!;
  assert(again.sets[0].ipv4 === after.sets[0].ipv4 && again.sets[0].ipv6 === after.sets[0].ipv6);
  // And back: the element goes.
  job.labels = { app: "job" };
  const back = engine.upsertPod(podObject(job));
  assertEquals(back.deltas[0].ipv4, { add: [], delete: ["10.0.1.3"] });
  assertEquals(engine.compiled("alpha", "db"), before);
});

Deno.test("compile: a peer's address change deletes the old address and adds the new one", () => {
  const pods = basePods();
  const engine = engineWith([
    policyObject("alpha", "db", { podSelector: DB, ingress: [{ from: [{ podSelector: WEB }] }] }),
  ], pods.filter((p) => !(p.namespace === "alpha" && p.name === "web")));
  const web = pods.find((p) => p.namespace === "alpha" && p.name === "web")!;
  // The remote pod's status arrives from the cache (not a local pod here).
  const first = engine.upsertPod(podObject(web));
  assertEquals(first.deltas[0].ipv4, { add: ["10.0.1.1"], delete: [] });
  web.ips = ["10.0.1.77", "fd00::1:1"];
  const update = engine.upsertPod(podObject(web));
  assertEquals(update.deltas.map((d) => [d.ipv4, d.ipv6]), [[
    { add: ["10.0.1.77"], delete: ["10.0.1.1"] },
    { add: [], delete: [] },
  ]]);
  // Terminated: its addresses leave.
  web.phase = "Succeeded";
  assertEquals(engine.upsertPod(podObject(web)).deltas[0].ipv4, {
    add: [],
    delete: ["10.0.1.77"],
  });
});

Deno.test("compile: a namespace's label change moves its pods in and out of namespace-selector sets", () => {
  const engine = engineWith([
    policyObject("alpha", "db", {
      podSelector: DB,
      ingress: [{
        from: [{ namespaceSelector: { matchLabels: { team: "b" } }, podSelector: WEB }],
      }],
    }),
  ]);
  const key = engine.compiled("alpha", "db")!.ingress.entries[0].peer!;
  const update = engine.upsertNamespace(namespaceObject("gamma", { team: "b" }));
  assertEquals(update, {
    changed: [],
    deltas: [{
      key,
      kind: "pods",
      users: ["alpha/db"],
      ipv4: { add: ["10.0.3.1"], delete: [] },
      ipv6: { add: ["fd00::3:1"], delete: [] },
    }],
  });
  const gone = engine.deleteNamespace("beta");
  assertEquals(gone.deltas[0].ipv4, { add: [], delete: ["10.0.2.1"] });
});

Deno.test("compile: a local pod's own label change re-renders it when its selecting policies change", () => {
  const pods = basePods();
  const engine = engineWith([
    policyObject("alpha", "db", { podSelector: DB, policyTypes: ["Ingress"] }),
  ], pods);
  const job = pods.find((p) => p.namespace === "alpha" && p.name === "job")!;
  assertEquals(engine.compiled("alpha", "job")!.ingress.isolated, false);
  job.labels = { app: "db" };
  const update = engine.upsertPod(podObject(job));
  assertEquals(update.changed, ["alpha/job"]);
  assertEquals(engine.compiled("alpha", "job")!.ingress.isolated, true);
  // A change that selects the same policies changes nothing.
  job.labels = { app: "db", extra: "1" };
  assertEquals(engine.upsertPod(podObject(job)), { deltas: [], changed: [] });
});

Deno.test("compile: a policy change compiles again only the local pods of its namespace", () => {
  const engine = engineWith([]);
  const update = engine.upsertPolicy(
    policyObject("beta", "deny", { podSelector: {}, policyTypes: ["Ingress"] }),
  );
  assertEquals(update, { deltas: [], changed: ["beta/db", "beta/job", "beta/web"] });
  assertEquals(
    engine.upsertPolicy(
      policyObject("beta", "deny", { podSelector: {}, policyTypes: ["Ingress"] }),
    ).changed,
    [],
  );
  assertEquals(engine.deletePolicy("beta", "deny").changed, ["beta/db", "beta/job", "beta/web"]);
});

Deno.test("compile: a local pod's addresses join peer sets at ADD, before kubelet writes them", () => {
  const pods = basePods();
  const web = pods.find((p) => p.namespace === "alpha" && p.name === "web")!;
  web.ips = [];
  web.phase = "Pending";
  const engine = engineWith([
    policyObject("alpha", "db", { podSelector: DB, ingress: [{ from: [{ podSelector: WEB }] }] }),
  ], pods);
  const key = engine.compiled("alpha", "db")!.ingress.entries[0].peer!;
  assertEquals(engine.compiled("alpha", "db")!.sets[0].ipv4, []);
  const added = engine.addLocal({ namespace: "alpha", name: "web", ips: ["10.0.1.1"] });
  assertEquals(added.changed, ["alpha/web"]);
  assertEquals(added.deltas, [{
    key,
    kind: "pods",
    users: ["alpha/db"],
    ipv4: { add: ["10.0.1.1"], delete: [] },
    ipv6: { add: [], delete: [] },
  }]);
  // kubelet's status with the same address changes nothing.
  web.ips = ["10.0.1.1"];
  web.phase = "Running";
  assertEquals(engine.upsertPod(podObject(web)).deltas, []);
});

Deno.test("compile: removing a local pod releases the sets only it used", () => {
  const engine = engineWith([
    policyObject("alpha", "db", { podSelector: DB, ingress: [{ from: [{ podSelector: WEB }] }] }),
  ]);
  const key = engine.compiled("alpha", "db")!.ingress.entries[0].peer!;
  assertEquals(engine.setUsers(key), ["alpha/db"]);
  engine.removeLocal("alpha", "db");
  assertEquals(engine.setUsers(key), []);
  assertEquals(engine.compiled("alpha", "db"), undefined);
  assertEquals(engine.locals().includes("alpha/db"), false);
});

Deno.test("compile: an egress named-port set follows its pods' addresses", () => {
  const pods = basePods();
  const engine = engineWith([
    policyObject("alpha", "http", {
      podSelector: WEB,
      policyTypes: ["Egress"],
      egress: [{ to: [{ namespaceSelector: {} }], ports: [{ port: "http" }] }],
    }),
  ], pods);
  const c = engine.compiled("alpha", "web")!;
  const set = c.sets[0];
  assertEquals(set.kind, "namedPort");
  assertEquals(set.ipv4.length, 6);
  // Its DEL: its addresses leave the set at once, though its API object still lists them.
  const gone = engine.removeLocal("gamma", "db");
  assertEquals(gone.deltas.map((d) => [d.ipv4, d.ipv6]), [[
    { add: [], delete: [{ addr: "10.0.3.2", port: 9050 }] },
    { add: [], delete: [{ addr: "fd00::3:2", port: 9050 }] },
  ]]);
  // A pod elsewhere, not local: its addresses come from its status (not those it let go
  // here: the local pod had no uid, so any pod of its name).
  const db = pods.find((p) => p.namespace === "gamma" && p.name === "db")!;
  db.ips = ["10.0.3.99", "fd00::3:2"];
  const update = engine.upsertPod(podObject(db));
  assertEquals(update.deltas.map((d) => [d.ipv4, d.ipv6]), [[
    { add: [{ addr: "10.0.3.99", port: 9050 }], delete: [] },
    { add: [], delete: [] },
  ]]);
  db.ips = ["10.0.3.98"];
  assertEquals(engine.upsertPod(podObject(db)).deltas.map((d) => d.ipv4), [{
    add: [{ addr: "10.0.3.98", port: 9050 }],
    delete: [{ addr: "10.0.3.99", port: 9050 }],
  }]);
});

// ---------------------------------------------------------------------------------------
// Properties.

const PROPERTY_POLICIES = () => [
  policyObject("alpha", "web", {
    podSelector: WEB,
    ingress: [{
      from: [{
        podSelector: { matchExpressions: [{ key: "app", operator: "NotIn", values: ["web"] }] },
      }],
    }],
    egress: [{
      to: [{ namespaceSelector: { matchLabels: { env: "prod" } } }],
      ports: [{ port: "http" }],
    }],
  }),
  policyObject("beta", "db", {
    podSelector: DB,
    ingress: [
      {
        from: [{
          namespaceSelector: { matchExpressions: [{ key: "team", operator: "Exists" }] },
          podSelector: { matchLabels: { tier: "front" } },
        }],
      },
      {
        from: [{ ipBlock: { cidr: "10.0.0.0/16", except: ["10.0.3.0/24"] } }],
        ports: [{ port: 5432 }],
      },
    ],
  }),
  policyObject("gamma", "all", {
    podSelector: {},
    ingress: [{ from: [{ podSelector: { matchLabels: { tier: "back" } } }] }],
  }),
];

Deno.test("compile: after any sequence of label, address and namespace changes, deltas keep every table equal to a fresh compile", () => {
  const podIds = basePods().map((p) => `${p.namespace}/${p.name}`);
  const op = fc.oneof(
    fc.record({
      kind: fc.constant("label" as const),
      pod: fc.constantFrom(...podIds),
      key: fc.constantFrom("app", "tier"),
      value: fc.option(fc.constantFrom("web", "db", "job", "front", "back"), { nil: undefined }),
    }),
    fc.record({
      kind: fc.constant("ip" as const),
      pod: fc.constantFrom(...podIds),
      last: fc.integer({ min: 1, max: 6 }),
    }),
    fc.record({
      kind: fc.constant("phase" as const),
      pod: fc.constantFrom(...podIds),
      phase: fc.constantFrom("Running", "Pending", "Succeeded"),
    }),
    fc.record({
      kind: fc.constant("ns" as const),
      ns: fc.constantFrom("alpha", "beta", "gamma"),
      key: fc.constantFrom("team", "env"),
      value: fc.option(fc.constantFrom("a", "b", "prod", "dev"), { nil: undefined }),
    }),
    fc.record({ kind: fc.constant("delete" as const), pod: fc.constantFrom(...podIds) }),
  );
  fc.assert(
    fc.property(fc.array(op, { maxLength: 25 }), (ops) => {
      const pods = basePods();
      const nsLabels: Record<string, Record<string, string>> = structuredClone(NAMESPACES);
      const policies = PROPERTY_POLICIES();
      // Local: alpha's and beta's pods; gamma's are remote.
      const locals = pods.filter((p) => p.namespace !== "gamma");
      const engine = new PolicyEngine(
        viewOf(pods.map(podObject), baseNamespaces(), policies),
        { nodeAddresses: [NODE.v4] },
      );
      const tables: Tables = new Map();
      for (const p of locals) {
        applyUpdate(
          engine,
          tables,
          engine.addLocal({ namespace: p.namespace, name: p.name, ips: p.ips }),
        );
      }
      const deleted = new Set<string>();
      for (const [i, o] of ops.entries()) {
        let u: PolicyUpdate;
        if (o.kind === "ns") {
          if (o.value === undefined) delete nsLabels[o.ns][o.key];
          else nsLabels[o.ns][o.key] = o.value;
          u = engine.upsertNamespace(namespaceObject(o.ns, nsLabels[o.ns]));
        } else {
          const p = pods.find((p) => `${p.namespace}/${p.name}` === o.pod)!;
          const isLocal = locals.includes(p);
          if (o.kind === "delete") {
            if (isLocal) continue; // a local pod leaves by DEL, not here
            deleted.add(o.pod);
            u = engine.deletePod(p.namespace, p.name);
          } else {
            if (o.kind === "label") {
              if (o.value === undefined) delete p.labels[o.key];
              else p.labels[o.key] = o.value;
            } else if (o.kind === "ip") {
              if (isLocal) continue; // enim assigned it: fixed while the pod lives
              p.ips = [`10.0.${p.namespace === "gamma" ? 3 : 9}.${o.last}`];
            } else {
              if (isLocal) continue;
              p.phase = o.phase;
            }
            deleted.delete(o.pod);
            u = engine.upsertPod(podObject(p));
          }
        }
        applyUpdate(engine, tables, u);
        // Every other change, every local pod's sets read: their sorted lists are then
        // kept up to date by the changes between reads, or dropped past a limit.
        if (i % 2 === 0) {
          for (const p of locals) engine.compiled(p.namespace, p.name);
        }
      }
      // A fresh engine over the same world compiles the same policies, and the tables
      // the deltas kept hold exactly the current members.
      const live = pods.filter((p) => !deleted.has(`${p.namespace}/${p.name}`));
      const fresh = new PolicyEngine(
        viewOf(
          live.map(podObject),
          Object.entries(nsLabels).map(([n, l]) => namespaceObject(n, l)),
          policies,
        ),
        { nodeAddresses: [NODE.v4] },
      );
      for (const p of locals) fresh.addLocal({ namespace: p.namespace, name: p.name, ips: p.ips });
      for (const p of locals) {
        const got = engine.compiled(p.namespace, p.name)!;
        assertEquals(got, fresh.compiled(p.namespace, p.name));
        assertEquals(tables.get(`${p.namespace}/${p.name}`), tableOf(got));
      }
    }),
    { numRuns: 150 },
  );
});

// A reference reading of the API, written straight from the concept page and types.go,
// sharing nothing with the compiler but lib/ip.ts.

interface RefPod {
  ns: string;
  name: string;
  labels: Record<string, string>;
  ports: RawPod["ports"];
  addr: string;
}

function refSelector(sel: LabelSelector | undefined, labels: Record<string, string>): boolean {
  if (!sel) return true;
  for (const [k, v] of Object.entries(sel.matchLabels ?? {})) if (labels[k] !== v) return false;
  for (const e of sel.matchExpressions ?? []) {
    const has = Object.hasOwn(labels, e.key);
    const vals = e.values ?? [];
    if (e.operator === "In" && !(has && vals.includes(labels[e.key]))) return false;
    if (e.operator === "NotIn" && has && vals.includes(labels[e.key])) return false;
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
  }
  return true;
}

function refAllowed(
  policies: NetworkPolicy[],
  nsLabels: Record<string, Record<string, string>>,
  pods: RefPod[],
  target: RefPod,
  dir: "ingress" | "egress",
  peerAddr: string,
  proto: string,
  port: number | undefined,
): boolean {
  if (peerAddr === target.addr || peerAddr === NODE.v4) return true;
  const type = dir === "ingress" ? "Ingress" : "Egress";
  const applicable = policies.filter((p) => {
    if (p.metadata.namespace !== target.ns || !refSelector(p.spec.podSelector, target.labels)) {
      return false;
    }
    const types = p.spec.policyTypes?.length
      ? p.spec.policyTypes
      : ["Ingress", ...(p.spec.egress?.length ? ["Egress"] : [])];
    return types.includes(type);
  });
  if (applicable.length === 0) return true;
  const peerPod = pods.find((p) => p.addr === peerAddr);
  const ip = parseIp(peerAddr)!;
  for (const p of applicable) {
    const rules = dir === "ingress"
      ? (p.spec.ingress ?? []).map((r) => ({ peers: r.from, ports: r.ports }))
      : (p.spec.egress ?? []).map((r) => ({ peers: r.to, ports: r.ports }));
    for (const r of rules) {
      const peers = r.peers?.length ? r.peers : [null];
      for (const peer of peers) {
        let peerOk: boolean;
        if (peer === null) peerOk = true;
        else if (peer.ipBlock) {
          peerOk = contains(parseCidr(peer.ipBlock.cidr)!, ip) &&
            !(peer.ipBlock.except ?? []).some((e) => contains(parseCidr(e)!, ip));
        } else if (!peerPod) peerOk = false;
        else {
          const nsOk = peer.namespaceSelector
            ? refSelector(peer.namespaceSelector, nsLabels[peerPod.ns] ?? {})
            : peerPod.ns === p.metadata.namespace;
          peerOk = nsOk && refSelector(peer.podSelector, peerPod.labels);
        }
        if (!peerOk) continue;
        if (!r.ports?.length) return true;
        for (const pp of r.ports) {
          const pr = pp.protocol ?? "TCP";
          if (pr !== proto) continue;
          if (pp.port === undefined) return true;
          if (typeof pp.port === "number") {
            if (port !== undefined && port >= pp.port && port <= (pp.endPort ?? pp.port)) {
              return true;
            }
            continue;
          }
          // Named: the target's own port (ingress), the destination pod's (egress; none
          // for an ipBlock peer).
          const owner = dir === "ingress" ? target : peer?.ipBlock ? undefined : peerPod;
          if (
            owner?.ports.some((c) =>
              c.name === pp.port && (c.protocol ?? "TCP") === proto && c.containerPort === port
            )
          ) return true;
        }
      }
    }
  }
  return false;
}

Deno.test("compile: random policies mean what a direct reading of the API says, and an unreadable one isolates and admits nothing", () => {
  const sel = (keys: string[], values: string[]) =>
    fc.record({
      matchLabels: fc.option(
        fc.dictionary(fc.constantFrom(...keys), fc.constantFrom(...values), { maxKeys: 2 }),
        { nil: undefined },
      ),
      matchExpressions: fc.option(
        fc.array(
          fc.oneof(
            fc.record({
              key: fc.constantFrom(...keys),
              operator: fc.constantFrom("In" as const, "NotIn" as const),
              values: fc.uniqueArray(fc.constantFrom(...values), { minLength: 1, maxLength: 2 }),
            }),
            fc.record({
              key: fc.constantFrom(...keys),
              operator: fc.constantFrom("Exists" as const, "DoesNotExist" as const),
            }),
          ),
          { maxLength: 2 },
        ),
        { nil: undefined },
      ),
    }, { requiredKeys: [] });
  const podSel = sel(["app", "tier"], ["web", "db", "job", "front", "back"]);
  const nsSel = sel(["team", "env"], ["a", "b", "c", "prod", "dev"]);
  const peer = fc.oneof(
    fc.record({ podSelector: podSel }),
    fc.record({ namespaceSelector: nsSel }),
    fc.record({ namespaceSelector: nsSel, podSelector: podSel }),
    fc.record({
      ipBlock: fc.constantFrom(
        { cidr: "10.0.0.0/16", except: ["10.0.2.0/24"] },
        { cidr: "10.0.3.0/24" },
        { cidr: "192.168.5.0/24" },
        { cidr: "10.0.1.2/32" },
      ),
    }),
  );
  const port = fc.constantFrom(
    { port: 8080 },
    { port: 5432 },
    { protocol: "UDP" as const, port: 53 },
    { port: "http" },
    { port: "sql" },
    { protocol: "UDP" as const, port: "dns" },
    { port: 5000, endPort: 9000 },
    { protocol: "UDP" as const },
    { protocol: "SCTP" as const, port: 7777 },
  );
  const rule = fc.record({
    peers: fc.option(fc.array(peer, { maxLength: 3 }), { nil: undefined }),
    ports: fc.option(fc.array(port, { maxLength: 3 }), { nil: undefined }),
  });
  const policy = fc.record({
    ns: fc.constantFrom("alpha", "beta", "gamma"),
    podSelector: podSel,
    ingress: fc.option(fc.array(rule, { maxLength: 2 }), { nil: undefined }),
    egress: fc.option(fc.array(rule, { maxLength: 2 }), { nil: undefined }),
    policyTypes: fc.option(
      fc.constantFrom(["Ingress"], ["Egress"], ["Ingress", "Egress"]),
      { nil: undefined },
    ),
    // What a newer release may say that v1 does not: the policy cannot be read.
    poison: fc.oneof(
      { arbitrary: fc.constant(undefined), weight: 4 },
      { arbitrary: fc.constantFrom("protocol", "operator", "field", "policyType"), weight: 1 },
    ),
  });
  fc.assert(
    fc.property(fc.array(policy, { minLength: 1, maxLength: 4 }), (specs) => {
      const spec = (s: typeof specs[number]) => ({
        podSelector: s.podSelector,
        ...(s.ingress
          ? { ingress: s.ingress.map((r) => ({ from: r.peers, ports: r.ports })) }
          : {}),
        ...(s.egress ? { egress: s.egress.map((r) => ({ to: r.peers, ports: r.ports })) } : {}),
        ...(s.policyTypes ? { policyTypes: s.policyTypes } : {}),
      });
      const poisoned = (s: typeof specs[number]) => {
        const p = spec(s);
        switch (s.poison) {
          case "protocol":
            return { ...p, ingress: [...(p.ingress ?? []), { ports: [{ protocol: "FOO" }] }] };
          case "operator":
            return {
              ...p,
              podSelector: {
                ...p.podSelector,
                matchExpressions: [
                  ...(p.podSelector.matchExpressions ?? []),
                  { key: "app", operator: "Gt", values: ["1"] },
                ],
              },
            };
          case "field":
            return { ...p, egress: [...(p.egress ?? []), { to: [{ fqdn: "example.com" }] }] };
          case "policyType":
            return { ...p, policyTypes: ["Ingress", "Sideways"] };
        }
        return p;
      };
      const policies = specs.map((s, i) => policyObject(s.ns, `p${i}`, poisoned(s)));
      // The reference's reading of an unreadable policy, by hand: its own podSelector
      // (every pod when that is what cannot be read), the directions it names (both when
      // those cannot be read; without policyTypes, Ingress and Egress when it has egress
      // rules), and no rule.
      const reference = specs.map((s, i): NetworkPolicy => {
        if (s.poison === undefined) return policies[i];
        const egress = s.poison === "field" || (s.egress?.length ?? 0) > 0;
        return {
          metadata: { namespace: s.ns, name: `p${i}` },
          spec: {
            podSelector: s.poison === "operator" ? {} : s.podSelector,
            policyTypes: s.poison === "policyType"
              ? ["Ingress", "Egress"]
              : [...(s.policyTypes ?? (egress ? ["Ingress", "Egress"] : ["Ingress"]))],
          },
        };
      });
      const raw = basePods();
      const engine = engineWith(policies, raw);
      const pods: RefPod[] = raw.map((p) => ({
        ns: p.namespace,
        name: p.name,
        labels: p.labels,
        ports: p.ports,
        addr: p.ips[0],
      }));
      const peers = [...pods.map((p) => p.addr), NODE.v4, EXTERNAL.v4];
      for (const t of pods) {
        const c = engine.compiled(t.ns, t.name)!;
        for (const dir of ["ingress", "egress"] as const) {
          for (const addr of peers) {
            for (const [proto, port] of PROBES) {
              const got = admits(c, { direction: dir, peer: addr, protocol: proto, port });
              const want = refAllowed(reference, NAMESPACES, pods, t, dir, addr, proto, port);
              if (got !== want) {
                throw new Error(
                  `${t.ns}/${t.name} ${dir} ${addr} ${proto}/${port}: got ${got}, want ${want}\n` +
                    JSON.stringify(specs),
                );
              }
            }
          }
        }
      }
    }),
    { numRuns: 200 },
  );
});

Deno.test("compile: a pod without labels is updated and deleted after the last labelled pod of its namespace left", () => {
  const engine = new PolicyEngine(viewOf([], baseNamespaces(), []), { nodeAddresses: [NODE.v4] });
  const bare: RawPod = {
    namespace: "alpha",
    name: "bare",
    labels: {},
    ports: [],
    ips: ["10.0.1.9"],
  };
  const labelled: RawPod = {
    namespace: "alpha",
    name: "web",
    labels: { app: "web" },
    ports: [],
    ips: ["10.0.1.1"],
  };
  engine.upsertPod(podObject(bare));
  engine.upsertPod(podObject(labelled));
  engine.deletePod("alpha", "web");
  // Its namespace's label postings went with web: bare's own update and deletion still work.
  engine.upsertPod(podObject({ ...bare, ips: ["10.0.1.10"] }));
  engine.deletePod("alpha", "bare");
  engine.upsertPod(podObject(labelled));
  engine.addLocal({ namespace: "alpha", name: "web", ips: ["10.0.1.1"] });
  assertEquals(engine.compiled("alpha", "web")?.pod.ipv4, ["10.0.1.1"]);
});

Deno.test("compile: a pod whose namespace is not in the cache yet matches only namespace selectors that match every label set, never NotIn or DoesNotExist; once its labels come it is judged by them", () => {
  const pods: RawPod[] = [
    ...basePods(),
    { namespace: "delta", name: "job", labels: { app: "job" }, ports: [], ips: ["10.0.4.3"] },
  ];
  const from = (namespaceSelector: LabelSelector) => [{ from: [{ namespaceSelector }] }];
  const ingress = [
    ...from({ matchExpressions: [{ key: "env", operator: "NotIn", values: ["prod"] }] }),
    ...from({ matchExpressions: [{ key: "env", operator: "DoesNotExist" }] }),
    ...from({}),
  ];
  // The namespace "delta" (env=prod) has not come yet: the pods' list came first.
  const engine = new PolicyEngine(
    viewOf(pods.map(podObject), baseNamespaces(), [
      policyObject("alpha", "db", { podSelector: DB, ingress }),
    ]),
    { nodeAddresses: [NODE.v4] },
  );
  engine.addLocal({ namespace: "alpha", name: "db", ips: ["10.0.1.2"] });
  const members = () => {
    const c = engine.compiled("alpha", "db")!;
    return c.ingress.entries.map((e) => {
      const set = c.sets.find((s) => s.key === e.peer);
      // The empty selector's peer: every pod of every namespace (no set: any address).
      return set ? (set.ipv4 as readonly unknown[]).includes("10.0.4.3") : true;
    });
  };
  assertEquals(members(), [false, false, true], "NotIn, DoesNotExist, every namespace");
  // The namespace comes, env=prod: still only the empty selector.
  engine.upsertNamespace(namespaceObject("delta", { env: "prod" }));
  assertEquals(members(), [false, false, true]);
  // Its labels change to none of those: NotIn and DoesNotExist admit it now.
  engine.upsertNamespace(namespaceObject("delta", {}));
  assertEquals(members(), [true, true, true]);
  assert(
    admits(engine.compiled("alpha", "db")!, {
      direction: "ingress",
      peer: "10.0.4.3",
      protocol: "TCP",
      port: 1,
    }),
  );
  // Deleted (not known again): only the empty selector.
  engine.deleteNamespace("delta");
  assertEquals(members(), [false, false, true]);
});

Deno.test("compile: an IPv4-mapped except under an IPv4 block cuts the IPv4 CIDR it maps, as kube-apiserver before 1.33 read it", () => {
  const b = blockPrefixes("10.0.0.0/8", ["::ffff:10.1.0.0/112", "::ffff:a02:0/120"]);
  assertEquals(b?.invalid, []);
  assert(b);
  const inBlock = (addr: string) => b.prefixes.some((p) => contains(parseCidr(p)!, parseIp(addr)!));
  assertEquals(
    ["10.0.0.1", "10.1.0.1", "10.1.255.255", "10.2.0.7", "10.2.1.7", "10.255.0.1"].map(inBlock),
    [true, false, false, false, true, true],
  );
  // Compiled: the peer set holds the block without 10.1.0.0/16.
  const c = compilePolicy(
    viewOf(basePods().map(podObject), baseNamespaces(), [
      policyObject("alpha", "db", {
        podSelector: DB,
        ingress: [{ from: [{ ipBlock: { cidr: "10.0.0.0/8", except: ["::ffff:10.1.0.0/112"] } }] }],
      }),
    ]),
    { namespace: "alpha", name: "db", ips: ["10.0.1.2"] },
    { nodeAddresses: [NODE.v4] },
  );
  const probe = (peer: string) =>
    admits(c, { direction: "ingress", peer, protocol: "TCP", port: 5432 });
  assertEquals([probe("10.0.1.3"), probe("10.1.2.3")], [true, false]);
  // Not mapped, or under an IPv6 block, or shorter than /96: as before.
  assertEquals(blockPrefixes("fd00::/8", ["::ffff:10.1.0.0/112"])?.prefixes, ["fd00::/8"]);
  assertEquals(blockPrefixes("10.0.0.0/8", ["::ffff:0:0/95"])?.invalid, ["::ffff:0:0/95"]);
});
