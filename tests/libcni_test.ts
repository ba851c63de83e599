/**
 * libcni as the CNI client: tests/support/libcni/driver.go, a small program over Debian's libcni
 * (golang-github-appc-cni-dev, built with golang-go in GOPATH mode), runs AddNetworkList,
 * CheckNetworkList and DelNetworkList as containerd and CRI-O do, inside the simulated
 * node's sandbox (so the enim launcher it execs reaches the node's agent), against
 * conflists that chain enim with Debian's reference plugins.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";
import type { NetnsHandle } from "./support/vpc.ts";
import { clientDeps, pluginDir, runInNode, tempDir } from "./support/clients.ts";
import { ROOT } from "../scripts/_paths.ts";
import { aptNeeds } from "../scripts/_deps.ts";

const DEPS = await clientDeps(
  "libcni_test",
  aptNeeds("golang-go", "golang-github-appc-cni-dev", "containernetworking-plugins", "iptables"),
);

/** The conflists' spec version: Debian's libcni (1.1.2) knows up to 1.0.0. */
const CNI_VERSION = "1.0.0";

/** A driver request (see tests/support/libcni/driver.go). */
interface DriverRequest {
  op: "add" | "check" | "del";
  containerId: string;
  netns: string;
  ifName: string;
  args?: [string, string][];
  capabilityArgs?: Record<string, unknown>;
}

interface DriverAnswer {
  ok: boolean;
  result?: {
    cniVersion: string;
    interfaces?: { name: string; mac: string; sandbox?: string }[];
    ips?: { address: string; gateway?: string; interface?: number }[];
    routes?: { dst: string; gw?: string }[];
  };
  error?: string;
}

/** The driver, its plugin dir, cache dir and conflists in one temp directory. */
class Libcni {
  readonly dir: string;
  readonly node: SimulatedNode;

  private constructor(node: SimulatedNode, dir: string) {
    this.node = node;
    this.dir = dir;
  }

  /** Builds the driver (GOPATH mode, build cache in the temp dir) and the plugin dir. */
  static async create(node: SimulatedNode): Promise<Libcni> {
    const lc = new Libcni(node, await tempDir("enim-libcni"));
    try {
      await Deno.mkdir(`${lc.dir}/cache`);
      await Deno.mkdir(`${lc.dir}/tuning`);
      const t0 = performance.now();
      const build = await new Deno.Command("/usr/bin/go", {
        args: ["build", "-o", `${lc.dir}/driver`, `${ROOT}/tests/support/libcni/driver.go`],
        clearEnv: true,
        env: {
          PATH: "/usr/bin:/bin",
          HOME: lc.dir,
          GO111MODULE: "off",
          GOPATH: `/usr/share/gocode:${lc.dir}/gopath`,
          GOCACHE: `${lc.dir}/gocache`,
          GOFLAGS: "-mod=mod",
          CGO_ENABLED: "0",
        },
        stdout: "piped",
        stderr: "piped",
      }).output();
      if (!build.success) {
        throw new Error(
          `go build of the libcni driver failed:\n${new TextDecoder().decode(build.stderr)}`,
        );
      }
      console.error(
        `libcni_test: go build of the driver took ${
          ((performance.now() - t0) / 1000).toFixed(1)
        } s`,
      );
      await pluginDir(`${lc.dir}/plugins`, ["loopback", "tuning", "portmap", "host-device"]);
    } catch (err) {
      await lc.close();
      throw err;
    }
    return lc;
  }

  /** Writes a conflist and returns its path. */
  async conflist(name: string, plugins: Record<string, unknown>[], file = name): Promise<string> {
    const path = `${this.dir}/${file}.conflist`;
    await Deno.writeTextFile(
      path,
      JSON.stringify({ cniVersion: CNI_VERSION, name, plugins }, null, 2),
    );
    return path;
  }

  /** Runs one driver operation inside the node's sandbox. */
  async run(conflist: string, req: DriverRequest): Promise<DriverAnswer> {
    const out = await runInNode(
      this.node,
      [`${this.dir}/driver`],
      { HOME: this.dir },
      JSON.stringify({
        conflist,
        pluginDirs: [`${this.dir}/plugins`],
        cacheDir: `${this.dir}/cache`,
        ...req,
      }),
    );
    try {
      return JSON.parse(out.stdout);
    } catch {
      throw new Error(
        `the driver printed no answer (exit ${out.code}):\n${out.stdout}\n${out.stderr}`,
      );
    }
  }

  /** Like {@linkcode run}, failing the test unless the operation succeeded. */
  async ok(conflist: string, req: DriverRequest): Promise<DriverAnswer> {
    const a = await this.run(conflist, req);
    assert(
      a.ok,
      `libcni ${req.op} failed: ${a.error}\nagent log:\n${
        (await this.node.agentLog()).slice(-3000)
      }`,
    );
    return a;
  }

  async close(): Promise<void> {
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }
}

function podArgs(name: string): [string, string][] {
  return [["IgnoreUnknown", "1"], ["K8S_POD_NAMESPACE", "lc"], ["K8S_POD_NAME", name]];
}

async function inPod(node: SimulatedNode, pod: NetnsHandle, argv: string[]): Promise<string> {
  const out = await node.vpc.exec(pod, argv);
  assertEquals(out.code, 0, `${argv.join(" ")} in ${pod.name}: ${out.stderr}`);
  return out.stdout;
}

/** The node's iptables NAT table (portmap's rules live in the node's network namespace). */
async function natRules(node: SimulatedNode, family: 4 | 6): Promise<string> {
  const bin = family === 4 ? "/usr/sbin/iptables" : "/usr/sbin/ip6tables";
  const out = await runInNode(node, [bin, "-w", "-t", "nat", "-S"]);
  assertEquals(out.code, 0, out.stderr);
  return out.stdout;
}

Deno.test({
  name: "libcni: enim chained with tuning and portmap, add/check/del",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const lc = await Libcni.create(node);
    try {
      const chain = [
        { type: "enim", logFile: node.sandbox.inner("cni.log") },
        {
          type: "tuning",
          mtu: 1400,
          sysctl: { "net.ipv4.conf.eth0.arp_filter": "1" },
          dataDir: `${lc.dir}/tuning`,
        },
        { type: "portmap", capabilities: { portMappings: true }, snat: true },
      ];
      const conflist = await lc.conflist("enim-chain", chain);
      const pod = await node.vpc.pod("lc-chain");
      const call = {
        containerId: "lc-chain-1",
        netns: pod.path,
        ifName: "eth0",
        args: podArgs("chain"),
        capabilityArgs: {
          portMappings: [
            { hostPort: 8080, containerPort: 80, protocol: "tcp" },
            { hostPort: 8053, containerPort: 53, protocol: "udp" },
          ],
        },
      };
      const add = await lc.ok(conflist, { op: "add", ...call });
      const res = add.result!;
      assertEquals(res.cniVersion, CNI_VERSION);
      const status = await node.client.status();
      const eni = status.enis.find((e) => e.owner?.pod === "lc/chain");
      assert(eni, "the agent assigned an ENI to lc/chain");
      assertEquals(res.interfaces?.[0], { name: "eth0", mac: eni.mac, sandbox: pod.path });
      const v4 = eni.ipv4!, v6 = eni.ipv6!;
      assertEquals(
        res.ips?.map((i) => i.address).sort(),
        [`${v4.address}/${v4.prefixLength}`, `${v6.address}/${v6.prefixLength}`].sort(),
      );

      // Inside the pod: enim's device, address and routes; tuning's MTU and sysctl.
      const link = await inPod(node, pod, ["/usr/sbin/ip", "-o", "link", "show", "eth0"]);
      assertStringIncludes(link, `link/ether ${eni.mac}`);
      assertStringIncludes(link, "mtu 1400");
      const addr = await inPod(node, pod, ["/usr/sbin/ip", "-o", "addr", "show", "eth0"]);
      assertStringIncludes(addr, `inet ${v4.address}/${v4.prefixLength}`);
      assertStringIncludes(addr, `inet6 ${v6.address}/${v6.prefixLength}`);
      const route = await inPod(node, pod, ["/usr/sbin/ip", "-4", "route", "show", "default"]);
      assertStringIncludes(route, `via ${v4.gateway} dev eth0`);
      const arpFilter = await inPod(node, pod, [
        "/usr/bin/cat",
        "/proc/sys/net/ipv4/conf/eth0/arp_filter",
      ]);
      assertEquals(arpFilter.trim(), "1");
      assert(await node.vpc.ping(pod, v4.gateway), "the pod pings its gateway");

      // portmap's DNAT rules in the node's namespace point at the pod's addresses.
      const nat4 = await natRules(node, 4);
      assertMatch(nat4, new RegExp(`-p tcp .*--dport 8080 .*--to-destination ${v4.address}:80`));
      assertMatch(nat4, new RegExp(`-p udp .*--dport 8053 .*--to-destination ${v4.address}:53`));
      const nat6 = await natRules(node, 6);
      assertStringIncludes(nat6, `--to-destination [${v6.address}]:80`);

      // CHECK runs every plugin's CHECK with the cached result. Debian's portmap (plugins
      // 1.1.1) fails its own CHECK whenever ip6tables works: checkPorts looks for the IPv4
      // DNAT chain in ip6tables too (containernetworking/plugins#819, fixed after 1.1.1). So
      // the full chain's CHECK either passes (a fixed portmap) or fails with exactly that,
      // and the same network without portmap (libcni keys its cache by network name,
      // container and interface) must pass: enim's and tuning's CHECKs.
      const fullCheck = await lc.run(conflist, { op: "check", ...call });
      if (!fullCheck.ok) assertMatch(fullCheck.error!, /^could not check ipv6 dnat: /);
      const withoutPortmap = await lc.conflist("enim-chain", chain.slice(0, 2), "no-portmap");
      await lc.ok(withoutPortmap, { op: "check", ...call });

      // DEL (libcni runs the chain in reverse): portmap's rules go, the ENI is free again.
      await lc.ok(conflist, { op: "del", ...call });
      assertEquals((await node.client.status()).pool.owned, 0);
      assert(!(await natRules(node, 4)).includes(v4.address), "portmap's IPv4 rules are gone");
      assert(!(await natRules(node, 6)).includes(v6.address), "portmap's IPv6 rules are gone");
      const gone = await node.vpc.exec(pod, ["/usr/sbin/ip", "link", "show", "eth0"]);
      assert(gone.code !== 0, "eth0 left the pod");
      const back = await node.vpc.exec(node.vpc.node, ["/usr/sbin/ip", "-o", "link", "show"]);
      assertStringIncludes(back.stdout, eni.mac);
      // A second DEL (a runtime retrying) succeeds too.
      await lc.ok(conflist, { op: "del", ...call });
    } finally {
      await lc.close();
    }
  },
});

/**
 * The spec's own example chain: enim, then tuning setting the MAC from `runtimeConfig.mac`.
 * CHECK gets the final result, whose interface carries tuning's MAC: enim's CHECK must pass
 * (a later plugin changed what it owns), and a removed address the result lists must fail
 * it. DEL (tuning restores the MAC first) frees the ENI.
 */
Deno.test({
  name: "libcni: enim then tuning with runtimeConfig.mac, CHECK takes the prevResult as the truth",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const lc = await Libcni.create(node);
    try {
      const chain = [
        { type: "enim", logFile: node.sandbox.inner("cni.log") },
        { type: "tuning", capabilities: { mac: true }, dataDir: `${lc.dir}/tuning` },
      ];
      const conflist = await lc.conflist("enim-mac", chain);
      const pod = await node.vpc.pod("lc-mac");
      const mac = "02:5a:00:00:00:42";
      const call = {
        containerId: "lc-mac-1",
        netns: pod.path,
        ifName: "eth0",
        args: podArgs("mac"),
        capabilityArgs: { mac },
      };
      const add = await lc.ok(conflist, { op: "add", ...call });
      assertEquals(add.result!.interfaces?.[0]?.mac, mac, "the final result carries tuning's MAC");
      const link = await inPod(node, pod, ["/usr/sbin/ip", "-o", "link", "show", "eth0"]);
      assertStringIncludes(link, `link/ether ${mac}`);
      await lc.ok(conflist, { op: "check", ...call });
      // An address of the result removed from the pod: enim's CHECK names it.
      const v4 = add.result!.ips!.find((i) => !i.address.includes(":"))!.address;
      await inPod(node, pod, ["/usr/sbin/ip", "addr", "del", v4, "dev", "eth0"]);
      const broken = await lc.run(conflist, { op: "check", ...call });
      assert(!broken.ok, "CHECK fails once an address of the result is gone");
      assertStringIncludes(broken.error!, `lacks address ${v4}`);
      await lc.ok(conflist, { op: "del", ...call });
      assertEquals((await node.client.status()).pool.owned, 0);
      const enis = await node.client.enis();
      const back = await node.vpc.exec(node.vpc.node, ["/usr/sbin/ip", "-o", "link", "show"]);
      for (const e of enis) assertStringIncludes(back.stdout, e.mac);
    } finally {
      await lc.close();
    }
  },
});

/**
 * enim as IPAM under host-device, the reference plugin that hands a whole existing device
 * to a pod. host-device finds the device by `hwaddr` and moves it into the pod (renamed
 * CNI_IFNAME, its node name kept in the alias) *before* it calls IPAM, then configures the
 * IPAM result on it; on DEL it calls IPAM DEL first and then moves the device back. So the
 * config pins the ENI: `hwaddr` is its MAC and `IP=` (CNI_ARGS) asks enim for its address,
 * making enim allocate the very ENI whose device host-device moved.
 */
Deno.test({
  name: "libcni: enim as the IPAM plugin of host-device, add/check/del",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const lc = await Libcni.create(node);
    try {
      const eni = (await node.client.status()).enis[0];
      const v4 = eni.ipv4!, v6 = eni.ipv6!;
      const conflist = await lc.conflist("enim-hostdev", [{
        type: "host-device",
        hwaddr: eni.mac,
        ipam: { type: "enim", logFile: node.sandbox.inner("cni.log") },
      }]);
      const nodeLinks = async () =>
        (await node.vpc.exec(node.vpc.node, ["/usr/sbin/ip", "-o", "link", "show"])).stdout;
      const nodeName = (await nodeLinks()).split("\n").find((l) => l.includes(eni.mac))!
        .split(": ")[1].split("@")[0];
      // Twice, in two pods: the ENI is reusable after host-device's DEL.
      for (const name of ["hostdev-a", "hostdev-b"]) {
        const pod = await node.vpc.pod(`lc-${name}`);
        const call = {
          containerId: `lc-${name}`,
          netns: pod.path,
          ifName: "eth0",
          args: [...podArgs(name), ["IP", v4.address]] as [string, string][],
        };
        const add = await lc.ok(conflist, { op: "add", ...call });
        const res = add.result!;
        assertEquals(res.interfaces, [{ name: "eth0", mac: eni.mac, sandbox: pod.path }]);
        assertEquals(res.ips, [
          { interface: 0, address: `${v4.address}/${v4.prefixLength}`, gateway: v4.gateway },
          { interface: 0, address: `${v6.address}/${v6.prefixLength}`, gateway: v6.gateway },
        ]);
        const status = await node.client.status();
        assertEquals(status.enis.find((e) => e.id === eni.id)?.owner?.pod, `lc/${name}`);

        // Inside the pod: host-device's eth0 is the ENI, configured with enim's result.
        const link = await inPod(node, pod, ["/usr/sbin/ip", "-o", "link", "show", "eth0"]);
        assertStringIncludes(link, `link/ether ${eni.mac}`);
        assertStringIncludes(link, `alias ${nodeName}`);
        const addr = await inPod(node, pod, ["/usr/sbin/ip", "-o", "addr", "show", "eth0"]);
        assertStringIncludes(addr, `inet ${v4.address}/${v4.prefixLength}`);
        assertStringIncludes(addr, `inet6 ${v6.address}/${v6.prefixLength}`);
        const r4 = await inPod(node, pod, ["/usr/sbin/ip", "-4", "route", "show", "default"]);
        assertStringIncludes(r4, `via ${v4.gateway} dev eth0`);
        const r6 = await inPod(node, pod, ["/usr/sbin/ip", "-6", "route", "show", "default"]);
        assertStringIncludes(r6, `via ${v6.gateway} dev eth0`);
        assert(await node.vpc.ping(pod, v4.gateway), "the pod pings its gateway");
        assert(!(await nodeLinks()).includes(eni.mac), "the device left the node");

        await lc.ok(conflist, { op: "check", ...call });

        // DEL: enim releases the ENI and leaves the device to host-device, which moves it
        // back to the node under its node name.
        await lc.ok(conflist, { op: "del", ...call });
        assertEquals((await node.client.status()).pool.owned, 0);
        const back = (await nodeLinks()).split("\n").find((l) => l.includes(eni.mac));
        assert(back, "the device is back on the node");
        assertStringIncludes(back, `: ${nodeName}`);
        const gone = await node.vpc.exec(pod, ["/usr/sbin/ip", "link", "show", "eth0"]);
        assert(gone.code !== 0, "eth0 left the pod");
        // No second DEL here: host-device's own DEL is not idempotent (it fails with "failed
        // to find eth0" once the device has left the pod; upstream's still does).
        await node.vpc.deletePod(pod);
      }
    } finally {
      await lc.close();
    }
  },
});

/**
 * Where a runtime passes no pod annotations (libcni callers, podman, CRI-O without the
 * capability), the same choices come through CNI_ARGS: ENIM_PROFILE,
 * ENIM_SECURITY_GROUP_IDS, IP and ENIM_STICKY.
 */
Deno.test({
  name: "libcni: profile, inline groups, a fixed IP and stickiness through CNI_ARGS",
  ignore: DEPS.skip !== null,
  async fn() {
    await using node = await SimulatedNode.start({
      mock: { enis: 3 },
      profiles: {
        b: {
          subnets: { ipv4: "10.98.0.0/24" },
          enis: 2,
          securityGroupIds: ["g-bbbbbbbb"],
          allowedSecurityGroupIds: ["g-inline01"],
        },
      },
    });
    const lc = await Libcni.create(node);
    try {
      const conflist = await lc.conflist("enim-args", [
        { type: "enim", logFile: node.sandbox.inner("cni.log") },
      ]);
      const cloud = async (pod: string) =>
        (await node.client.enis()).find((e) => e.owner?.pod === pod);
      const call = async (name: string, extra: [string, string][]) => {
        const pod = await node.vpc.pod(`lc-${name}`);
        return {
          pod,
          req: {
            containerId: `lc-${name}`,
            netns: pod.path,
            ifName: "eth0",
            args: [...podArgs(name), ...extra] as [string, string][],
          },
        };
      };

      const plain = await call("plain", []);
      const inB = await call("in-b", [
        ["ENIM_PROFILE", "b"],
        ["ENIM_SECURITY_GROUP_IDS", "g-inline01"],
      ]);
      const fixed = await call("fixed", [["IP", "10.99.0.200"]]);
      for (const c of [plain, inB, fixed]) await lc.ok(conflist, { op: "add", ...c.req });
      const ePlain = (await cloud("lc/plain"))!, eB = (await cloud("lc/in-b"))!;
      const eFixed = (await cloud("lc/fixed"))!;
      assertEquals([ePlain.profile, ePlain.securityGroupIds], ["default", ["g-mockdefault"]]);
      assertEquals([eB.profile, eB.subnetId, eB.securityGroupIds], [
        "b",
        "subnet-mock-b",
        ["g-inline01"],
      ]);
      assertMatch(eB.ipv4!.address, /^10\.98\.0\./);
      assertEquals(eFixed.ipv4!.address, "10.99.0.200");
      for (const [c, e] of [[plain, ePlain], [inB, eB], [fixed, eFixed]] as const) {
        assert(await node.vpc.ping(c.pod, e.ipv4!.gateway), `${c.pod.name} pings its gateway`);
      }

      // Refused: a clear error, nothing allocated.
      const owned = (await node.client.status()).pool.owned;
      for (
        const [extra, expected] of [
          [[["ENIM_PROFILE", "gold"]], 'Profile "gold" is not configured'],
          [[["IP", "10.50.0.5"]], "10.50.0.5 is outside the subnet 10.99.0.0/24"],
          [[["ENIM_SECURITY_GROUP_IDS", "sg-1"]], "CNI_ARGS ENIM_SECURITY_GROUP_IDS"],
        ] as [[string, string][], string][]
      ) {
        const bad = await call(`bad-${crypto.randomUUID().slice(0, 6)}`, extra);
        const a = await lc.run(conflist, { op: "add", ...bad.req });
        assert(!a.ok, "refused");
        assertStringIncludes(a.error!, expected);
        assertEquals((await node.client.status()).pool.owned, owned);
        await lc.ok(conflist, { op: "del", ...bad.req });
      }

      // Sticky: DEL holds the ENI; the pod's next container gets the same ENI, MAC and IP.
      const s1 = await call("sticky-1", [["ENIM_STICKY", "true"]]);
      s1.req.args = [...podArgs("db"), ["ENIM_STICKY", "true"]];
      const r1 = await lc.ok(conflist, { op: "add", ...s1.req });
      await lc.ok(conflist, { op: "del", ...s1.req });
      const s2 = await call("sticky-2", []);
      s2.req.args = [...podArgs("db"), ["ENIM_STICKY", "true"]];
      const r2 = await lc.ok(conflist, { op: "add", ...s2.req });
      assertEquals(r2.result!.interfaces?.[0]?.mac, r1.result!.interfaces?.[0]?.mac);
      assertEquals(r2.result!.ips, r1.result!.ips);

      for (const c of [plain, inB, fixed, s2]) await lc.ok(conflist, { op: "del", ...c.req });
      const held = await node.client.attachments();
      assertEquals(held.map((a) => [a.pod, a.state]), [["lc/db", "held"]]);
      assertEquals((await node.client.enis()).find((e) => e.id === eB.id)?.securityGroupIds, [
        "g-bbbbbbbb",
      ]);
    } finally {
      await lc.close();
    }
  },
});
