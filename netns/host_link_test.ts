import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { batchLine, netnsExec, NFT_BIN, nftApply } from "./ip.ts";
import { createNetns, deleteNetns } from "./sim.ts";
import {
  DEFAULT_MARKS,
  HOST_LINK_GROUP,
  type HostLinkSpec,
  isNodeEnd,
  nodeCommands,
  nodeRuleCommands,
  nodeTableRuleset,
  podCommands,
  podPolicyArgs,
  podRuleset,
  podRulesOf,
  resultRoutes,
} from "./host_link.ts";

const SPEC: HostLinkSpec = {
  nodeIfName: "enimh0123456789",
  podIfName: "host0",
  nodeMac: "0e:01:02:03:04:05",
  podMac: "0a:01:02:03:04:05",
  alias: "enim:c1/eth0",
  podAddresses: { ipv4: "10.99.0.11", ipv6: "fd00:99::11" },
  nodeSource: { ipv4: "10.99.0.2", ipv6: "fd00:99::2" },
  routes: [{ dst: "172.30.0.0/16" }, { dst: "fd00:30::/108" }, { dst: "10.99.0.2/32" }],
  table: 0x10000abc,
  marks: DEFAULT_MARKS,
};

Deno.test("the node side creates the pair with the pod end in the pod, and routes each pod address", () => {
  const cmds = nodeCommands(SPEC, "/proc/1/fd/7");
  assertEquals(cmds.map((c) => c.join(" ")), [
    `link add enimh0123456789 group ${HOST_LINK_GROUP} address 0e:01:02:03:04:05 alias enim:c1/eth0 type veth peer name host0 address 0a:01:02:03:04:05 netns /proc/1/fd/7`,
    "link set dev enimh0123456789 up",
    "route replace 10.99.0.11/32 dev enimh0123456789 src 10.99.0.2",
    "neigh replace 10.99.0.11 lladdr 0a:01:02:03:04:05 dev enimh0123456789 nud permanent",
    "route replace fd00:99::11/128 dev enimh0123456789 src fd00:99::2",
    "neigh replace fd00:99::11 lladdr 0a:01:02:03:04:05 dev enimh0123456789 nud permanent",
    "route replace default via 10.99.0.11 dev enimh0123456789 onlink table 268438204",
    "route replace ::/0 via fd00:99::11 dev enimh0123456789 onlink table 268438204",
  ]);
  // The IPv4 rules open the move's batch; the IPv6 ones have an `ip -6 -batch` of their own.
  assertEquals(nodeRuleCommands(SPEC, "10.99.0.11", "add").map((c) => c.join(" ")), [
    "rule add pref 1500 from 10.99.0.11 iif enimh0123456789 fwmark 0x1000/0x1000 lookup main suppress_prefixlength 31",
    "rule add pref 1501 from 10.99.0.11 iif enimh0123456789 fwmark 0x1000/0x1000 lookup 268438204",
  ]);
  assertEquals(nodeRuleCommands(SPEC, "fd00:99::11", "add").map((c) => c.join(" ")), [
    "rule add pref 1500 from fd00:99::11 iif enimh0123456789 fwmark 0x1000/0x1000 lookup main suppress_prefixlength 127",
    "rule add pref 1501 from fd00:99::11 iif enimh0123456789 fwmark 0x1000/0x1000 lookup 268438204",
  ]);
  assertEquals(nodeRuleCommands(SPEC, "fd00:99::11", "del").map((c) => c.join(" ")), [
    "rule del pref 1500 iif enimh0123456789",
    "rule del pref 1501 iif enimh0123456789",
  ]);
  // Every line is safe for `ip -batch`.
  for (const c of cmds) batchLine(c);
});

Deno.test("the pod side routes through the link-local gateway, answers through table 2000", () => {
  assertEquals(podCommands(SPEC).map((c) => c.join(" ")), [
    "link set dev host0 up",
    "neigh replace 169.254.1.1 lladdr 0e:01:02:03:04:05 dev host0 nud permanent",
    "neigh replace fe80::1 lladdr 0e:01:02:03:04:05 dev host0 nud permanent",
    "route add 172.30.0.0/16 via 169.254.1.1 dev host0 onlink src 10.99.0.11",
    "route add fd00:30::/108 via fe80::1 dev host0 src fd00:99::11",
    "route add 10.99.0.2/32 via 169.254.1.1 dev host0 onlink src 10.99.0.11",
    "route add 0.0.0.0/0 via 169.254.1.1 dev host0 onlink src 10.99.0.11 table 2000",
    "route add ::/0 via fe80::1 dev host0 src fd00:99::11 table 2000",
  ]);
});

Deno.test("an IPv4-only pod gets no IPv6 route, neighbour or rule", () => {
  const v4 = { ...SPEC, podAddresses: { ipv4: "10.99.0.11" } };
  const lines = podCommands(v4).map((c) => c.join(" "));
  assert(lines.every((l) => !l.includes("fe80::1") && !l.includes("fd00")), lines.join("\n"));
  const args = podPolicyArgs(v4, "/f", { ip: "/ip", nft: "/nft" });
  assertEquals(args, [
    "10.99.0.11",
    "",
    "0x2000/0x2000",
    "0x1000/0x1000",
    "2000",
    "/f",
    "/ip",
    "/nft",
  ]);
  assertEquals(podRulesOf(v4.podAddresses).map((r) => r.priority), [0, 0, 0, 0]);
  assertEquals(resultRoutes(v4), [
    { dst: "172.30.0.0/16", gw: "169.254.1.1" },
    { dst: "10.99.0.2/32", gw: "169.254.1.1" },
  ]);
});

Deno.test("the pod's ruleset marks by the pod end's name and zones its own Service traffic; the node's keeps redirects off the node ends", () => {
  const pod = podRuleset(SPEC, "eth0");
  assertStringIncludes(pod, 'iifname "host0" ip saddr 10.99.0.11 ct original zone set 25966');
  assertStringIncludes(pod, 'iifname "host0" ip6 saddr fd00:99::11 ct original zone set 25966');
  assertStringIncludes(
    pod,
    'iifname "host0" ct original zone != 25966 ct state new ct mark set ct mark | 0x1000',
  );
  assertStringIncludes(
    pod,
    'iifname "eth0" ct mark & 0x2000 == 0x2000 meta mark set meta mark | 0x2000',
  );
  assertStringIncludes(pod, "type route hook output priority mangle");
  assertStringIncludes(pod, "type filter hook forward priority filter; policy drop;");
  assertStringIncludes(
    pod,
    'oifname "eth0" ct original zone 25966 ip saddr 10.99.0.11 snat ip to 10.99.0.11',
  );
  const node = nodeTableRuleset();
  assertStringIncludes(node, `oifgroup ${HOST_LINK_GROUP} icmp type redirect drop`);
  assert(!node.includes("masquerade"), node);
  assertStringIncludes(
    node,
    `iifgroup ${HOST_LINK_GROUP} ct direction original ct state new ct mark set ct mark | 0x1000`,
  );
  assertStringIncludes(node, "ct status & snat == 0 meta mark & 0x4000 == 0");
  // The source check: after conntrack, before DNAT; no router advertisement or redirect
  // (issue 48), a link-local source for neighbour discovery only; a node end's source must
  // route back over it, or the packet be a reply whose answers do; nothing else comes in.
  assertStringIncludes(node, "type filter hook prerouting priority mangle; policy accept;");
  assertStringIncludes(node, `iifgroup ${HOST_LINK_GROUP} jump from_pod`);
  assertStringIncludes(
    node,
    [
      "\tchain from_pod {",
      "\t\ticmp type redirect counter drop",
      "\t\ticmpv6 type { nd-router-advert, nd-redirect } counter drop",
      "\t\tip6 saddr fe80::/10 icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } fib saddr . iif oif exists return",
      "\t\tip6 saddr fe80::/10 counter drop",
      "\t\tfib saddr . iif oif exists return",
      "\t\tct direction reply fib daddr . iif oif exists return",
      "\t\tcounter drop",
      "\t}",
    ].join("\n"),
  );
  assert(node.startsWith("table inet enim {}\ndelete table inet enim\n"), node);
  const legacy = nodeTableRuleset(["enimhold0000001"]);
  assertStringIncludes(
    legacy,
    `iifname { "enimhold0000001" } oifgroup != ${HOST_LINK_GROUP} masquerade`,
  );
  assert(isNodeEnd({ group: String(HOST_LINK_GROUP) }));
  assert(!isNodeEnd({ group: "default" }));
});

Deno.test({
  name:
    "the pod's ruleset loads again over itself (an earlier ADD in the same namespace) with its rules once, and a new pod end's name replaces the old",
  ignore: Deno.uid() !== 0,
  async fn() {
    const name = `enim-nft-${crypto.randomUUID().slice(0, 8)}`;
    await createNetns(name);
    try {
      const rules = async () => {
        const out = await netnsExec(name, [NFT_BIN, "list", "ruleset"]);
        assertEquals(out.code, 0, out.stderr);
        return out.stdout.split("\n").map((l) => l.trim()).filter((l) => /mark set/.test(l));
      };
      await nftApply(podRuleset(SPEC, "eth0"), { netns: `/run/netns/${name}` });
      const once = await rules();
      assertEquals(once.length, 6, once.join("\n"));
      await nftApply(podRuleset(SPEC, "eth0"), { netns: `/run/netns/${name}` });
      assertEquals(await rules(), once);
      await nftApply(podRuleset({ ...SPEC, podIfName: "hl9" }, "eth0"), {
        netns: `/run/netns/${name}`,
      });
      const renamed = await rules();
      assertEquals(renamed.length, 6, renamed.join("\n"));
      assert(renamed.every((l) => !l.includes('"host0"')), renamed.join("\n"));
      assertEquals(renamed.filter((l) => l.includes('iifname "hl9"')).length, 4);
    } finally {
      await deleteNetns(name);
    }
  },
});
