/**
 * End to end on the real kernel: the plugin, exec'd as a runtime does, against the
 * agent (mock provider) in a simulated node and VPC.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { AddResultSchema, SimulatedNode } from "./support/node.ts";
import { SUPPORTED_VERSIONS } from "../cni/negotiate.ts";
import type { NetnsHandle } from "./support/vpc.ts";
import { ipJson } from "../netns/ip.ts";
import { LinkSchema } from "../netns/types.ts";
import { z } from "zod";
import { poll } from "../lib/async.ts";

const AS_ROOT = Deno.uid() === 0;

const AddrList = z.array(z.looseObject({
  ifname: z.string(),
  address: z.string().optional(),
  addr_info: z.array(z.looseObject({ local: z.string(), prefixlen: z.number(), scope: z.string() }))
    .default([]),
}));

function podArgs(name: string): string {
  return `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`;
}

async function linksIn(_node: SimulatedNode, netns: string) {
  return await ipJson(z.array(LinkSchema), ["link", "show"], { netns });
}

async function globalAddrs(netns: string, dev: string): Promise<string[]> {
  const out = await ipJson(AddrList, ["addr", "show", "dev", dev], { netns });
  return out.flatMap((l) => l.addr_info.filter((a) => a.scope === "global"))
    .map((a) => `${a.local}/${a.prefixlen}`);
}

Deno.test({
  name: "ADD puts the ENI in the pod, configured and reachable, for every spec version",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 8 } });
    for (const version of SUPPORTED_VERSIONS) {
      await t.step(`cniVersion ${version}`, async () => {
        const tag = version.replaceAll(".", "");
        const a = await node.vpc.pod(`a${tag}`);
        const b = await node.vpc.pod(`b${tag}`);
        const res = await node.add(a, {
          containerId: `ca${tag}`,
          args: podArgs(`a${tag}`),
          version,
        });
        assertEquals(res.cniVersion, version);
        const ifaces = res.interfaces;
        // The ENI's interface, then (a Kubernetes pod: K8S_POD_NAMESPACE) its host link's
        // node end and pod end (tests/host_link_test.ts).
        assertEquals(ifaces.map((i) => [i.name.replace(/^enimh.*/, "enimh…"), i.sandbox]), [
          ["eth0", a.path],
          ["enimh…", undefined],
          ["host0", a.path],
        ]);
        const ips = res.ips;
        assertEquals(ips.length, 2);
        for (const ip of ips) {
          assertEquals(ip.interface, 0);
          if (version.startsWith("0.")) assert(ip.version === "4" || ip.version === "6");
          else assertEquals(ip.version, undefined);
        }
        // Inside the pod: the name, the MAC, both addresses, default routes.
        const links = await linksIn(node, a.name);
        const eth0 = links.find((l) => l.ifname === "eth0");
        assert(eth0, "eth0 exists in the pod");
        assertEquals(eth0.address, ifaces[0].mac);
        const addrs = await globalAddrs(a.name, "eth0");
        assertEquals(addrs.sort(), ips.map((i) => i.address).sort());
        const r4 = await node.vpc.exec(a, ["/usr/sbin/ip", "-4", "route", "show", "default"]);
        assertStringIncludes(r4.stdout, `via ${node.vpc.gateways.ipv4} dev eth0`);
        const r6 = await node.vpc.exec(a, ["/usr/sbin/ip", "-6", "route", "show", "default"]);
        assertStringIncludes(r6.stdout, `via ${node.vpc.gateways.ipv6} dev eth0`);
        assert(await node.vpc.ping(a, node.vpc.gateways.ipv4!), "ping the IPv4 gateway");
        assert(await node.vpc.ping(a, node.vpc.gateways.ipv6!), "ping the IPv6 gateway");

        const addB = await node.add(b, {
          containerId: `cb${tag}`,
          args: podArgs(`b${tag}`),
          version,
        });
        const bIps = addB.ips.map((i) => i.address.split("/")[0]);
        for (const ip of bIps) assert(await node.vpc.ping(a, ip), `pod a pings pod b at ${ip}`);

        // CHECK passes after ADD.
        const check = await node.cni("CHECK", {
          containerId: `ca${tag}`,
          ifName: "eth0",
          netns: a.path,
          args: podArgs(`a${tag}`),
          config: node.netconf(version, { prevResult: res }),
        });
        if (version.startsWith("0.3")) {
          // CHECK does not exist before 0.4.0.
          assert(check.code !== 0);
        } else {
          assertEquals(check.code, 0, check.stdout + check.stderr);
        }

        // DEL: the device is back on the node under its name, without addresses.
        const nodeName = eth0.ifalias!;
        assert(nodeName, "the pod interface keeps the node-side name in its alias");
        for (const [pod, cid] of [[a, `ca${tag}`], [b, `cb${tag}`]] as [NetnsHandle, string][]) {
          const del = await node.cni("DEL", {
            containerId: cid,
            ifName: "eth0",
            netns: pod.path,
            args: podArgs(pod.name),
            config: node.netconf(version),
          });
          assertEquals(del.code, 0, del.stdout + del.stderr);
        }
        const back = (await linksIn(node, node.vpc.node.name)).find((l) =>
          l.address === ifaces[0].mac
        );
        assert(back, "the device is back in the node namespace");
        assertEquals(back.ifname, nodeName);
        assertEquals(await globalAddrs(node.vpc.node.name, nodeName), []);
        assert(!(await linksIn(node, a.name)).some((l) => l.ifname === "eth0"));
        // A second DEL succeeds.
        const again = await node.cni("DEL", {
          containerId: `ca${tag}`,
          ifName: "eth0",
          netns: a.path,
          config: node.netconf(version),
        });
        assertEquals(again.code, 0, again.stdout);
        await node.vpc.deletePod(a);
        await node.vpc.deletePod(b);
      });
    }
    const status = await node.client.status();
    assertEquals(status.pool.owned, 0);
  },
});

Deno.test({
  name: "DEL after the pod namespace was deleted succeeds and the ENI is usable again",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 1 } });
    const pod = await node.vpc.pod("gone");
    const mac = (await node.add(pod)).interfaces[0].mac;
    await node.vpc.deletePod(pod);
    const del = await node.cni("DEL", {
      containerId: "c-gone",
      ifName: "eth0",
      netns: pod.path,
      config: node.netconf(),
    });
    assertEquals(del.code, 0, del.stdout + del.stderr);
    // The only ENI is allocatable again, and its device is on the node.
    const pod2 = await node.vpc.pod("next");
    assertEquals((await node.add(pod2)).interfaces[0].mac, mac);
    assert(await node.vpc.ping(pod2, node.vpc.gateways.ipv4!));
  },
});

Deno.test({
  name:
    "DEL answers before the device is home, and a runtime removing the namespace at once loses nothing: the agent holds it, the same device comes home",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 1 } });
    const pod = await node.vpc.pod("quick");
    const mac = (await node.add(pod)).interfaces[0].mac;
    // The VPC's end of the ENI's veth: it would die with the pod's namespace if the
    // device were still in it when the namespace went.
    const peerBefore = (await linksIn(node, node.vpc.vpc.name)).map((l) => l.ifindex).sort();
    const del = await node.cni("DEL", {
      containerId: "c-quick",
      ifName: "eth0",
      netns: pod.path,
      config: node.netconf(),
    });
    assertEquals(del.code, 0, del.stdout + del.stderr);
    // As containerd does right after a DEL: the namespace's path goes.
    await node.vpc.deletePod(pod);
    // The agent's reads wait for the DEL's rest.
    const s = await node.client.status();
    assertEquals([s.pool.owned, s.pool.free], [0, 1]);
    assertEquals(await node.client.attachments(), []);
    const home = (await linksIn(node, node.vpc.node.name)).find((l) => l.address === mac);
    assert(home, "the ENI's device is on the node");
    assertEquals(
      (await linksIn(node, node.vpc.vpc.name)).map((l) => l.ifindex).sort(),
      peerBefore,
      "the same veth: never destroyed with the namespace and made again",
    );
    const log = await node.agentLog();
    assert(!log.includes("vanished ENI device"), "no repair was needed");
    assert(!log.includes("device is missing"), "no device went missing");
    const pod2 = await node.vpc.pod("after");
    assertEquals((await node.add(pod2)).interfaces[0].mac, mac);
    assert(await node.vpc.ping(pod2, node.vpc.gateways.ipv4!));
  },
});

Deno.test({
  name: "ADD with an interface name that exists in the pod fails and leaves nothing behind",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const pod = await node.vpc.pod("clash");
    await node.vpc.exec(pod, [
      "/usr/sbin/ip",
      "link",
      "add",
      "eth0",
      "type",
      "veth",
      "peer",
      "name",
      "other0",
    ]);
    const before = await node.client.status();
    const add = await node.cni("ADD", {
      containerId: "c-clash",
      ifName: "eth0",
      netns: pod.path,
      args: podArgs("clash"),
      config: node.netconf(),
    });
    assertEquals(add.code, 1);
    const err = JSON.parse(add.stdout);
    assertMatch(err.msg, /eth0/);
    const after = await node.client.status();
    assertEquals(after.pool, before.pool);
    assertEquals(await node.client.attachments(), []);
    // Every ENI device is still on the node, with no addresses.
    for (const eni of after.enis) {
      const link = (await linksIn(node, node.vpc.node.name)).find((l) => l.address === eni.mac);
      assert(link, `ENI ${eni.id} is on the node`);
      assertEquals(await globalAddrs(node.vpc.node.name, link.ifname), []);
    }
  },
});

Deno.test({
  name: "CHECK fails after someone removes an address inside the pod",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 1 } });
    const pod = await node.vpc.pod("chk");
    const call = {
      containerId: "c-chk",
      ifName: "eth0",
      netns: pod.path,
      args: podArgs("chk"),
    };
    const prev = await node.add(pod, call);
    const ok = await node.cni("CHECK", {
      ...call,
      config: node.netconf("1.1.0", { prevResult: prev }),
    });
    assertEquals(ok.code, 0, ok.stdout + ok.stderr);
    const v4 = prev.ips.find((i) => i.address.includes("."))!;
    await node.vpc.exec(pod, ["/usr/sbin/ip", "addr", "del", v4.address, "dev", "eth0"]);
    const bad = await node.cni("CHECK", {
      ...call,
      config: node.netconf("1.1.0", { prevResult: prev }),
    });
    assertEquals(bad.code, 1);
    assertStringIncludes(JSON.parse(bad.stdout).msg + JSON.parse(bad.stdout).details, v4.address);
    // CHECK for an attachment the agent does not know fails.
    const unknown = await node.cni("CHECK", {
      ...call,
      containerId: "c-unknown",
      config: node.netconf("1.1.0", { prevResult: prev }),
    });
    assertEquals(unknown.code, 1);
  },
});

Deno.test({
  name: "the seed README's IPAM example (CNI_NETNS=/dev/null) prints the seed's IPAM result",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 1 } });
    const config = {
      cniVersion: "1.0.10",
      name: "examplenet",
      ipam: { type: "enim" },
    };
    const add = await node.cni("ADD", {
      containerId: "example",
      ifName: "dummy0",
      netns: "/dev/null",
      config,
    });
    assertEquals(add.code, 0, add.stdout + add.stderr);
    const res = add.json!;
    const ips = res.ips as { address: string; gateway: string; interface: number }[];
    assertEquals(ips.length, 2);
    const eni = (await node.client.status()).enis.find((e) => e.owner !== null)!;
    const link = (await linksIn(node, node.vpc.node.name)).find((l) => l.address === eni.mac)!;
    for (const ip of ips) {
      assertEquals(ip.interface, link.ifindex);
      assertMatch(ip.address, /\/\d+$/);
    }
    assertEquals(res.interfaces, [{ mac: eni.mac }]);
    // The device stays on the node in IPAM mode.
    assert(link, "the device stays on the node");
    const del = await node.cni("DEL", {
      containerId: "example",
      ifName: "dummy0",
      netns: "/dev/null",
      config,
    });
    assertEquals(del.code, 0, del.stdout);
    assertEquals((await node.client.status()).pool.owned, 0);
  },
});

Deno.test({
  name: "through the plugin process the agent validates env, config and version as the spec says",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const pod = await node.vpc.pod("v");
    const call = (config: Record<string, unknown> | string, ifName = "eth0") =>
      node.cni("ADD", { containerId: "cv", ifName, netns: pod.path, args: podArgs("v"), config });
    const codeOf = (r: { code: number; json: Record<string, unknown> | null }) => {
      assertEquals(r.code, 1, JSON.stringify(r.json));
      return r.json!.code;
    };
    await t.step("a bad config field → 7 naming it", async () => {
      const r = await call(node.netconf("1.1.0", { mtu: 1 }));
      assertEquals(codeOf(r), 7);
      assertStringIncludes(String(r.json!.msg), "mtu");
    });
    await t.step("an unsupported version → 1", async () => {
      assertEquals(codeOf(await call(node.netconf("2.0.0"))), 1);
    });
    await t.step("a bad CNI_IFNAME → 4 naming it", async () => {
      const r = await call(node.netconf(), "a/b");
      assertEquals(codeOf(r), 4);
      assertStringIncludes(String(r.json!.msg), "CNI_IFNAME");
    });
    assertEquals((await node.client.attachments()).length, 0, "nothing was allocated");
  },
});

Deno.test({
  name: "DEL after the pod changed the interface's MAC brings the device back with its own MAC",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 1 } });
    const pod = await node.vpc.pod("m");
    const call = { containerId: "cm1", ifName: "eth0", netns: pod.path, args: podArgs("m") };
    const mac = (await node.add(pod, call)).interfaces[0].mac;
    // A MAC-setting plugin whose DEL did not restore it, or a pod with NET_ADMIN.
    for (
      const argv of [["link", "set", "eth0", "down"], [
        "link",
        "set",
        "eth0",
        "address",
        "02:66:00:00:00:01",
      ]]
    ) {
      const out = await node.vpc.exec(pod, ["/usr/sbin/ip", ...argv]);
      assertEquals(out.code, 0, out.stderr);
    }
    const del = await node.cni("DEL", { ...call, config: node.netconf() });
    assertEquals(del.code, 0, del.stdout);
    // The DEL answers once the rest cannot be lost (the agent holds the pod's namespace);
    // the device's move home and the host link's pod end follow on the attachment's lock.
    const only = async () => (await linksIn(node, pod.name)).map((l) => l.ifname).join(",");
    const settled = await poll(async () => (await only()) === "lo" ? "lo" : null, {
      timeoutMs: 5000,
      intervalMs: 50,
      maxIntervalMs: 500,
    });
    assertEquals(settled, "lo", `the pod holds only lo, not ${await only()}`);
    const onNode = (await linksIn(node, node.vpc.node.name)).filter((l) => l.address === mac);
    assertEquals(onNode.length, 1, "the device is on the node with the ENI's MAC again");
    assertEquals((await node.client.attachments()).length, 0);
    // The next pod gets the ENI (its only one) and its device.
    const pod2 = await node.vpc.pod("m2");
    assertEquals((await node.add(pod2)).interfaces[0].mac, mac);
  },
});

Deno.test({
  name: "every requested IP must be on the chosen ENI, or the ADD fails with 101 naming the others",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 3 } });
    const pod = await node.vpc.pod("ips");
    const add = (containerId: string, ips: string[]) =>
      node.cni("ADD", {
        containerId,
        ifName: "eth0",
        netns: pod.path,
        args: podArgs("ips"),
        config: node.netconf("1.1.0", { runtimeConfig: { ips } }),
      });
    const refused = async (ips: string[], missing: RegExp) => {
      const r = await add("cips-x", ips);
      assertEquals(r.code, 1, r.stdout);
      assertEquals(r.json!.code, 101);
      assertMatch(String(r.json!.msg), missing);
      assertEquals((await node.client.attachments()).length, 0, "nothing is allocated");
      assertEquals((await node.client.status()).pool.owned, 0);
    };
    await t.step(
      "two IPv4 addresses: the second is on no ENI with the first",
      () =>
        refused(
          ["10.99.0.2", "10.99.0.222"],
          /one primary IPv4 address: 10\.99\.0\.2 and 10\.99\.0\.222 were both asked for/,
        ),
    );
    await t.step(
      "an IPv4 and an IPv6 of different ENIs",
      () => refused(["10.99.0.2", "fd00:99::3"], /10\.99\.0\.2, fd00:99::3 are on different ENIs/),
    );
    await t.step("both of one ENI: that ENI, with exactly those addresses", async () => {
      const r = await add("cips-1", ["10.99.0.3/24", "fd00:99::3"]);
      assertEquals(r.code, 0, r.stdout);
      const ips = AddResultSchema.parse(r.json).ips.map((i) => i.address).sort();
      assertEquals(ips, ["10.99.0.3/24", "fd00:99::3/64"]);
    });
  },
});
