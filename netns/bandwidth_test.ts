import { assert, assertEquals, assertRejects } from "../lib/assert.ts";
import {
  DEFAULT_BURST_MS,
  effectiveBurst,
  ifbName,
  installedShaping,
  type LiveShaping,
  liveShapingOf,
  shapingLinkCommands,
  shapingProblems,
  shapingTcCommands,
} from "./bandwidth.ts";
import { DeviceError, IpDeviceLayer } from "./mod.ts";
import { ipJson } from "./ip.ts";
import { tcBatch } from "./tc.ts";
import { LinkSchema } from "./types.ts";
import { vethNames } from "./sim.ts";
import { SimulatedVpc } from "../tests/support/vpc.ts";
import type { Eni } from "../providers/contract.ts";
import { z } from "zod";

const root = Deno.uid() === 0;
const MAC = "02:e0:0a:63:00:0b";
const where = { ifName: "eth0", netns: "/run/netns/p", mac: MAC };

Deno.test("ifbName() is 15 bytes, unique per ENI, the same for every spelling of its MAC", () => {
  assertEquals(ifbName(MAC), "ifb02e00a63000b");
  assertEquals(ifbName(" 02:E0:0A:63:00:0B"), ifbName(MAC));
  assert(ifbName(MAC) !== ifbName("02:e0:0a:63:00:0c"));
  assertEquals(ifbName(MAC).length, 15);
});

Deno.test("effectiveBurst() is the burst asked, else 25 ms of the rate, never under one frame", () => {
  assertEquals(DEFAULT_BURST_MS, 25);
  // 10 Mbit/s for 25 ms: 250 000 bits.
  assertEquals(effectiveBurst({ rate: 10_000_000 }, 1500), 250_000);
  assertEquals(effectiveBurst({ rate: 10_000_000, burst: 800_000 }, 1500), 800_000);
  // Rounded up to whole bytes.
  assertEquals(effectiveBurst({ rate: 10_000_000, burst: 800_001 }, 1500), 800_008);
  // 1 kbit/s for 25 ms is 25 bits: the bucket holds one 1500-byte frame and its header.
  assertEquals(effectiveBurst({ rate: 1_000 }, 1500), 8 * 1518);
  assertEquals(effectiveBurst({ rate: 1_000, burst: 8_000 }, 9001), 8 * 9019);
});

Deno.test("shapingLinkCommands() makes an ifb only when ingress is shaped", () => {
  assertEquals(shapingLinkCommands(MAC, undefined), []);
  assertEquals(shapingLinkCommands(MAC, { egress: { rate: 1e7 } }), []);
  assertEquals(shapingLinkCommands(MAC, { ingress: { rate: 1e7 } }).map((l) => l.join(" ")), [
    "link add dev ifb02e00a63000b type ifb",
    "link set dev ifb02e00a63000b up",
  ]);
});

Deno.test("shapingTcCommands() puts a tbf on the interface and one on the ifb its ingress goes to", () => {
  const installed = installedShaping({
    ingress: { rate: 10_000_000 },
    egress: { rate: 20_000_000, burst: 80_000 },
  }, 1500);
  assertEquals(shapingTcCommands("eth0", MAC, installed).map((l) => l.join(" ")), [
    "qdisc add dev eth0 root handle 1: tbf rate 20000000bit burst 10000 latency 25ms",
    "qdisc add dev eth0 handle ffff: ingress",
    "filter add dev eth0 parent ffff: protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev ifb02e00a63000b",
    "qdisc add dev ifb02e00a63000b root handle 1: tbf rate 10000000bit burst 31250 latency 25ms",
  ]);
  assertEquals(
    shapingTcCommands("eth0", MAC, installedShaping({ egress: { rate: 1e9 } }, 1500)).length,
    1,
  );
});

Deno.test("shapingProblems() finds nothing in what the kernel shows for the shaping installed", () => {
  const installed = installedShaping(
    { ingress: { rate: 10_000_001 }, egress: { rate: 1e15 } },
    1500,
  );
  assertEquals(shapingProblems(installed, liveShapingOf("eth0", MAC, installed), where), []);
});

Deno.test("shapingProblems() names each difference from the shaping installed", async (t) => {
  const installed = installedShaping({
    ingress: { rate: 10_000_000 },
    egress: { rate: 20_000_000 },
  }, 1500);
  const edit = (fn: (l: LiveShaping) => void) => {
    const live = liveShapingOf("eth0", MAC, installed);
    fn(live);
    return shapingProblems(installed, live, where);
  };
  const cases: [string, (l: LiveShaping) => void, RegExp][] = [
    [
      "no egress tbf",
      (l) => l.qdiscs.splice(0, 1),
      /lacks its egress shaping: no tbf at 20000000 bit\/s on "eth0"/,
    ],
    [
      "another egress rate",
      (l) => (l.qdiscs[0].options!.rate = 1_000_000),
      /egress shaping at 8000000 bit\/s, not 20000000 bit\/s/,
    ],
    [
      "another egress bucket",
      (l) => (l.qdiscs[0].options!.burst = 1000),
      /egress bucket of 1000 bytes, not 62500 bytes/,
    ],
    [
      "no ingress qdisc",
      (l) => l.qdiscs.splice(1, 1),
      /lacks its ingress shaping: no ingress qdisc/,
    ],
    [
      "no redirect",
      (l) => l.filters.splice(0, 1),
      /lacks its ingress shaping: no filter redirects its traffic to "ifb02e00a63000b"/,
    ],
    [
      "no ifb",
      (l) => l.qdiscs.splice(2, 1),
      /lacks its ingress shaping: no tbf at 10000000 bit\/s on "ifb02e00a63000b"/,
    ],
  ];
  for (const [name, fn, re] of cases) {
    await t.step(name, () => {
      const problems = edit(fn);
      assertEquals(problems.length, 1, problems.join("; "));
      assert(re.test(problems[0]), problems[0]);
    });
  }
  await t.step("a bucket tc computes back within 1% passes", () => {
    assertEquals(edit((l) => (l.qdiscs[0].options!.burst = 62_000)), []);
  });
});

// ---- on the real kernel ----

const QdiscList = z.array(z.looseObject({
  kind: z.string(),
  dev: z.string().optional(),
  root: z.boolean().optional(),
  options: z.looseObject({ rate: z.number().optional(), burst: z.number().optional() })
    .optional(),
}));

async function qdiscs(netns: string, dev?: string) {
  const out = await tcBatch([["qdisc", "show", ...(dev ? ["dev", dev] : [])]], {
    netns,
    json: true,
  });
  return QdiscList.parse(out[0] ?? []);
}

async function linkNames(netns: string): Promise<string[]> {
  return (await ipJson(z.array(LinkSchema), ["link", "show"], { netns })).map((l) => l.ifname);
}

/** The qdiscs on a device enim did not put there: none, or the kernel's default. */
function onlyDefault(list: { kind: string }[]): boolean {
  return list.every((q) => ["noqueue", "pfifo_fast", "mq", "fq_codel"].includes(q.kind));
}

async function shapedPod(vpc: SimulatedVpc) {
  const devices = new IpDeviceLayer({ node: vpc.node.name });
  const eni = vpc.newEni();
  await vpc.plugEni(eni);
  const pod = await vpc.pod("a");
  return { devices, eni, pod };
}

function plugArgs(eni: Eni, netns: string) {
  return { mac: eni.mac, netns, ifName: "eth0", ...SimulatedVpc.plugSpec(eni) };
}

Deno.test({
  name:
    "plug() shapes both directions in the pod, and unplug() takes the device home bare and the ifb away",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await shapedPod(vpc);
    const r = await devices.plug({
      ...plugArgs(eni, pod.path),
      bandwidth: { ingress: { rate: 10_000_000 }, egress: { rate: 20_000_000, burst: 80_000 } },
    });
    assertEquals(r.shaping, {
      ingress: { rate: 10_000_000, burst: 250_000 },
      egress: { rate: 20_000_000, burst: 80_000 },
    });
    const inPod = await qdiscs(pod.name);
    const eth0 = inPod.find((q) => q.dev === "eth0" && q.root);
    assertEquals([eth0?.kind, eth0?.options?.rate, eth0?.options?.burst], [
      "tbf",
      2_500_000,
      10_000,
    ]);
    assert(inPod.some((q) => q.dev === "eth0" && q.kind === "ingress"));
    const ifb = inPod.find((q) => q.dev === ifbName(eni.mac) && q.root);
    assertEquals([ifb?.kind, ifb?.options?.rate, ifb?.options?.burst], ["tbf", 1_250_000, 31_250]);
    const live = await devices.inspectShaping({ netns: pod.path, ifName: "eth0" });
    assertEquals(shapingProblems(r.shaping!, live, { ...where, mac: eni.mac }), []);
    assert(await vpc.ping(pod, vpc.gateways.ipv4!), "the shaped pod still reaches its gateway");
    // Without its ingress qdisc (and so its redirect) the pod's ingress is unshaped: CHECK says so.
    await tcBatch([["qdisc", "del", "dev", "eth0", "ingress"]], { netns: pod.name });
    const lost = shapingProblems(
      r.shaping!,
      await devices.inspectShaping({ netns: pod.path, ifName: "eth0" }),
      { ...where, mac: eni.mac },
    );
    assertEquals(lost.length, 1, lost.join("; "));
    assert(/lacks its ingress shaping: no ingress qdisc redirects/.test(lost[0]), lost[0]);

    const out = await devices.unplug({
      mac: eni.mac,
      nodeName: r.nodeName,
      netns: pod.path,
      podName: "eth0",
      shapedIngress: true,
    });
    assertEquals(out, "pod");
    assertEquals(await linkNames(pod.name), ["lo"]);
    assert(onlyDefault(await qdiscs(vpc.node.name, vethNames(eni.mac).node)));

    // The same device plugged again without bandwidth carries nothing of the last pod's.
    await devices.plug(plugArgs(eni, pod.path));
    assert(onlyDefault(await qdiscs(pod.name, "eth0")), "no qdisc left from the shaped plug");
    assertEquals(
      shapingProblems(
        {},
        await devices.inspectShaping({ netns: pod.path, ifName: "eth0" }),
        where,
      ),
      [],
    );
  },
});

Deno.test({
  name: "plug() shapes egress alone without an ifb",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await shapedPod(vpc);
    const r = await devices.plug({
      ...plugArgs(eni, pod.path),
      bandwidth: { egress: { rate: 1e6 } },
    });
    assertEquals(r.shaping, { egress: { rate: 1e6, burst: 8 * 3125 } });
    assertEquals((await linkNames(pod.name)).sort(), ["eth0", "lo"]);
    assertEquals((await qdiscs(pod.name, "eth0")).map((q) => q.kind), ["tbf"]);
  },
});

Deno.test({
  name: "unplug() removes the ifb of a shaped plug its caller has no record of (a crash mid-ADD)",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await shapedPod(vpc);
    const r = await devices.plug({
      ...plugArgs(eni, pod.path),
      bandwidth: { ingress: { rate: 1e7 } },
    });
    // Reconcile knows the MAC and the node name, not the pod name nor the shaping.
    assertEquals(
      await devices.unplug({ mac: eni.mac, nodeName: r.nodeName, netns: pod.path }),
      "pod",
    );
    assertEquals(await linkNames(pod.name), ["lo"]);
    assert(onlyDefault(await qdiscs(vpc.node.name, r.nodeName)));
  },
});

Deno.test({
  name: "plug() rolls everything back when tc refuses the shaping",
  ignore: !root,
  async fn() {
    await using vpc = await SimulatedVpc.create();
    const { devices, eni, pod } = await shapedPod(vpc);
    const err = await assertRejects(() =>
      devices.plug({
        ...plugArgs(eni, pod.path),
        // tc refuses a bucket of 2^33 bytes ("illegal value for burst").
        bandwidth: { ingress: { rate: 1e7 }, egress: { rate: 1e7, burst: 8 * 2 ** 33 } },
      })
    );
    assert(err instanceof DeviceError && err.step === "shape", String(err));
    assert(
      /Cannot shape the bandwidth of link "eth0" in netns .*burst/.test(err.message),
      err.message,
    );
    assertEquals(await linkNames(pod.name), ["lo"]);
    const home = (await ipJson(z.array(LinkSchema), ["link", "show"], { netns: vpc.node.name }))
      .find((l) => l.address === eni.mac);
    assertEquals(home?.ifname, vethNames(eni.mac).node);
    assert(onlyDefault(await qdiscs(vpc.node.name, home!.ifname)));
    // And the device plugs fine afterwards.
    await devices.plug(plugArgs(eni, pod.path));
  },
});
