/**
 * The rendered rulesets: their text, that they load (`nft -c -f`, then `nft -f`, in
 * fresh namespaces), and on the real kernel that they do what the compiled policy says
 * (the evaluator's answer) to TCP and UDP connections — in a pod's namespace for what
 * crosses its ENI, and in a node's namespace at the node end of a host link, after a
 * DNAT as kube-proxy's. Every namespace is the test's own, removed in `finally`.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { IP_BIN, netnsExec, NFT_BIN, runIp } from "../netns/ip.ts";
import { createNetns, deleteNetns, uniqueName } from "../netns/sim.ts";
import { Servers } from "../tests/support/traffic.ts";
import {
  namespaceObject,
  podObject,
  policyObject,
  type RawPod,
  viewOf,
} from "../tests/support/policy_world.ts";
import { PolicyEngine } from "./compile.ts";
import { connectionAllowed } from "./evaluate.ts";
import {
  nodeNames,
  nodeRuleset,
  nodeUpdate,
  parseDropCounters,
  podRuleset,
  POLICY_TABLE,
  setDeltaCommands,
  setReplaceCommands,
} from "./nft.ts";
import type { CompiledPolicy, SetDelta } from "./types.ts";
import { aptNeeds, ensureApt } from "../scripts/_deps.ts";

const ROOT = Deno.uid() === 0;
/**
 * What the root tests run, from the one list (scripts/_deps.ts): `deno task test` installs it
 * before the first test; this installs what is missing when the file runs alone.
 */
const UNMET = ROOT
  ? await ensureApt(aptNeeds("iproute2", "nftables", "socat", "coreutils", "procps"))
  : [];

/** Fails a root test at once when its programs could not be installed. */
function installed(): void {
  if (UNMET.length > 0) throw new Error(`Cannot install ${UNMET.join(", ")} through apt`);
}

// ---------------------------------------------------------------------------------------
// A small cluster: the local pod web/server, a client in team-a, another pod in team-b.

const SERVER_POLICY = {
  podSelector: { matchLabels: { app: "server" } },
  policyTypes: ["Ingress", "Egress"],
  ingress: [{
    from: [{ namespaceSelector: {}, podSelector: { matchLabels: { role: "client" } } }],
    ports: [{ port: 8080 }, { protocol: "UDP", port: 5353 }],
  }],
  egress: [{
    to: [{ namespaceSelector: {}, podSelector: { matchLabels: { role: "client" } } }],
    ports: [{ port: 9090 }],
  }],
};

function cluster(net: { server: string[]; client: string[]; other: string[] }) {
  const pods: Record<string, RawPod> = {
    server: {
      namespace: "web",
      name: "server",
      labels: { app: "server" },
      ports: [{ name: "http", containerPort: 8080 }],
      ips: [],
      phase: "Pending",
    },
    client: {
      namespace: "team-a",
      name: "client",
      labels: { role: "client" },
      ports: [],
      ips: net.client,
      phase: "Running",
    },
    other: {
      namespace: "team-b",
      name: "other",
      labels: { role: "other" },
      ports: [],
      ips: net.other,
      phase: "Running",
    },
  };
  const engine = new PolicyEngine(
    viewOf(
      Object.values(pods).map(podObject),
      ["web", "team-a", "team-b"].map((n) => namespaceObject(n, {})),
      [policyObject("web", "server", SERVER_POLICY)],
    ),
    { nodeAddresses: ["10.77.0.254"] },
  );
  const { compiled } = engine.addLocal({ namespace: "web", name: "server", ips: net.server });
  return { engine, pods, compiled };
}

// ---------------------------------------------------------------------------------------
// Text.

Deno.test("nft: the pod's ruleset jumps from the ENI's hooks, accepts replies, node and self first, and ends with a counted drop", () => {
  const { compiled } = cluster({
    server: ["10.77.0.10", "fd77::10"],
    client: ["10.77.0.11"],
    other: ["10.77.0.12"],
  });
  const text = podRuleset(compiled, { eni: "eth0", log: { rate: 5 } });
  const rules = text.split("\n").filter((l) => l.startsWith("add rule"));
  const ingress = rules.filter((l) => l.startsWith(`add rule inet ${POLICY_TABLE} ingress `))
    .map((l) => l.slice(`add rule inet ${POLICY_TABLE} ingress `.length));
  const set = compiled.sets[0].key;
  assertEquals(ingress, [
    "ct state established,related accept",
    "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert, mld-listener-report, mld2-listener-report } accept",
    "ip saddr @node_4 accept",
    "ip6 saddr @node_6 accept",
    "ip saddr 10.77.0.10 accept",
    "ip6 saddr fd77::10 accept",
    `ip saddr @${set}_4 tcp dport 8080 accept`,
    `ip saddr @${set}_4 udp dport 5353 accept`,
    `ip6 saddr @${set}_6 tcp dport 8080 accept`,
    `ip6 saddr @${set}_6 udp dport 5353 accept`,
    'limit rate 5/second log prefix "enim-policy drop ingress web/server: "',
    'counter name "drop_ingress" drop',
  ]);
  assertStringIncludes(text, `add rule inet ${POLICY_TABLE} input iifname "eth0" jump ingress`);
  assertStringIncludes(text, `add rule inet ${POLICY_TABLE} output oifname "eth0" jump egress`);
  assertStringIncludes(text, `add element inet ${POLICY_TABLE} ${set}_4 { 10.77.0.11 }`);
  // No logging unless asked; a direction no policy applies to has no rule.
  const quiet = podRuleset({ ...compiled, egress: { isolated: false, entries: [] } }, {
    eni: "eth0",
  });
  assert(!quiet.includes(" log "), quiet);
  assert(!quiet.includes(`add rule inet ${POLICY_TABLE} egress `), quiet);
});

Deno.test("nft: a set edit is element commands only, deletes first", () => {
  const delta: SetDelta = {
    key: "pabc",
    kind: "pods",
    users: ["web/server"],
    ipv4: { add: ["10.77.0.13"], delete: ["10.77.0.11"] },
    ipv6: { add: [], delete: [] },
  };
  assertEquals(
    setDeltaCommands(delta),
    `delete element inet ${POLICY_TABLE} pabc_4 { 10.77.0.11 }\n` +
      `add element inet ${POLICY_TABLE} pabc_4 { 10.77.0.13 }\n`,
  );
  assertEquals(
    setDeltaCommands({
      key: "nabc",
      kind: "namedPort",
      users: [],
      ipv4: { add: [], delete: [] },
      ipv6: { add: [{ addr: "fd77::1", port: 80 }], delete: [] },
    }),
    `add element inet ${POLICY_TABLE} nabc_6 { fd77::1 . 80 }\n`,
  );
  assertEquals(
    setReplaceCommands({ key: "pabc", kind: "pods", text: "", ipv4: ["10.0.0.1"], ipv6: [] }),
    `flush set inet ${POLICY_TABLE} pabc_4\nadd element inet ${POLICY_TABLE} pabc_4 { 10.0.0.1 }\n` +
      `flush set inet ${POLICY_TABLE} pabc_6\n`,
  );
});

Deno.test("nft: drop counters are read from nft's JSON, per direction and node end", () => {
  const json = JSON.stringify({
    nftables: [
      { metainfo: { version: "1.0.6", json_schema_version: 1 } },
      {
        counter: {
          family: "inet",
          name: "drop_ingress",
          table: POLICY_TABLE,
          handle: 3,
          packets: 4,
          bytes: 240,
        },
      },
      {
        counter: {
          family: "inet",
          name: "drop_out_enimh01",
          table: POLICY_TABLE,
          handle: 5,
          packets: 1,
          bytes: 60,
        },
      },
      {
        counter: {
          family: "inet",
          name: "other",
          table: POLICY_TABLE,
          handle: 6,
          packets: 9,
          bytes: 9,
        },
      },
      {
        counter: {
          family: "inet",
          name: "drop_ingress",
          table: "someone_else",
          handle: 7,
          packets: 9,
          bytes: 9,
        },
      },
    ],
  });
  assertEquals(parseDropCounters(json), [
    { direction: "ingress", packets: 4, bytes: 240 },
    { direction: "egress", link: "enimh01", packets: 1, bytes: 60 },
  ]);
});

Deno.test("nft: an interface name that could break the ruleset is refused", () => {
  const { compiled } = cluster({ server: ["10.77.0.10"], client: [], other: [] });
  let err: unknown;
  try {
    podRuleset(compiled, { eni: 'eth0" accept' });
  } catch (e) {
    err = e;
  }
  assert(err instanceof TypeError && /Invalid interface name/.test(err.message), String(err));
});

// ---------------------------------------------------------------------------------------
// Loading, on the real kernel.

async function nft(ns: string, args: string[], stdin?: string): Promise<string> {
  if (stdin !== undefined) {
    const file = await Deno.makeTempFile({ suffix: ".nft" });
    try {
      await Deno.writeTextFile(file, stdin);
      return await nft(ns, [...args, file]);
    } finally {
      await Deno.remove(file);
    }
  }
  const out = await netnsExec(ns, [NFT_BIN, ...args]);
  if (out.code !== 0) throw new Error(`nft ${args.join(" ")} in ${ns}: ${out.stderr}`);
  return out.stdout;
}

async function dropCounters(ns: string) {
  return parseDropCounters(
    await nft(ns, ["-j", "list", "counters", "table", "inet", POLICY_TABLE]),
  );
}

/** A rich policy: dual-stack, every kind of set, ranges, all-ports, SCTP, named ports both ways. */
function richPolicies(): { a: CompiledPolicy; b: CompiledPolicy } {
  const { engine } = cluster({
    server: ["10.77.0.10", "fd77::10"],
    client: ["10.77.0.11", "fd77::11"],
    other: ["10.77.0.12", "fd77::12"],
  });
  engine.upsertPolicy(policyObject("web", "rich", {
    podSelector: {},
    ingress: [{
      from: [
        { ipBlock: { cidr: "10.0.0.0/8", except: ["10.77.0.0/16"] } },
        { ipBlock: { cidr: "fd00::/8", except: ["fd77::/16"] } },
        { namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "team-b" } } },
      ],
      ports: [{ port: 1000, endPort: 2000 }, { protocol: "UDP" }, { protocol: "SCTP", port: 7 }, {
        port: "http",
      }],
    }],
    egress: [{ to: [{ namespaceSelector: {} }], ports: [{ port: "http" }] }, {}],
  }));
  const a = engine.compiled("web", "server")!;
  engine.deletePolicy("web", "rich");
  return { a, b: engine.compiled("web", "server")! };
}

Deno.test({
  name: "nft: the rendered rulesets pass nft's check and load, again over themselves, and shrink",
  ignore: !ROOT,
  async fn() {
    installed();
    const ns = uniqueName("enim-pol");
    await createNetns(ns);
    try {
      const { a, b } = richPolicies();
      const pod = podRuleset(a, { eni: "eth0", log: { rate: 10 } });
      const node = nodeRuleset([{ nodeEnd: "enimh01", policy: a }, {
        nodeEnd: "enimh-2.x",
        policy: b,
      }], {
        node: a.node,
        log: { rate: 10 },
      });
      await nft(ns, ["-c", "-f"], pod);
      await nft(ns, ["-c", "-f"], node);
      await nft(ns, ["-f"], pod);
      await nft(ns, ["-f"], pod);
      // Every set's replacement applies on its own.
      for (const s of a.sets) await nft(ns, ["-c", "-f"], setReplaceCommands(s));
      // A smaller policy: the sets only the old one had go, in the same transaction.
      await nft(ns, ["-f"], podRuleset(b, { eni: "eth0", previous: a }));
      const sets = [...(await nft(ns, ["list", "table", "inet", POLICY_TABLE]))
        .matchAll(/^\tset (\S+) \{/gm)].map((m) => m[1]);
      assertEquals(
        sets.sort(),
        ["node_4", "node_6", ...b.sets.flatMap((s) => [`${s.key}_4`, `${s.key}_6`])].sort(),
      );
      await nft(ns, ["flush", "ruleset"]);
      await nft(ns, ["-f"], node);
      await nft(ns, ["-f"], node);
      const one = nodeRuleset([{ nodeEnd: "enimh01", policy: b }], {
        node: a.node,
        previous: [{ nodeEnd: "enimh01", policy: a }, { nodeEnd: "enimh-2.x", policy: b }],
      });
      await nft(ns, ["-f"], one);
      const listed = await nft(ns, ["list", "table", "inet", POLICY_TABLE]);
      assert(!listed.includes(nodeNames("enimh-2.x").ingress), listed);
      assert(listed.includes(nodeNames("enimh01").ingress), listed);
    } finally {
      await deleteNetns(ns);
    }
  },
});

/** A table as `nft -j list table` shows it, without handles and counts, in a stable order. */
async function tableShape(ns: string): Promise<unknown> {
  const json = JSON.parse(await nft(ns, ["-j", "list", "table", "inet", POLICY_TABLE])) as {
    nftables: Record<string, Record<string, unknown>>[];
  };
  const out: Record<string, unknown[]> = { chain: [], set: [], map: [], counter: [], rule: [] };
  for (const item of json.nftables) {
    for (const [kind, v] of Object.entries(item)) {
      if (!(kind in out)) continue;
      const { handle: _h, packets: _p, bytes: _b, ...rest } = v;
      if (Array.isArray(rest.elem)) {
        rest.elem = rest.elem.map((e) => JSON.stringify(e)).sort();
      }
      out[kind].push(JSON.stringify(rest));
    }
  }
  // Rules keep their order within a chain; everything else is a set of objects.
  for (const k of ["chain", "set", "map", "counter"]) out[k].sort();
  return out;
}

Deno.test({
  name:
    "nft: nodeUpdate() brings the node's table where a full render would, touching only the pods that came, went or changed",
  ignore: !ROOT,
  async fn() {
    installed();
    const [ns1, ns2] = [uniqueName("enim-pol"), uniqueName("enim-pol")];
    await createNetns(ns1);
    await createNetns(ns2);
    try {
      const { a, b } = richPolicies();
      const steps: [{ nodeEnd: string; policy: CompiledPolicy }[], string[]][] = [
        [[{ nodeEnd: "enimh01", policy: a }], []],
        // A pod comes; the first one's rules change.
        [[{ nodeEnd: "enimh01", policy: b }, { nodeEnd: "enimh02", policy: a }], ["enimh01"]],
        // The first goes: the sets only it used go with it.
        [[{ nodeEnd: "enimh02", policy: b }], ["enimh02"]],
        // Nothing changes: nothing to load.
        [[{ nodeEnd: "enimh02", policy: b }], []],
      ];
      let previous: { nodeEnd: string; policy: CompiledPolicy }[] = [];
      await nft(ns1, ["-f"], nodeRuleset([], { node: a.node }));
      for (const [pods, changed] of steps) {
        const text = nodeUpdate(pods, { previous, changed });
        if (previous.length && pods === steps[3][0]) assertEquals(text, "");
        if (text) await nft(ns1, ["-f"], text);
        await nft(ns2, ["flush", "ruleset"]);
        await nft(ns2, ["-f"], nodeRuleset(pods, { node: a.node }));
        assertEquals(await tableShape(ns1), await tableShape(ns2));
        previous = pods;
      }
      assertStringIncludes(
        nodeUpdate([{ nodeEnd: "enimh03", policy: b }], { previous }),
        'delete element inet enim_policy ingress_links { "enimh02" }',
      );
    } finally {
      await deleteNetns(ns1);
      await deleteNetns(ns2);
    }
  },
});

// ---------------------------------------------------------------------------------------
// Traffic.

const SOCAT = "/usr/bin/socat";
const TIMEOUT = "/usr/bin/timeout";

/**
 * One connection attempt from `ns` (socat, 1 s timeouts): the server's answer line, or
 * "" when none came. `tries` > 1 retries an empty answer (for connections expected to
 * pass, on a loaded machine); one try is enough to show a drop.
 */
async function probe(
  ns: string,
  proto: "tcp" | "udp",
  addr: string,
  port: number,
  opts: { bind?: string; tries?: number } = {},
): Promise<string> {
  const v6 = addr.includes(":");
  const br = (a: string) => (v6 ? `[${a}]` : a);
  const extra = [
    ...(proto === "tcp" ? ["connect-timeout=1"] : []),
    ...(opts.bind ? [`bind=${br(opts.bind)}`] : []),
  ];
  const target = `${proto.toUpperCase()}${v6 ? 6 : 4}:${br(addr)}:${port}` +
    (extra.length ? `,${extra.join(",")}` : "");
  for (let i = 0; i < (opts.tries ?? 1); i++) {
    const child = new Deno.Command(IP_BIN, {
      args: ["netns", "exec", ns, TIMEOUT, "3", SOCAT, "-T1", "-", target],
      stdin: "piped",
      stdout: "piped",
      stderr: "null",
    }).spawn();
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(proto === "udp" ? "q\n" : ""));
    await w.close();
    const line = new TextDecoder().decode((await child.output()).stdout).trim();
    if (line) return line;
  }
  return "";
}

interface Flow {
  label: string;
  from: string;
  /** The source address the flow uses, and the destination as the policy judges it. */
  src: string;
  dst: string;
  /** Where the client connects (a Service address, before DNAT), when not `dst`. */
  via?: string;
  proto: "tcp" | "udp";
  port: number;
  /** The port the policy judges (after DNAT), when not `port`. */
  judged?: number;
  want: boolean;
}

/** Runs the flows and checks each against `want` and against the evaluator. */
async function runFlows(flows: Flow[], policyOf: (addr: string) => CompiledPolicy | undefined) {
  const results = await Promise.all(flows.map(async (f) => {
    const said = connectionAllowed(
      { addr: f.src, policy: policyOf(f.src) },
      { addr: f.dst, policy: policyOf(f.dst) },
      f.proto.toUpperCase(),
      f.judged ?? f.port,
    );
    const line = await probe(f.from, f.proto, f.via ?? f.dst, f.port, {
      bind: f.src,
      tries: f.want ? 3 : 1,
    });
    return { f, said, got: line !== "" };
  }));
  const wrong = results.filter((r) => r.said !== r.f.want || r.got !== r.f.want)
    .map((r) => `${r.f.label}: want ${r.f.want}, evaluator ${r.said}, kernel ${r.got}`);
  assertEquals(wrong, []);
}

async function ipIn(ns: string, ...cmds: string[][]): Promise<void> {
  for (const c of cmds) await runIp(c, { netns: ns });
}

async function sysctl(ns: string, settings: Record<string, string>): Promise<void> {
  for (const [k, v] of Object.entries(settings)) {
    const out = await netnsExec(ns, ["/usr/sbin/sysctl", "-qw", `${k}=${v}`]);
    if (out.code !== 0) throw new Error(`Cannot set ${k} in ${ns}: ${out.stderr}`);
  }
}

Deno.test({
  name:
    "nft: in the pod's namespace, TCP and UDP over the ENI pass or drop as the compiled policy says; replies pass; set edits take effect without a reload; drops are counted",
  ignore: !ROOT,
  sanitizeResources: false,
  async fn() {
    installed();
    const base = uniqueName("enim-pol");
    const [vpc, pod, p1, p2] = ["vpc", "pod", "p1", "p2"].map((n) => `${base}-${n}`);
    const made: string[] = [];
    try {
      for (const ns of [vpc, pod, p1, p2]) {
        await createNetns(ns);
        made.push(ns);
      }
      await ipIn(vpc, ["link", "add", "br0", "type", "bridge"], ["link", "set", "br0", "up"]);
      const hosts: [string, string, string][] = [
        [pod, "10.77.0.10", "fd77::10"],
        [p1, "10.77.0.11", "fd77::11"],
        [p2, "10.77.0.12", "fd77::12"],
      ];
      for (const [i, [ns, v4, v6]] of hosts.entries()) {
        await ipIn(
          vpc,
          ["link", "add", `v${i}`, "type", "veth", "peer", "name", "eth0", "netns", ns],
          ["link", "set", `v${i}`, "master", "br0", "up"],
        );
        await ipIn(
          ns,
          ["addr", "add", `${v4}/24`, "dev", "eth0"],
          ["addr", "add", `${v6}/64`, "dev", "eth0", "nodad"],
          ["link", "set", "eth0", "up"],
        );
      }
      const { engine, pods, compiled } = cluster({
        server: ["10.77.0.10", "fd77::10"],
        client: ["10.77.0.11", "fd77::11"],
        other: ["10.77.0.12", "fd77::12"],
      });
      await nft(pod, ["-f"], podRuleset(compiled, { eni: "eth0" }));
      const current = () => engine.compiled("web", "server")!;
      const policyOf = (
        a: string,
      ) => (a === "10.77.0.10" || a === "fd77::10" ? current() : undefined);

      await using servers = new Servers();
      await Promise.all([
        servers.start({ name: pod, path: `/run/netns/${pod}` }, "server", [
          { proto: "tcp", port: 8080 },
          { proto: "tcp", port: 8081 },
          { proto: "udp", port: 5353 },
          { proto: "udp", port: 5354 },
        ], 120),
        servers.start({ name: p1, path: `/run/netns/${p1}` }, "client", [
          { proto: "tcp", port: 9090 },
          { proto: "tcp", port: 9091 },
        ], 120),
        servers.start({ name: p2, path: `/run/netns/${p2}` }, "other", [
          { proto: "tcp", port: 9090 },
        ], 120),
      ]);

      const S = "10.77.0.10", C = "10.77.0.11", O = "10.77.0.12";
      await runFlows([
        {
          label: "client → server tcp/8080",
          from: p1,
          src: C,
          dst: S,
          proto: "tcp",
          port: 8080,
          want: true,
        },
        {
          label: "client → server tcp/8081",
          from: p1,
          src: C,
          dst: S,
          proto: "tcp",
          port: 8081,
          want: false,
        },
        // The answer leaves by egress, which admits only tcp/9090: it passes as a reply.
        {
          label: "client → server udp/5353",
          from: p1,
          src: C,
          dst: S,
          proto: "udp",
          port: 5353,
          want: true,
        },
        {
          label: "client → server udp/5354",
          from: p1,
          src: C,
          dst: S,
          proto: "udp",
          port: 5354,
          want: false,
        },
        {
          label: "other → server tcp/8080",
          from: p2,
          src: O,
          dst: S,
          proto: "tcp",
          port: 8080,
          want: false,
        },
        {
          label: "other → server udp/5353",
          from: p2,
          src: O,
          dst: S,
          proto: "udp",
          port: 5353,
          want: false,
        },
        // The answer comes in by ingress, which admits only 8080 and 5353: a reply.
        {
          label: "server → client tcp/9090",
          from: pod,
          src: S,
          dst: C,
          proto: "tcp",
          port: 9090,
          want: true,
        },
        {
          label: "server → client tcp/9091",
          from: pod,
          src: S,
          dst: C,
          proto: "tcp",
          port: 9091,
          want: false,
        },
        {
          label: "server → other tcp/9090",
          from: pod,
          src: S,
          dst: O,
          proto: "tcp",
          port: 9090,
          want: false,
        },
        {
          label: "client → server IPv6 tcp/8080",
          from: p1,
          src: "fd77::11",
          dst: "fd77::10",
          proto: "tcp",
          port: 8080,
          want: true,
        },
        {
          label: "other → server IPv6 tcp/8080",
          from: p2,
          src: "fd77::12",
          dst: "fd77::10",
          proto: "tcp",
          port: 8080,
          want: false,
        },
      ], policyOf);
      const counted = await dropCounters(pod);
      for (const dir of ["ingress", "egress"] as const) {
        const c = counted.find((c) => c.direction === dir);
        assert(c && c.packets > 0, `${dir}: ${JSON.stringify(counted)}`);
      }

      // Rules before the edits, with their handles: a set edit must leave them alone.
      const rules = () => nft(pod, ["-a", "list", "chain", "inet", POLICY_TABLE, "ingress"]);
      const before = await rules();
      const apply = async (deltas: SetDelta[]) => {
        assertEquals(deltas.length, 1, JSON.stringify(deltas));
        const text = setDeltaCommands(deltas[0]);
        for (const l of text.trim().split("\n")) assertMatch(l, /^(add|delete) element /);
        await nft(pod, ["-f"], text);
      };

      // The client's address changes: .11 leaves the set, .13 joins (the host keeps .11
      // too, so both can be tried).
      pods.client.ips = ["10.77.0.13", "fd77::11"];
      await apply(engine.upsertPod(podObject(pods.client)).deltas);
      await ipIn(p1, ["addr", "add", "10.77.0.13/24", "dev", "eth0"]);
      await runFlows([
        {
          label: "client (new address) → server tcp/8080",
          from: p1,
          src: "10.77.0.13",
          dst: S,
          proto: "tcp",
          port: 8080,
          want: true,
        },
        {
          label: "client (old address) → server tcp/8080",
          from: p1,
          src: C,
          dst: S,
          proto: "tcp",
          port: 8080,
          want: false,
        },
      ], policyOf);

      // The other pod becomes a client: its addresses join the set.
      pods.other.labels = { role: "client" };
      await apply(engine.upsertPod(podObject(pods.other)).deltas);
      await runFlows([
        {
          label: "other (now a client) → server tcp/8080",
          from: p2,
          src: O,
          dst: S,
          proto: "tcp",
          port: 8080,
          want: true,
        },
        {
          label: "other (now a client) → server IPv6 tcp/8080",
          from: p2,
          src: "fd77::12",
          dst: "fd77::10",
          proto: "tcp",
          port: 8080,
          want: true,
        },
      ], policyOf);
      const strip = (s: string) => s.replace(/counter packets \d+ bytes \d+/g, "");
      assertEquals(strip(await rules()), strip(before));
      // Loading the same ruleset again keeps the counters.
      const dropped = (await dropCounters(pod)).find((c) => c.direction === "ingress")!.packets;
      await nft(pod, ["-f"], podRuleset(current(), { eni: "eth0" }));
      assertEquals(
        (await dropCounters(pod)).find((c) => c.direction === "ingress")!.packets,
        dropped,
      );
    } finally {
      for (const ns of made) await deleteNetns(ns);
    }
  },
});

Deno.test({
  name:
    "nft: on the node, at a pod's host link, ingress and egress are judged in forward, after DNAT against the real backend",
  ignore: !ROOT,
  sanitizeResources: false,
  async fn() {
    installed();
    const base = uniqueName("enim-pol");
    const [node, pod, q1, q2] = ["node", "pod", "q1", "q2"].map((n) => `${base}-${n}`);
    const made: string[] = [];
    try {
      for (const ns of [node, pod, q1, q2]) {
        await createNetns(ns);
        made.push(ns);
      }
      await sysctl(node, {
        "net.ipv4.ip_forward": "1",
        "net.ipv4.conf.all.rp_filter": "0",
        "net.ipv4.conf.default.rp_filter": "0",
      });
      // Each "pod" hangs off the node by a veth, as a host link does: a /32 on the pod
      // end, a default route via a link-local gateway that is a static neighbour.
      const links: [string, string, string, string][] = [
        [pod, "enimhP0", "host0", "10.78.0.10"],
        [q1, "enimhQ1", "eth0", "10.78.0.11"],
        [q2, "enimhQ2", "eth0", "10.78.0.12"],
      ];
      for (const [i, [ns, end, inner, addr]] of links.entries()) {
        const nodeMac = `0e:00:00:00:00:0${i}`, podMac = `0a:00:00:00:00:0${i}`;
        await ipIn(
          node,
          [
            "link",
            "add",
            end,
            "address",
            nodeMac,
            "type",
            "veth",
            "peer",
            "name",
            inner,
            "address",
            podMac,
            "netns",
            ns,
          ],
          ["link", "set", end, "up"],
          ["route", "add", `${addr}/32`, "dev", end],
          ["neigh", "replace", addr, "lladdr", podMac, "dev", end, "nud", "permanent"],
        );
        await ipIn(
          ns,
          ["addr", "add", `${addr}/32`, "dev", inner],
          ["link", "set", inner, "up"],
          ["neigh", "replace", "169.254.1.1", "lladdr", nodeMac, "dev", inner, "nud", "permanent"],
          ["route", "add", "default", "via", "169.254.1.1", "dev", inner, "onlink"],
        );
      }
      // kube-proxy's part: two Service addresses, DNATed to each backend.
      await nft(
        node,
        ["-f"],
        [
          "table ip enim_test_nat {",
          "\tchain prerouting {",
          "\t\ttype nat hook prerouting priority dstnat; policy accept;",
          "\t\tip daddr 10.96.0.1 tcp dport 80 dnat to 10.78.0.11:9090",
          "\t\tip daddr 10.96.0.2 tcp dport 80 dnat to 10.78.0.12:9090",
          "\t}",
          "}",
          "",
        ].join("\n"),
      );
      const { compiled } = cluster({
        server: ["10.78.0.10"],
        client: ["10.78.0.11"],
        other: ["10.78.0.12"],
      });
      const loaded = [{ nodeEnd: "enimhP0", policy: compiled }];
      await nft(node, ["-f"], nodeRuleset(loaded, { node: { ipv4: ["10.78.0.254"], ipv6: [] } }));

      await using servers = new Servers();
      await Promise.all([
        servers.start({ name: pod, path: `/run/netns/${pod}` }, "server", [
          { proto: "tcp", port: 8080 },
          { proto: "tcp", port: 8081 },
        ], 120),
        servers.start({ name: q1, path: `/run/netns/${q1}` }, "client", [
          { proto: "tcp", port: 9090 },
        ], 120),
        servers.start({ name: q2, path: `/run/netns/${q2}` }, "other", [
          { proto: "tcp", port: 9090 },
        ], 120),
      ]);
      const S = "10.78.0.10", C = "10.78.0.11", O = "10.78.0.12";
      const policyOf = (a: string) => (a === S ? compiled : undefined);
      await runFlows([
        {
          label: "client → server tcp/8080",
          from: q1,
          src: C,
          dst: S,
          proto: "tcp",
          port: 8080,
          want: true,
        },
        {
          label: "client → server tcp/8081",
          from: q1,
          src: C,
          dst: S,
          proto: "tcp",
          port: 8081,
          want: false,
        },
        {
          label: "other → server tcp/8080",
          from: q2,
          src: O,
          dst: S,
          proto: "tcp",
          port: 8080,
          want: false,
        },
        {
          label: "server → client tcp/9090",
          from: pod,
          src: S,
          dst: C,
          proto: "tcp",
          port: 9090,
          want: true,
        },
        {
          label: "server → other tcp/9090",
          from: pod,
          src: S,
          dst: O,
          proto: "tcp",
          port: 9090,
          want: false,
        },
        {
          label: "server → Service → client",
          from: pod,
          src: S,
          dst: C,
          via: "10.96.0.1",
          proto: "tcp",
          port: 80,
          judged: 9090,
          want: true,
        },
        {
          label: "server → Service → other",
          from: pod,
          src: S,
          dst: O,
          via: "10.96.0.2",
          proto: "tcp",
          port: 80,
          judged: 9090,
          want: false,
        },
        {
          label: "client → other (no policy between them)",
          from: q1,
          src: C,
          dst: O,
          proto: "tcp",
          port: 9090,
          want: true,
        },
      ], policyOf);
      const counted = await dropCounters(node);
      for (const dir of ["ingress", "egress"] as const) {
        const c = counted.find((c) => c.direction === dir && c.link === "enimhP0");
        assert(c && c.packets > 0, `${dir}: ${JSON.stringify(counted)}`);
      }
      // The pod goes: its chains, counters and sets go with it; the table stays.
      await nft(node, ["-f"], nodeRuleset([], { node: { ipv4: [], ipv6: [] }, previous: loaded }));
      const left = await nft(node, ["list", "table", "inet", POLICY_TABLE]);
      assert(!/enimhP0|in_|out_/.test(left), left);
      assertEquals(
        await probe(q2, "tcp", S, 8080, { tries: 3 }).then((l) => l !== ""),
        true,
        "with no policy left, other → server passes",
      );
    } finally {
      for (const ns of made) await deleteNetns(ns);
    }
  },
});
