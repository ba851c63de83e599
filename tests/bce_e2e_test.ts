/**
 * End to end on the real kernel with the BCE provider: the agent (bce provider,
 * production permission set) and the plugin in a simulated node, against the
 * fake BCE server running inside the node namespace (tests/support/bce_fake_main.ts),
 * which plugs a veth device with the ENI's MAC when an ENI is attached.
 *
 * The subnet is dual-stack (the fake's subnet has an `ipv6Cidr`), so the
 * provider asks BCE for an IPv6 address on each new ENI and the pod gets both
 * families. One ENI is deleted behind enim's back while its pod owns it. A
 * second profile, `b`, has its own (IPv4-only) subnet and security group: a pod
 * that asks for it (`ENIM_PROFILE=b`) gets an ENI there, named in BCE's
 * description while it owns it, and the next pod of `b` names an inline group,
 * which replaces the ENI's until its DEL puts `b`'s back.
 */
import { z } from "zod";
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { AddrInfoSchema } from "../netns/ip.ts";
import { SimulatedNode } from "./support/node.ts";
import {
  FAKE_BCE_AGENT_TIMEOUTS,
  FakeBceProcess,
  type FakeBceState,
} from "./support/bce_fake_main.ts";
import type { NetnsHandle } from "./support/vpc.ts";

const AS_ROOT = Deno.uid() === 0;
const SUBNET = "10.99.0.0/24";
const GATEWAY = "10.99.0.1";
const SUBNET6 = "fd00:99::/64";
const GATEWAY6 = "fd00:99::1";
/** Profile b's subnet (its gateway is added to the VPC bridge by the test). */
const SUBNET_B = "10.98.0.0/24";
const GATEWAY_B = "10.98.0.1";
const INSTANCE = "i-e2enode01";
const AK = "AKIDenimE2E00000001";
/** Must never appear in any log line. */
const SECRET = "SK-e2e-secret-DO-NOT-LOG-5b1e9c0a44f2";
/** Must never appear in any log line. */
const SESSION_TOKEN = "ST-e2e-token-DO-NOT-LOG+Sess/ion==";

function podArgs(name: string, extra = ""): string {
  return `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1${extra}`;
}

/** The requests of `state` matching a method, a path and (optionally) a bare query key. */
function calls(state: FakeBceState, method: string, path: string | RegExp, action?: string) {
  return state.requests.filter((r) =>
    r.method === method &&
    (typeof path === "string" ? r.path === path : path.test(r.path)) &&
    (action === undefined || action in r.query)
  );
}

/** The global addresses of `ifName` in a pod namespace (`ip -j addr`). */
async function podAddresses(
  node: SimulatedNode,
  pod: NetnsHandle,
  ifName: string,
): Promise<string[]> {
  const out = await node.vpc.exec(pod, ["/usr/sbin/ip", "-j", "addr", "show", "dev", ifName]);
  if (out.code !== 0) return [];
  const links = z.array(z.looseObject({ addr_info: z.array(AddrInfoSchema) })).parse(
    JSON.parse(out.stdout),
  );
  return links.flatMap((l) => l.addr_info)
    .filter((a) => a.scope === "global")
    .map((a) => `${a.local}/${a.prefixlen}`);
}

/** Waits until `check` holds (polling), failing with `what`. */
async function waitFor(what: string, check: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function readLines(path: string): Promise<string[]> {
  const text = await Deno.readTextFile(path).catch((e) => {
    if (e instanceof Deno.errors.NotFound) return "";
    throw e;
  });
  return text.split("\n").filter((l) => l !== "");
}

Deno.test({
  name:
    "bce end to end: dual-stack ADD on a fresh ENI, DEL pools it, reuse, GC, an ENI deleted out of band, a pod of a second profile with an inline group, no secret logged",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({
      subnets: { ipv4: SUBNET, ipv6: SUBNET6 },
      startAgent: false,
      // The fake BCE server plugs the devices; the agent gets no simulator.
      deviceSimulator: false,
      logLevel: "debug",
      gc: { intervalSeconds: 3600, graceSeconds: 0 },
      provider: {
        name: "bce",
        settings: {
          credentialsFile: "/run/enim/bce-credentials.json",
          // endpoint and metadataUrl: set once the fake listens.
          securityGroupIds: ["g-e2e0001"],
          warmPool: { minIdle: 0, maxIdle: 4 },
          maxEnisPerNode: 4,
          profiles: {
            b: {
              subnetId: "sbn-e2e0002",
              securityGroupIds: ["g-e2e0002"],
              warmPool: { minIdle: 0, maxIdle: 2 },
              allowedSecurityGroupIds: ["g-e2einl1"],
            },
          },
          timeouts: {
            ...FAKE_BCE_AGENT_TIMEOUTS,
            // Passes every 0.5 s at most 2 s apart, so the out-of-band deletion shows quickly.
            poolIntervalMs: 500,
            idleIntervalMs: 2000,
            minPassGapMs: 100,
          },
        },
      },
    });
    // The credentials file, mode 0600, in the node's /run/enim (read-allowed for enim).
    await Deno.writeTextFile(
      node.sandbox.host("bce-credentials.json"),
      JSON.stringify({ accessKeyId: AK, secretAccessKey: SECRET, sessionToken: SESSION_TOKEN }),
      { mode: 0o600 },
    );
    await Deno.chmod(node.sandbox.host("bce-credentials.json"), 0o600);
    await using fake = await FakeBceProcess.start({
      nodeNetns: node.vpc.node.name,
      vpcNetns: node.vpc.vpc.name,
      bridge: node.vpc.bridge,
      subnet: { subnetId: "sbn-e2e0001", cidr: SUBNET, ipv6Cidr: SUBNET6, zoneName: "cn-bj-a" },
      otherSubnets: [{ subnetId: "sbn-e2e0002", cidr: SUBNET_B, zoneName: "cn-bj-a" }],
      securityGroups: ["g-e2e0001", "g-e2e0002", "g-e2einl1"],
      instanceId: INSTANCE,
      eniQuota: 8,
      credentials: [{ accessKeyId: AK, secretAccessKey: SECRET, sessionToken: SESSION_TOKEN }],
    });
    assertStringIncludes(fake.url, "http://127.0.0.1:");
    await node.editConfig((cfg) => {
      const bce = (cfg.provider as { bce: Record<string, unknown> }).bce;
      bce.endpoint = fake.url;
      bce.metadataUrl = fake.metadataUrl;
    });
    try {
      await node.startAgent();
    } catch (err) {
      throw new Error(`${(err as Error).message}\nfake BCE:\n${fake.output().join("\n")}`);
    }

    const initial = await node.client.status();
    assertEquals(initial.provider, "bce");
    assertEquals(initial.pool.free + initial.pool.owned, 0);
    assertEquals((await fake.state()).enis, []);

    let eniId = "";
    let mac = "";
    let podA: NetnsHandle | null = null;
    let podB: NetnsHandle | null = null;
    await t.step(
      "ADD gets a freshly created and attached dual-stack ENI; the pod pings both gateways",
      async () => {
        const pod = podA = await node.vpc.pod("bce-a");
        const add = await node.cni("ADD", {
          containerId: "c-bce-a",
          ifName: "eth0",
          netns: pod.path,
          args: podArgs("bce-a"),
          config: node.netconf(),
        });
        assertEquals(add.code, 0, add.stdout + add.stderr + (await node.agentLog()));
        mac = (add.json!.interfaces as { mac: string }[])[0].mac;
        const ips = add.json!.ips as { address: string; gateway: string }[];
        assertEquals(ips.length, 2, JSON.stringify(ips));
        assertEquals(ips[0].gateway, GATEWAY);
        assertEquals(ips[1].gateway, GATEWAY6);

        // The fake created it and attached it to this node for this ADD.
        const state = await fake.state();
        assertEquals(state.enis.length, 1);
        const eni = state.enis[0];
        eniId = eni.eniId;
        assertEquals(eni.macAddress, mac);
        assertEquals(eni.status, "inuse");
        assertEquals(eni.instanceId, INSTANCE);
        assert(eni.name.startsWith(`enim/${INSTANCE}/`), eni.name);
        assertEquals(eni.securityGroupIds, ["g-e2e0001"]);
        assertEquals(`${eni.privateIpSet[0].privateIpAddress}/24`, ips[0].address);
        assertEquals(`${eni.ipv6PrivateIpSet[0].privateIpAddress}/64`, ips[1].address);
        const creates = calls(state, "POST", "/v1/eni").filter((r) => r.status === 200);
        assertEquals(creates.length, 1);
        assert(creates[0].query.clientToken, "the create carries a clientToken");
        // IPv6 was asked for because the subnet has an ipv6Cidr.
        assertEquals(
          z.object({ ipv6PrivateIpSet: z.array(z.unknown()) }).parse(creates[0].body)
            .ipv6PrivateIpSet.length,
          1,
        );
        const attaches = calls(state, "PUT", `/v1/eni/${eniId}`, "attach")
          .filter((r) => r.status === 200);
        assertEquals(attaches.length, 1);
        assert(
          state.requests.indexOf(creates[0]) < state.requests.indexOf(attaches[0]),
          "create came before attach",
        );

        const st = await node.client.status();
        assertEquals(st.pool.owned, 1);
        assertEquals(st.enis.find((e) => e.id === eniId)?.owner?.containerId, "c-bce-a");
        assert(await node.vpc.ping(pod, GATEWAY), "the pod pings its gateway");
        // Both families are configured in the pod, and IPv6 works too.
        assertEquals(
          (await podAddresses(node, pod, "eth0")).sort(),
          ips.map((i) => i.address).sort(),
        );
        assert(await node.vpc.ping(pod, GATEWAY6), "the pod pings its IPv6 gateway");
      },
    );

    await t.step("DEL returns it to the pool without a detach", async () => {
      const del = await node.cni("DEL", {
        containerId: "c-bce-a",
        ifName: "eth0",
        netns: podA!.path,
        args: podArgs("bce-a"),
        config: node.netconf(),
      });
      assertEquals(del.code, 0, del.stdout + del.stderr);
      const after = await node.client.status();
      assertEquals([after.pool.free, after.pool.owned], [1, 0]);
      const s = await fake.state();
      assertEquals(s.enis.map((e) => [e.eniId, e.status]), [[eniId, "inuse"]]);
      assertEquals(calls(s, "PUT", /^\/v1\/eni\//, "detach"), []);
      assertEquals(calls(s, "DELETE", /^\/v1\/eni\//), []);
      await node.vpc.deletePod(podA!);
    });

    await t.step("a second pod reuses the pooled ENI (no new create)", async () => {
      const pod = podB = await node.vpc.pod("bce-b");
      const add = await node.cni("ADD", {
        containerId: "c-bce-b",
        ifName: "eth0",
        netns: pod.path,
        args: podArgs("bce-b"),
        config: node.netconf(),
      });
      assertEquals(add.code, 0, add.stdout + add.stderr);
      assertEquals((add.json!.interfaces as { mac: string }[])[0].mac, mac);
      assert(await node.vpc.ping(pod, GATEWAY), "the second pod pings its gateway");
      const s = await fake.state();
      assertEquals(s.enis.length, 1);
      assertEquals(calls(s, "POST", "/v1/eni").filter((r) => r.status === 200).length, 1);
      assertEquals(calls(s, "PUT", /^\/v1\/eni\//, "attach").length, 1);
    });

    await t.step("GC of the dead pod (namespace deleted, no DEL) frees it", async () => {
      await node.vpc.deletePod(podB!);
      const report = await node.client.gc({ dryRun: false });
      assertEquals(
        report.items.map((i) => [i.eniId, i.containerId, i.outcome]),
        [[eniId, "c-bce-b", "reclaimed"]],
      );
      const after = await node.client.status();
      assertEquals([after.pool.free, after.pool.owned], [1, 0]);
      assertEquals(await node.client.attachments(), []);
      const s2 = await fake.state();
      assertEquals(s2.enis.map((e) => [e.eniId, e.status]), [[eniId, "inuse"]]);
      assertEquals(calls(s2, "PUT", /^\/v1\/eni\//, "detach"), []);
    });

    await t.step("the freed ENI serves a third pod", async () => {
      const pod = await node.vpc.pod("bce-c");
      const call = {
        containerId: "c-bce-c",
        ifName: "eth0",
        netns: pod.path,
        args: podArgs("bce-c"),
        config: node.netconf(),
      };
      const add = await node.cni("ADD", call);
      assertEquals(add.code, 0, add.stdout + add.stderr + (await node.agentLog()));
      assertEquals((add.json!.interfaces as { mac: string }[])[0].mac, mac);
      assert(await node.vpc.ping(pod, GATEWAY), "the third pod pings its gateway");
      const del = await node.cni("DEL", call);
      assertEquals(del.code, 0, del.stdout + del.stderr);
      await node.vpc.deletePod(pod);
      const s = await fake.state();
      assertEquals(calls(s, "POST", "/v1/eni").filter((r) => r.status === 200).length, 1);
    });

    await t.step(
      "an ENI deleted out of band while its pod owns it: logged with the pod, DEL and a new ADD work",
      async () => {
        const pod = await node.vpc.pod("bce-d");
        const call = {
          containerId: "c-bce-d",
          ifName: "eth0",
          netns: pod.path,
          args: podArgs("bce-d"),
          config: node.netconf(),
        };
        const add = await node.cni("ADD", call);
        assertEquals(add.code, 0, add.stdout + add.stderr);
        const owned = (await node.client.status()).enis.find((e) =>
          e.owner?.containerId === "c-bce-d"
        );
        assert(owned, "pod d owns an ENI");
        // Someone deletes it in the console: BCE detaches it (the device leaves the pod) and deletes it.
        await fake.outOfBand("delete", owned.id);
        await waitFor(
          "the agent to notice",
          async () =>
            (await node.agentLog()).split("\n").some((l) =>
              l.includes("changed out of band") && l.includes(owned.id) &&
              l.includes("default/bce-d")
            ),
        );
        const line = (await node.agentLog()).split("\n").find((l) =>
          l.includes("changed out of band")
        )!;
        const parsed = z.looseObject({ level: z.string(), why: z.string(), action: z.string() })
          .parse(JSON.parse(line));
        assertEquals([parsed.level, parsed.why], ["error", "deleted out of band"]);
        assertStringIncludes(parsed.action, 'pod "default/bce-d"');
        assertEquals(await podAddresses(node, pod, "eth0"), [], "the pod lost its interface");

        // DEL works (the device is gone with its ENI); the agent forgets the ENI.
        const del = await node.cni("DEL", call);
        assertEquals(del.code, 0, del.stdout + del.stderr);
        const after = await node.client.status();
        assert(!after.enis.some((e) => e.id === owned.id), "the lost ENI is forgotten");
        assertEquals(await node.client.attachments(), []);
        await node.vpc.deletePod(pod);

        // The next pod gets a new ENI: the lost one never held a slot and is never reused.
        const pod2 = await node.vpc.pod("bce-e");
        const call2 = { ...call, containerId: "c-bce-e", netns: pod2.path, args: podArgs("bce-e") };
        const add2 = await node.cni("ADD", call2);
        assertEquals(add2.code, 0, add2.stdout + add2.stderr + (await node.agentLog()));
        assert(await node.vpc.ping(pod2, GATEWAY), "the next pod pings its gateway");
        const s = await fake.state();
        assert(!s.enis.some((e) => e.eniId === owned.id));
        assertEquals((await node.cni("DEL", call2)).code, 0);
        await node.vpc.deletePod(pod2);
      },
    );

    let eniB = "";
    let macB = "";
    await t.step(
      "a pod of profile b gets an ENI in b's subnet with b's group, named in BCE while it owns it",
      async () => {
        // The simulated VPC routes b's subnet too: its gateway on the bridge.
        const gw = await node.vpc.exec(node.vpc.vpc, [
          "/usr/sbin/ip",
          "addr",
          "add",
          `${GATEWAY_B}/24`,
          "dev",
          node.vpc.bridge,
        ]);
        assertEquals(gw.code, 0, gw.stderr);
        const pod = await node.vpc.pod("bce-f");
        const call = {
          containerId: "c-bce-f",
          ifName: "eth0",
          netns: pod.path,
          args: podArgs("bce-f", ";ENIM_PROFILE=b"),
          config: node.netconf(),
        };
        const add = await node.cni("ADD", call);
        assertEquals(add.code, 0, add.stdout + add.stderr + (await node.agentLog()));
        const ips = add.json!.ips as { address: string; gateway: string }[];
        assertEquals(ips.length, 1, "b's subnet is IPv4 only");
        assertStringIncludes(ips[0].address, "10.98.0.");
        assertEquals(ips[0].gateway, GATEWAY_B);
        macB = (add.json!.interfaces as { mac: string }[])[0].mac;
        assert(await node.vpc.ping(pod, GATEWAY_B), "the pod of b pings b's gateway");
        const s = await fake.state();
        const eni = s.enis.find((e) => e.macAddress === macB)!;
        eniB = eni.eniId;
        assertEquals(
          [eni.subnetId, eni.securityGroupIds, eni.status, eni.instanceId],
          ["sbn-e2e0002", ["g-e2e0002"], "inuse", INSTANCE],
        );
        const b = (await node.client.status()).pool.profiles.b;
        assertEquals([b.free, b.owned], [0, 1]);
        // The description names the pod once the ADD has answered.
        await waitFor(
          "the description to name the pod",
          async () =>
            (await fake.state()).enis.find((e) => e.eniId === eniB)?.description.startsWith(
              "default/bce-f on ",
            ) ?? false,
        );
        const del = await node.cni("DEL", call);
        assertEquals(del.code, 0, del.stdout + del.stderr);
        await node.vpc.deletePod(pod);
        await waitFor(
          "the configured description to come back",
          async () =>
            (await fake.state()).enis.find((e) => e.eniId === eniB)?.description ===
              "created by enim, do not modify",
        );
        const after = (await node.client.status()).pool.profiles.b;
        assertEquals([after.free, after.owned], [1, 0]);
      },
    );

    await t.step(
      "the next pod of b names an inline group: it replaces the pooled ENI's until the DEL",
      async () => {
        const pod = await node.vpc.pod("bce-g");
        const call = {
          containerId: "c-bce-g",
          ifName: "eth0",
          netns: pod.path,
          args: podArgs("bce-g", ";ENIM_PROFILE=b;ENIM_SECURITY_GROUP_IDS=g-e2einl1"),
          config: node.netconf(),
        };
        const add = await node.cni("ADD", call);
        assertEquals(add.code, 0, add.stdout + add.stderr + (await node.agentLog()));
        assertEquals((add.json!.interfaces as { mac: string }[])[0].mac, macB, "the pooled ENI");
        assert(await node.vpc.ping(pod, GATEWAY_B), "the pod pings b's gateway");
        let s = await fake.state();
        assertEquals(s.enis.find((e) => e.eniId === eniB)?.securityGroupIds, ["g-e2einl1"]);
        const binds = calls(s, "PUT", `/v1/eni/${eniB}`, "bindSg");
        assertEquals(binds.map((r) => r.body), [{ securityGroupIds: ["g-e2einl1"] }]);
        const del = await node.cni("DEL", call);
        assertEquals(del.code, 0, del.stdout + del.stderr);
        // As a runtime does: the namespace goes right after the DEL, whose answer came before
        // its device was home (the agent holds the namespace); the agent's reads wait for
        // the rest, the pooled ENI's own groups back.
        await node.vpc.deletePod(pod);
        assertEquals((await node.client.status()).pool.profiles.b.free, 1);
        s = await fake.state();
        assertEquals(s.enis.find((e) => e.eniId === eniB)?.securityGroupIds, ["g-e2e0002"]);
        // A default pod never got b's ENI, nor b's pod a default one.
        assertEquals(
          s.enis.filter((e) => e.subnetId === "sbn-e2e0002").map((e) => e.eniId),
          [eniB],
        );
      },
    );

    await t.step("no log line holds the secret key or the session token", async () => {
      await node.stopAgent();
      await fake.close();
      const agent = await readLines(node.logPath);
      const agentStderr = await readLines(node.sandbox.host("agent.stderr"));
      const plugin = await readLines(node.sandbox.host("cni.log"));
      const fakeOut = fake.output();
      assert(agent.length > 0, "the agent logged");
      assert(plugin.length > 0, "the plugin logged");
      // The provider did log about BCE (so the grep covers its lines): it names the key id.
      assert(
        agent.some((l) => l.includes(AK) && l.includes("BCE provider configured")),
        "the agent's log names the access key id",
      );
      assert(agent.some((l) => l.includes(eniId)), "the agent's log names the ENI");
      for (
        const [what, lines] of [
          ["agent log", agent],
          ["agent stderr", agentStderr],
          ["plugin log", plugin],
          ["fake BCE output", fakeOut],
        ] as const
      ) {
        for (const line of lines) {
          for (const secret of [SECRET, SESSION_TOKEN, "bce-auth-v1/"]) {
            assert(
              !line.includes(secret),
              `${what} leaks a secret: ${
                line.replaceAll(SECRET, "<SECRET>").replaceAll(SESSION_TOKEN, "<TOKEN>")
              }`,
            );
          }
        }
      }
    });
  },
});
