/**
 * A pod's packet socket against its own egress policy (issue 48 point 1), on the real
 * kernel: a simulated node whose agent (the shipped bundle) reads the test API server,
 * pods `src` and `dst` in namespace `alpha`, and a policy that denies `src` all egress.
 * `src` writes whole Ethernet frames (IPv4 UDP to `dst`'s address and its ENI's MAC, from
 * `src`'s own address and MAC, which the VPC's source check passes) through an
 * `AF_PACKET` socket on its ENI (`tests/support/raw_frames.ts`), with and without
 * `PACKET_QDISC_BYPASS`; a counter in `dst`'s namespace (before anything of enim's) counts
 * what arrives.
 *
 * - With the raw-socket guard (this kernel has the netdev egress hook): every frame
 *   arrives before the policy, none after it, in both modes; the IP stack's own traffic
 *   (a connection `dst` opens to `src`, its replies) still flows.
 * - Without it (`networkPolicy.rawSocketGuard: false`, as on a kernel older than 5.17),
 *   with `networkPolicy.rawCapablePods: refuse`: the ADD of a pod the policy isolates that
 *   keeps the runtime's default `NET_RAW` fails (111), and nothing of it arrives; one
 *   whose containers drop `NET_RAW` is admitted and shown as enforced.
 *
 * @module
 */
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { clientDeps } from "./support/clients.ts";
import { TRAFFIC_NEEDS } from "./support/traffic.ts";
import { type ClusterPod, PolicyCluster } from "./support/policy_cluster.ts";
import { passed } from "./support/prober.ts";
import { parseRawReport, RAW_FRAMES_NEEDS, rawUdpArgv } from "./support/raw_frames.ts";
import { sampleOf } from "./support/metrics.ts";
import type { Obj } from "./support/kube_apiserver.ts";
import { PodPolicyViewSchema, StatusSchema } from "../api/schema.ts";

const DEPS = await clientDeps("raw_socket_policy_test", [...TRAFFIC_NEEDS, ...RAW_FRAMES_NEEDS]);

const NFT = "/usr/sbin/nft";
/** The port the frames go to (no server: they are counted before anything answers). */
const PORT = 7777;
const COUNT = 20;

/** A counter of UDP to {@linkcode PORT} in `pod`'s namespace, ahead of every hook of enim's. */
async function countArrivals(pod: ClusterPod): Promise<() => Promise<number>> {
  const rules = [
    "add table inet raw_probe",
    "add chain inet raw_probe count { type filter hook prerouting priority -500; policy accept; }",
    `add rule inet raw_probe count udp dport ${PORT} counter`,
  ].join("; ");
  const load = await pod.node.vpc.exec(pod.ns, [NFT, rules]);
  assertEquals(load.code, 0, load.stderr);
  return async () => {
    const r = await pod.node.vpc.exec(pod.ns, [NFT, "list", "chain", "inet", "raw_probe", "count"]);
    assertEquals(r.code, 0, r.stderr);
    return Number(/packets (\d+)/.exec(r.stdout)?.[1] ?? NaN);
  };
}

/** The MAC of the pod's ENI. */
function macOf(pod: ClusterPod): string {
  const mac = pod.res.interfaces?.find((i) => i.sandbox)?.mac;
  assert(mac, `${pod.id} has an ENI MAC in its ADD result`);
  return mac;
}

/** `COUNT` raw frames from `from` to `to`, through a packet socket on `from`'s ENI. */
async function sendRaw(from: ClusterPod, to: ClusterPod, bypass: boolean) {
  const r = await from.node.vpc.exec(
    from.ns,
    rawUdpArgv({
      dev: "eth0",
      mac: macOf(to),
      src: from.v4,
      dst: to.v4,
      port: PORT,
      count: COUNT,
      bypass,
    }),
  );
  assertEquals(r.code, 0, r.stderr);
  return parseRawReport(r.stdout);
}

/** Waits (bounded) for the count to reach `want`; returns the count then (or at the end). */
async function settleCount(read: () => Promise<number>, want: number): Promise<number> {
  let n = await read();
  for (let i = 0; i < 20 && n < want; i++) {
    await new Promise((ok) => setTimeout(ok, 50));
    n = await read();
  }
  return n;
}

const DENY_EGRESS = {
  podSelector: { matchLabels: { app: "src" } },
  policyTypes: ["Egress"],
};

Deno.test({
  name:
    "a pod whose egress is denied sends no frame through a packet socket on its ENI, with or without PACKET_QDISC_BYPASS (the raw-socket guard); its IP stack's replies still flow",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await PolicyCluster.start();
    try {
      c.namespace("alpha", { team: "a" });
      const a = await c.node("node-a", { mock: { enis: 4 } });
      const src = await c.pod(a, "node-a", "alpha", "src", { app: "src" }, []);
      const dst = await c.pod(a, "node-a", "alpha", "dst", { app: "dst" }, []);
      const arrived = await countArrivals(dst);
      await t.step("before any policy every raw frame arrives (the sender works)", async () => {
        const r = await sendRaw(src, dst, false);
        assertEquals(r, { sent: COUNT, refused: 0 });
        assertEquals(await settleCount(arrived, COUNT), COUNT);
      });
      c.put("networkpolicies", {
        metadata: { namespace: "alpha", name: "deny-src-egress" },
        spec: DENY_EGRESS,
      });
      await c.settle();
      for (const bypass of [false, true]) {
        await t.step(
          `under the egress deny, ${COUNT} raw frames ${
            bypass ? "with" : "without"
          } PACKET_QDISC_BYPASS: 0 arrive`,
          async () => {
            const before = await arrived();
            const r = await sendRaw(src, dst, bypass);
            console.error(`raw frames (bypass ${bypass}): ${JSON.stringify(r)}`);
            // Let anything in flight land before counting.
            await new Promise((ok) => setTimeout(ok, 300));
            assertEquals((await arrived()) - before, 0);
          },
        );
      }
      await t.step("the guard counted every dropped frame in src's namespace", async () => {
        const r = await a.vpc.exec(src.ns, [
          NFT,
          "list",
          "counter",
          "netdev",
          "enim_guard",
          "drop_raw",
        ]);
        assertEquals(r.code, 0, r.stderr);
        assertEquals(Number(/packets (\d+)/.exec(r.stdout)?.[1]), 2 * COUNT, r.stdout);
      });
      await t.step(
        "dst still reaches src, and src's IP stack answers through the guard",
        async () => {
          const [r] = await dst.prober.probe([{ proto: "tcp", addr: src.v4, port: 8080 }], 3_000);
          assert(passed(r), `dst -> src:8080: ${r}`);
          const [u] = await src.prober.probe([{ proto: "tcp", addr: dst.v4, port: 8080 }], 1_000);
          assert(!passed(u), `src -> dst:8080 is denied: ${u}`);
        },
      );
      await t.step(
        "the guard's two tables deleted in src's namespace are found by the check and loaded again; raw frames still do not arrive",
        async () => {
          for (const family of ["netdev", "inet"]) {
            const r = await a.vpc.exec(src.ns, [NFT, "delete", "table", family, "enim_guard"]);
            assertEquals(r.code, 0, r.stderr);
          }
          const t0 = performance.now();
          const back = await poll(async () => {
            for (const family of ["netdev", "inet"]) {
              const r = await a.vpc.exec(src.ns, [NFT, "list", "table", family, "enim_guard"]);
              if (r.code !== 0) return null;
            }
            return true;
          }, { timeoutMs: 20_000, intervalMs: 100 });
          assert(back, "the guard's tables were not loaded again");
          console.error(
            `raw-socket guard deleted: both tables back ${
              Math.round(performance.now() - t0)
            } ms after`,
          );
          const log = await a.agentLog();
          assert(log.includes("enim_guard"), "the repair is logged, naming the guard's tables");
          const before = await arrived();
          await sendRaw(src, dst, true);
          await new Promise((ok) => setTimeout(ok, 300));
          assertEquals((await arrived()) - before, 0);
        },
      );
      await t.step("enim policy and enim status show src guarded, not flagged", async () => {
        const r = await a.enim(["policy", "alpha/src", "--json"]);
        assertEquals(r.code, 0, r.stderr);
        const view = PodPolicyViewSchema.parse(JSON.parse(r.stdout));
        assertEquals({ guard: view.rawSocketGuard, bypass: view.bypass }, {
          guard: true,
          bypass: null,
        });
        const s = StatusSchema.parse(JSON.parse((await a.enim(["status", "--json"])).stdout));
        assertEquals(s.policy?.rawSocketGuard.on, true, s.policy?.rawSocketGuard.why);
      });
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});

/** `obj` with every container's securityContext dropping `NET_RAW`. */
function droppingNetRaw(obj: Obj): Obj {
  const o = structuredClone(obj) as { spec: { containers: Record<string, unknown>[] } };
  for (const ct of o.spec.containers) {
    ct.securityContext = { capabilities: { drop: ["NET_RAW"] } };
  }
  return o as unknown as Obj;
}

Deno.test({
  name:
    "without the raw-socket guard (as on a kernel before 5.17) a pod its policy isolates that keeps NET_RAW is refused (111) and sends nothing; one that drops NET_RAW is admitted as enforced",
  ignore: DEPS.skip !== null,
  async fn(t) {
    const c = await PolicyCluster.start();
    try {
      c.namespace("alpha", { team: "a" });
      c.put("networkpolicies", {
        metadata: { namespace: "alpha", name: "deny-src-egress" },
        spec: { podSelector: { matchLabels: { role: "src" } }, policyTypes: ["Egress"] },
      });
      const a = await c.node("node-a", {
        mock: { enis: 4 },
        extra: { networkPolicy: { rawSocketGuard: false, rawCapablePods: "refuse" } },
      });
      // Pods named "*-safe" drop NET_RAW in every container.
      const podObject = c.podObject.bind(c);
      c.podObject = (namespace, name, ...rest) => {
        const o = podObject(namespace, name, ...rest);
        return name.endsWith("-safe") ? droppingNetRaw(o) : o;
      };
      const dst = await c.pod(a, "node-a", "alpha", "dst", { app: "dst" }, []);
      const arrived = await countArrivals(dst);
      await t.step("the status says the node has no guard", async () => {
        const s = StatusSchema.parse(JSON.parse((await a.enim(["status", "--json"])).stdout));
        assertEquals(s.policy?.rawSocketGuard.on, false);
        assertMatch(s.policy?.rawSocketGuard.why ?? "", /rawSocketGuard is false/);
      });
      await t.step(
        "the ADD of an isolated pod keeping the default NET_RAW fails with 111",
        async () => {
          let failed = "";
          try {
            await c.pod(a, "node-a", "alpha", "src", { role: "src" }, []);
          } catch (err) {
            failed = String(err);
          }
          assertMatch(failed, /"code": ?111/);
          assertMatch(failed, /NET_RAW/);
          assertEquals(await arrived(), 0, "nothing of it arrived");
        },
      );
      await t.step(
        "an isolated pod that drops NET_RAW is admitted and shown enforced",
        async () => {
          const safe = await c.pod(a, "node-a", "alpha", "src-safe", { role: "src" }, []);
          const r = await a.enim(["policy", "alpha/src-safe", "--json"]);
          assertEquals(r.code, 0, r.stderr);
          const view = PodPolicyViewSchema.parse(JSON.parse(r.stdout));
          assertEquals({
            guard: view.rawSocketGuard,
            bypass: view.bypass,
            egress: view.egress.isolated,
          }, {
            guard: false,
            bypass: null,
            egress: true,
          });
          assertEquals(
            sampleOf(await a.client.metrics(), `enim_policy_pods_unenforced{pod="alpha/src-safe"}`),
            null,
          );
          assert(safe.v4);
        },
      );
    } catch (err) {
      for (const n of c.nodes) console.error(await n.agentLog());
      throw err;
    } finally {
      await c.close();
    }
  },
});
