/**
 * A pod never configures its node over its host link (issue 48 point 4), on the real
 * kernel: a simulated node whose IPv6 forwarding is off (an IPv4-only cluster's node,
 * whose interfaces take router advertisements), one dual-stack enim pod with its host
 * link (the real agent and plugin), and from the pod, with raw sockets (what `NET_RAW`
 * opens: tests/support/raw_frames.ts), a router advertisement (a default route via the
 * pod, a SLAAC prefix), an ND redirect and an ICMP redirect on its host link. The
 * node's routes (every table, and the routes to the redirects' destinations) and
 * addresses are the same afterwards, and its node end's sysctls refuse all three.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { hostLinkMessagesArgv, RAW_FRAMES_NEEDS } from "./support/raw_frames.ts";
import { poll } from "../lib/async.ts";
import type { NetnsHandle } from "./support/vpc.ts";

const DEPS = await clientDeps("host_link_ra_test", [...TRAFFIC_NEEDS, ...RAW_FRAMES_NEEDS]);

const IP = "/usr/sbin/ip";
const SERVICE_CIDRS = ["172.30.0.0/16", "fd00:30::/108"];

/** What the node's routing and addresses are: every route of every table, the addresses. */
async function nodeState(node: SimulatedNode): Promise<string> {
  const { vpc } = node;
  const out: string[] = [];
  for (
    const argv of [
      ["-4", "route", "show", "table", "all"],
      ["-6", "route", "show", "table", "all"],
      ["-4", "route", "get", "198.51.100.7"],
      ["-6", "route", "get", "2001:db8:49::1"],
      ["-o", "addr", "show"],
    ]
  ) {
    const r = await vpc.exec(vpc.node, [IP, ...argv]);
    out.push(`$ ip ${argv.join(" ")} (exit ${r.code})\n${r.stdout}${r.stderr}`);
  }
  return out.join("\n");
}

/** The link-local address of `dev` in `ns` once its duplicate detection is over. */
async function linkLocal(node: SimulatedNode, ns: NetnsHandle | string, dev: string) {
  return await poll(async () => {
    const r = await node.vpc.exec(ns, [
      IP,
      "-6",
      "-o",
      "addr",
      "show",
      "dev",
      dev,
      "scope",
      "link",
    ]);
    if (r.code !== 0 || r.stdout.includes("tentative")) return null;
    return /inet6 (fe80::[0-9a-f:]+)\//.exec(r.stdout)?.[1] ?? null;
  }, { timeoutMs: 10_000, intervalMs: 100 });
}

Deno.test({
  name:
    "a pod with NET_RAW sends a router advertisement, an ND redirect and an ICMP redirect on its host link: the node's routes and addresses do not change",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const node = await SimulatedNode.start({ nodeNic: true, mock: { enis: 2 } });
    try {
      const { vpc } = node;
      const pod = await vpc.pod("ra");
      const res = await node.add(pod, {
        config: node.netconf("1.1.0", { serviceCidrs: SERVICE_CIDRS }),
      });
      const nodeEnd = res.interfaces.find((i) => i.sandbox === undefined && i.name !== "eth0")
        ?.name;
      assert(nodeEnd, `a node end in ${JSON.stringify(res.interfaces)}`);
      // An IPv4-only cluster's node: IPv6 forwarding off, so its interfaces take RAs.
      await vpc.sysctl(vpc.node, { "net/ipv6/conf/all/forwarding": "0" });
      const podLl = await linkLocal(node, pod, "host0");
      const nodeLl = await linkLocal(node, vpc.node, nodeEnd);
      assert(podLl && nodeLl, "both ends have link-local addresses");
      const link = await vpc.exec(pod, [IP, "-j", "link", "show", "dev", "host0"]);
      const mac = (JSON.parse(link.stdout) as { address: string }[])[0].address;

      await t.step(
        "the node end's sysctls refuse advertisements, redirects, source routes",
        async () => {
          const r = await vpc.exec(vpc.node, [
            "/bin/sh",
            "-c",
            'for f in ipv6/conf/$1/accept_ra ipv6/conf/$1/accept_redirects ipv4/conf/$1/accept_redirects ipv4/conf/$1/accept_source_route ipv6/conf/$1/accept_source_route; do printf "%s=" "$f"; cat "/proc/sys/net/$f"; done',
            "sh",
            nodeEnd,
          ]);
          assertEquals(r.code, 0, r.stderr);
          const values = Object.fromEntries(
            r.stdout.trim().split("\n").map((l) => l.replace(`/${nodeEnd}/`, "/<end>/").split("=")),
          );
          assertEquals(values, {
            "ipv6/conf/<end>/accept_ra": "0",
            "ipv6/conf/<end>/accept_redirects": "0",
            "ipv4/conf/<end>/accept_redirects": "0",
            "ipv4/conf/<end>/accept_source_route": "0",
            "ipv6/conf/<end>/accept_source_route": "0",
          });
        },
      );

      await t.step(
        "after the pod's advertisement and redirects the node is as it was",
        async () => {
          const before = await nodeState(node);
          const sent = await vpc.exec(
            pod,
            hostLinkMessagesArgv({
              dev: "host0",
              mac,
              node4: node.nic!.ipv4!,
              nodeLinkLocal: nodeLl,
            }),
          );
          assertEquals(sent.code, 0, sent.stderr);
          assertEquals(sent.stdout.trim(), "sent 3");
          // The kernel takes an advertisement as it arrives (the SLAAC address at once,
          // tentative); a second look after a moment catches anything slower.
          await new Promise((ok) => setTimeout(ok, 500));
          assertEquals(await nodeState(node), before);
        },
      );

      await t.step("the node's table counted what it dropped from the node end", async () => {
        const r = await vpc.exec(vpc.node, [
          "/usr/sbin/nft",
          "list",
          "chain",
          "inet",
          "enim",
          "from_pod",
        ]);
        assertEquals(r.code, 0, r.stderr);
        const counts = [
          ...r.stdout.matchAll(
            /(icmp type redirect|nd-router-advert, nd-redirect \}) counter packets (\d+)/g,
          ),
        ]
          .map((m) => Number(m[2]));
        assertEquals(counts.length, 2, r.stdout);
        assert(counts[0] >= 1 && counts[1] >= 2, r.stdout);
      });
    } catch (err) {
      console.error(await node.agentLog());
      throw err;
    } finally {
      await node.close();
    }
  },
});
