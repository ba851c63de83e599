/**
 * Bandwidth limits on the real kernel (issue 27, point 3): the plugin, exec'd as a
 * runtime does, against the agent in a simulated node, with the pod annotations
 * `kubernetes.io/ingress-bandwidth` / `kubernetes.io/egress-bandwidth` as containerd
 * passes them (the pod's annotations, and the `bandwidth` capability it derives from
 * them). The throughput of the pod's ENI traffic is measured with bounded TCP
 * transfers to and from another enim pod of the VPC (`tests/support/throughput.ts`):
 * what is measured is the shaping, not enim's speed.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { type AddResult, SimulatedNode } from "./support/node.ts";
import { IpFaults } from "./support/ip_faults.ts";
import { measureTransfer } from "./support/throughput.ts";
import type { NetnsHandle } from "./support/vpc.ts";
import { tcBatch } from "../netns/tc.ts";
import { ipJson } from "../netns/ip.ts";
import { LinkSchema } from "../netns/types.ts";
import { ifbName } from "../netns/bandwidth.ts";
import { z } from "zod";
import { poll } from "../lib/async.ts";

const AS_ROOT = Deno.uid() === 0;
const LIMIT = 10_000_000;
/** The measured rate must be within this fraction of the limit. */
const TOLERANCE = 0.15;

const Qdiscs = z.array(
  z.looseObject({ kind: z.string(), dev: z.string().optional() }),
);

async function qdiscKinds(netns: string, dev: string): Promise<string[]> {
  const out = await tcBatch([["qdisc", "show", "dev", dev]], {
    netns,
    json: true,
  });
  return Qdiscs.parse(out[0] ?? []).map((q) => q.kind);
}

async function links(netns: string) {
  return await ipJson(z.array(LinkSchema), ["link", "show"], { netns });
}

/** The qdiscs a device carries that enim did not put there: none, or the kernel's default. */
function bare(kinds: string[]): boolean {
  return kinds.every((k) => ["noqueue", "pfifo_fast", "mq", "fq_codel"].includes(k));
}

/** The runtimeConfig containerd sends for a pod annotated with `limits` (both capabilities). */
function containerdRuntimeConfig(
  limits: { ingress?: string; egress?: string },
  rates: {
    ingress?: number;
    egress?: number;
  },
) {
  const annotations: Record<string, string> = {};
  if (limits.ingress) {
    annotations["kubernetes.io/ingress-bandwidth"] = limits.ingress;
  }
  if (limits.egress) {
    annotations["kubernetes.io/egress-bandwidth"] = limits.egress;
  }
  return {
    "io.kubernetes.cri.pod-annotations": annotations,
    bandwidth: {
      ingressRate: rates.ingress ?? 0,
      ingressBurst: rates.ingress ? 2 ** 32 - 1 : 0,
      egressRate: rates.egress ?? 0,
      egressBurst: rates.egress ? 2 ** 32 - 1 : 0,
    },
  };
}

function podArgs(name: string): string {
  return `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`;
}

function ipv4(res: AddResult): string {
  return res.ips.find((i) => !i.address.includes(":"))!.address.split("/")[0];
}

/** Both directions between `pod` and `peer`, in bits per second. */
async function measureBoth(
  pod: NetnsHandle,
  podIp: string,
  peer: NetnsHandle,
  peerIp: string,
) {
  const egress = await measureTransfer({
    from: pod.name,
    to: peer.name,
    address: peerIp,
  });
  const ingress = await measureTransfer({
    from: peer.name,
    to: pod.name,
    address: podIp,
  });
  return { egress: egress.bitsPerSecond, ingress: ingress.bitsPerSecond };
}

const mbit = (bps: number) => `${(bps / 1e6).toFixed(2)} Mbit/s`;

Deno.test({
  name:
    "a pod's 10M bandwidth annotations hold on its ENI traffic both ways; a pod without them is not shaped",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 4 } });
    const peer = await node.vpc.pod("peer");
    const peerIp = ipv4(await node.add(peer, { args: podArgs("peer") }));

    // The shaped pod, as containerd sends it.
    const shaped = await node.vpc.pod("shaped");
    const call = {
      containerId: "c-shaped",
      ifName: "eth0",
      netns: shaped.path,
      args: podArgs("shaped"),
    };
    const conf = (extra: Record<string, unknown> = {}) =>
      node.netconf("1.0.0", {
        runtimeConfig: containerdRuntimeConfig({
          ingress: "10M",
          egress: "10M",
        }, {
          ingress: LIMIT,
          egress: LIMIT,
        }),
        ...extra,
      });
    const add = await node.cni("ADD", { ...call, config: conf() });
    assertEquals(add.code, 0, add.stdout + add.stderr);
    const res = add.json as AddResult;
    const mac = res.interfaces[0].mac;
    const shapedRates = await measureBoth(shaped, ipv4(res), peer, peerIp);
    console.log(
      `shaped to 10 Mbit/s: egress ${mbit(shapedRates.egress)}, ingress ${
        mbit(shapedRates.ingress)
      }`,
    );
    for (const [dir, bps] of Object.entries(shapedRates)) {
      assert(
        Math.abs(bps - LIMIT) <= TOLERANCE * LIMIT,
        `${dir} ${mbit(bps)} is not within ${TOLERANCE * 100}% of 10 Mbit/s`,
      );
    }

    // CHECK passes, and names the shaping once it is gone.
    const check = () => node.cni("CHECK", { ...call, config: conf({ prevResult: res }) });
    assertEquals((await check()).code, 0);
    await node.vpc.exec(shaped, [
      "/usr/sbin/tc",
      "qdisc",
      "del",
      "dev",
      "eth0",
      "root",
    ]);
    const broken = await check();
    assertEquals(broken.json?.code, 106, broken.stdout);
    assertMatch(
      String(broken.json?.msg),
      /lacks its egress shaping: no tbf at 10000000 bit\/s/,
    );

    // DEL: the device back on the node bare, the ifb gone from the pod.
    const del = await node.cni("DEL", {
      ...call,
      config: node.netconf("1.0.0"),
    });
    assertEquals(del.code, 0, del.stdout);
    // The pod's host link (a Kubernetes pod's, issue 27) goes right after the DEL answers.
    const left = await poll(async () => {
      const names = (await links(shaped.name)).map((l) => l.ifname);
      return names.length === 1 ? names : null;
    }, { timeoutMs: 3000, intervalMs: 20 });
    assertEquals(left, ["lo"]);
    const home = (await links(node.vpc.node.name)).find((l) => l.address === mac);
    assert(home, "the device is back on the node");
    assert(
      bare(await qdiscKinds(node.vpc.node.name, home.ifname)),
      "no qdisc left on it",
    );

    // The same pod without annotations, on that same ENI's device or another: unshaped.
    const plain = await node.vpc.pod("plain");
    const plainRes = await node.add(plain, { args: podArgs("plain") });
    assert(bare(await qdiscKinds(plain.name, "eth0")));
    const plainRates = await measureBoth(plain, ipv4(plainRes), peer, peerIp);
    console.log(
      `unshaped: egress ${mbit(plainRates.egress)}, ingress ${mbit(plainRates.ingress)}`,
    );
    for (const [dir, bps] of Object.entries(plainRates)) {
      assert(
        bps > 3 * LIMIT,
        `unshaped ${dir} ${mbit(bps)} is not well above 10 Mbit/s`,
      );
    }
  },
});

Deno.test({
  name: "a shaped pod whose namespace is deleted without DEL leaves nothing once GC has run",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({
      mock: { enis: 1 },
      gc: { graceSeconds: 0 },
    });
    const pod = await node.vpc.pod("gone");
    const res = await node.add(pod, {
      args: podArgs("gone"),
      config: node.netconf("1.1.0", {
        runtimeConfig: containerdRuntimeConfig(
          { ingress: "1M", egress: "2M" },
          {},
        ),
      }),
    });
    assert(
      (await links(pod.name)).some((l) => l.ifname === ifbName(res.interfaces[0].mac)),
    );
    await node.vpc.deletePod(pod);
    const gc = await node.enim(["gc", "--json"]);
    assertEquals(gc.code, 0, gc.stdout + gc.stderr);
    assertEquals((await node.client.status()).pool.owned, 0);
    const home = (await links(node.vpc.node.name)).find((l) => l.address === res.interfaces[0].mac);
    assert(home, "the ENI's device is on the node again");
    assert(bare(await qdiscKinds(node.vpc.node.name, home.ifname)));
    // It serves the next pod unshaped.
    const next = await node.vpc.pod("next");
    await node.add(next, { args: podArgs("next") });
    assert(bare(await qdiscKinds(next.name, "eth0")));
  },
});

Deno.test({
  name: "a bad bandwidth value is refused with 7 naming it, and nothing is allocated or left",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const pod = await node.vpc.pod("bad");
    const cases: [string, Record<string, unknown>, string][] = [
      [
        "an annotation of the wrong form",
        {
          "io.kubernetes.cri.pod-annotations": {
            "kubernetes.io/egress-bandwidth": "10 Mbps",
          },
        },
        'Invalid annotation "kubernetes.io/egress-bandwidth" "10 Mbps"',
      ],
      [
        "an annotation under kubelet's 1 kbit/s",
        {
          "io.kubernetes.cri.pod-annotations": {
            "kubernetes.io/ingress-bandwidth": "500",
          },
        },
        "500 bit/s is below the smallest rate",
      ],
      [
        "an annotation over kubelet's 1 Pbit/s",
        {
          "io.kubernetes.cri.pod-annotations": {
            "kubernetes.io/ingress-bandwidth": "2P",
          },
        },
        "is above the largest rate, 1 Pbit/s",
      ],
      [
        "a capability rate that is no number",
        { bandwidth: { egressRate: "10M", egressBurst: 100 } },
        'Invalid runtimeConfig.bandwidth.egressRate "10M"',
      ],
      [
        "a burst without a rate",
        { bandwidth: { ingressBurst: 1000 } },
        "a burst needs a rate",
      ],
    ];
    for (const [name, runtimeConfig, msg] of cases) {
      await t.step(name, async () => {
        const r = await node.cni("ADD", {
          containerId: "c-bad",
          ifName: "eth0",
          netns: pod.path,
          args: podArgs("bad"),
          config: node.netconf("1.0.0", { runtimeConfig }),
        });
        assertEquals(r.code, 1);
        assertEquals(r.json?.code, 7, r.stdout);
        assertStringIncludes(String(r.json?.msg), msg);
        assertEquals(await node.client.attachments(), []);
        assertEquals((await node.client.status()).pool.owned, 0);
        assertEquals((await links(pod.name)).map((l) => l.ifname), ["lo"]);
      });
    }
  },
});

Deno.test({
  name: "tc failing in the middle of a shaped ADD rolls the whole ADD back, and the retry works",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 1 } });
    const faults = await IpFaults.install(node, "/usr/sbin/tc");
    const pod = await node.vpc.pod("tcfail");
    const call = {
      containerId: "c-tcfail",
      ifName: "eth0",
      netns: pod.path,
      args: podArgs("tcfail"),
      config: node.netconf("1.0.0", {
        runtimeConfig: containerdRuntimeConfig({
          ingress: "10M",
          egress: "10M",
        }, {}),
      }),
    };
    await faults.fail("any", "redirect");
    const r = await node.cni("ADD", call);
    assert(await faults.fired(), "the tc fault fired");
    assertEquals(r.json?.code, 105, r.stdout);
    assertStringIncludes(
      String(r.json?.msg),
      'Cannot shape the bandwidth of link "eth0"',
    );
    assertEquals(await node.client.attachments(), []);
    assertEquals((await node.client.status()).pool.owned, 0);
    assertEquals(
      (await links(pod.name)).map((l) => l.ifname),
      ["lo"],
      "no device, no ifb",
    );
    const eni = (await node.client.enis())[0];
    const home = (await links(node.vpc.node.name)).find((l) => l.address === eni.mac);
    assert(home && bare(await qdiscKinds(node.vpc.node.name, home.ifname)));
    const retry = await node.cni("ADD", call);
    assertEquals(retry.code, 0, retry.stdout);
    assertEquals((await qdiscKinds(pod.name, "eth0")).sort(), [
      "ingress",
      "tbf",
    ]);
    await faults.uninstall();
  },
});
