import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { batchLine, netnsExec, NFT_BIN, nftApply } from "./ip.ts";
import { createNetns, deleteNetns } from "./sim.ts";
import {
  HOST_LINK_GROUP,
  type HostLinkSpec,
  isNodeEnd,
  nodeCommands,
  nodeTableRuleset,
  podCommands,
  podPolicyArgs,
  podRuleset,
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
  assertEquals([args[0], args[7]], ["host0", ""]);
  assertEquals(resultRoutes(v4), [
    { dst: "172.30.0.0/16", gw: "169.254.1.1" },
    { dst: "10.99.0.2/32", gw: "169.254.1.1" },
  ]);
});

Deno.test("the rulesets mark by the pod end's name in the pod and by link group on the node", () => {
  const pod = podRuleset("host0");
  assertStringIncludes(pod, 'iifname "host0" ct state new ct mark set ct mark | 0x1000');
  assertStringIncludes(pod, "type route hook output priority mangle");
  const node = nodeTableRuleset();
  assertStringIncludes(node, `iifgroup ${HOST_LINK_GROUP} meta mark set meta mark | 0x1000`);
  assertStringIncludes(node, `oifgroup != ${HOST_LINK_GROUP} masquerade`);
  assert(node.startsWith("table inet enim {}\ndelete table inet enim\n"), node);
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
      await nftApply(podRuleset("host0"), { netns: `/run/netns/${name}` });
      const once = await rules();
      assertEquals(once.length, 3, once.join("\n"));
      await nftApply(podRuleset("host0"), { netns: `/run/netns/${name}` });
      assertEquals(await rules(), once);
      await nftApply(podRuleset("hl9"), { netns: `/run/netns/${name}` });
      const renamed = await rules();
      assertEquals(renamed.length, 3, renamed.join("\n"));
      assert(renamed.every((l) => !l.includes('"host0"')), renamed.join("\n"));
      assertEquals(renamed.filter((l) => l.includes('iifname "hl9"')).length, 2);
    } finally {
      await deleteNetns(name);
    }
  },
});
