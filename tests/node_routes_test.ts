/**
 * The node's routes to its pods outlive a change of the node's address (issue 33 item
 * 12), on the real kernel. The host link's node side routes each pod address over the
 * node end with the node's primary address as the preferred source; removing that
 * address (`netplan apply`, a DHCP renewal that drops and re-adds it) makes the kernel
 * flush the IPv4 route and strip the IPv6 route's source, and nothing in the kernel
 * puts them back: kubelet's probes and hostPorts to running pods stop. The agent
 * watches the node's addresses and restores the routes (and their permanent
 * neighbours). Here: a Kubernetes-like node (its own NIC on the VPC, strict
 * reverse-path filtering), an enim pod with its host link serving TCP, the node's
 * address removed and re-added inside the node namespace, and a probe from the node to
 * the pod that must answer again within a bound.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";
import { ask, lastError, Servers, TRAFFIC_NEEDS, who } from "./support/traffic.ts";
import { clientDeps } from "./support/clients.ts";
import { poll } from "../lib/async.ts";
import type { NetnsHandle, SimulatedVpc } from "./support/vpc.ts";

const DEPS = await clientDeps("node_routes_test", TRAFFIC_NEEDS);

const IP = "/usr/sbin/ip";
const STRICT = { "net/ipv4/conf/all/rp_filter": "1", "net/ipv4/conf/default/rp_filter": "1" };
/** How long the routes may take to come back once the address is back. */
const BOUND_MS = 5_000;

/** The node's routes to `addr` (main table), as `ip -o route` prints them. */
async function routesTo(vpc: SimulatedVpc, addr: string): Promise<string> {
  const fam = addr.includes(":") ? "-6" : "-4";
  const out = await vpc.exec(vpc.node, [IP, fam, "-o", "route", "show", "match", addr]);
  return out.stdout.split("\n").filter((l) => l.includes("enimh")).join("\n");
}

/** Runs `ip` in `ns`, failing the test on an error. */
async function ip(vpc: SimulatedVpc, ns: NetnsHandle, args: string[]): Promise<void> {
  const out = await vpc.exec(ns, [IP, ...args]);
  assertEquals(out.code, 0, `ip ${args.join(" ")}: ${out.stderr}`);
}

Deno.test({
  name:
    "after the node's address is removed and re-added, the node's routes to its pods come back and a probe from the node answers again",
  ignore: DEPS.skip !== null,
  async fn(t) {
    await using node = await SimulatedNode.start({
      nodeNic: true,
      mock: {
        enis: 2,
        subnets: { ipv4: { cidr: "10.99.0.0/24" }, ipv6: { cidr: "fd00:99::/64" } },
      },
    });
    await using servers = new Servers();
    const { vpc } = node;
    const nic = node.nic!;
    try {
      await vpc.sysctl(vpc.node, STRICT);
      const pod = await vpc.pod("probed");
      await vpc.sysctl(pod, STRICT);
      const res = await node.add(pod, {
        config: node.netconf("1.1.0", { serviceCidrs: ["172.30.0.0/16", "fd00:30::/108"] }),
      });
      assertEquals(res.interfaces.length, 3, "the pod has its host link");
      const A = {
        v4: res.ips.find((i) => !i.address.includes(":"))!.address.split("/")[0],
        v6: res.ips.find((i) => i.address.includes(":"))!.address.split("/")[0],
      };
      const N = { v4: nic.ipv4!, v6: nic.ipv6! };
      await servers.start(pod, "probed", [{ proto: "tcp", port: 9090 }]);
      const probe = async (fam: "v4" | "v6") => who(await ask(vpc.node, "tcp", A[fam], 9090));
      await t.step("the node's probe answers, from the node's address", async () => {
        assertEquals(await probe("v4"), `probed ${N.v4}`, lastError);
        assertEquals(await probe("v6"), `probed ${N.v6}`, lastError);
        assert((await routesTo(vpc, A.v4)).includes(`src ${N.v4}`), await routesTo(vpc, A.v4));
      });
      await t.step("the node's address goes: the kernel takes the routes' source", async () => {
        await ip(vpc, vpc.node, ["addr", "del", `${N.v4}/24`, "dev", "eth0"]);
        await ip(vpc, vpc.node, ["addr", "del", `${N.v6}/64`, "dev", "eth0"]);
        // The kernel flushed the IPv4 route (its source is gone) and stripped the IPv6 one's.
        const v6 = await routesTo(vpc, A.v6);
        assert(!v6.includes(`src ${N.v6}`), v6);
      });
      await t.step(
        `the address comes back: within ${
          BOUND_MS / 1000
        } s the routes are back and the probe answers`,
        async () => {
          const back = performance.now();
          await ip(vpc, vpc.node, ["addr", "add", `${N.v4}/24`, "dev", "eth0"]);
          await ip(vpc, vpc.node, ["addr", "add", `${N.v6}/64`, "dev", "eth0", "nodad"]);
          // As on a node: the default routes come back with the address (netplan, DHCP).
          await ip(vpc, vpc.node, ["route", "replace", "default", "via", "10.99.0.1"]);
          await ip(vpc, vpc.node, ["-6", "route", "replace", "default", "via", "fd00:99::1"]);
          const restored = await poll(async () => {
            const v4 = await routesTo(vpc, A.v4), v6 = await routesTo(vpc, A.v6);
            return v4.includes(`src ${N.v4}`) && v6.includes(`src ${N.v6}`) ? true : null;
          }, { timeoutMs: BOUND_MS, intervalMs: 50 });
          console.log(
            `node_routes_test: routes back after ${Math.round(performance.now() - back)} ms`,
          );
          assertEquals(
            restored,
            true,
            `the node's routes to the pod:\n${await routesTo(vpc, A.v4)}\n${await routesTo(
              vpc,
              A.v6,
            )}`,
          );
          const neigh = await vpc.exec(vpc.node, [IP, "neigh", "show", "nud", "permanent"]);
          assert(neigh.stdout.includes(A.v4) && neigh.stdout.includes(A.v6), neigh.stdout);
          assertEquals(await probe("v4"), `probed ${N.v4}`, lastError);
          assertEquals(await probe("v6"), `probed ${N.v6}`, lastError);
        },
      );
      await t.step("CHECK passes again", async () => {
        const check = await node.cni(
          "CHECK",
          node.podCall(pod, {
            config: node.netconf("1.1.0", {
              serviceCidrs: ["172.30.0.0/16", "fd00:30::/108"],
              prevResult: res,
            }),
          }),
        );
        assertEquals(check.code, 0, check.stdout);
      });
      await node.del(pod, {
        config: node.netconf("1.1.0", { serviceCidrs: ["172.30.0.0/16", "fd00:30::/108"] }),
      });
    } catch (err) {
      console.error((await node.agentLog()).slice(-4000));
      throw err;
    }
  },
});
