/**
 * What bandwidth shaping costs the device layer, on the real kernel (root): `plug`
 * and `unplug` of one simulated ENI with 10M limits both ways against the same
 * without any, in one simulated node and pod.
 *
 * `deno bench -A --config tests/deno.json bench/device_bandwidth_bench.ts`
 *
 * @module
 */
import { IpDeviceLayer } from "../netns/mod.ts";
import { SimulatedVpc } from "../tests/support/vpc.ts";
import type { Shaping } from "../netns/bandwidth.ts";

const LIMITS: Shaping = { ingress: { rate: 10_000_000 }, egress: { rate: 10_000_000 } };
const OPTS = { n: 40, warmup: 5 };

const vpc = Deno.uid() === 0 ? await SimulatedVpc.create() : null;
const setup = vpc
  ? await (async () => {
    const eni = vpc.newEni();
    await vpc.plugEni(eni);
    const pod = await vpc.pod("bench");
    const devices = new IpDeviceLayer({ node: vpc.node.name, scratchDir: "/run/enim-bench-ip" });
    return { devices, eni, pod, spec: SimulatedVpc.plugSpec(eni) };
  })()
  : null;
// Namespaces go when the bench process ends (an unload handler cannot wait for a promise).
globalThis.addEventListener("unload", () => {
  for (const ns of vpc?.namespaces ?? []) {
    new Deno.Command("/usr/sbin/ip", { args: ["netns", "del", ns] }).outputSync();
  }
});

async function plug(bandwidth?: Shaping) {
  const { devices, eni, pod, spec } = setup!;
  return await devices.plug({
    mac: eni.mac,
    netns: pod.path,
    ifName: "eth0",
    ...spec,
    ...(bandwidth ? { bandwidth } : {}),
  });
}

async function unplug(nodeName: string, shaped: boolean) {
  const { devices, eni, pod } = setup!;
  await devices.unplug({
    mac: eni.mac,
    nodeName,
    netns: pod.path,
    podName: "eth0",
    shapedIngress: shaped,
  });
}

for (
  const [name, bandwidth] of [["unshaped", undefined], ["shaped 10M both ways", LIMITS]] as const
) {
  Deno.bench({
    name: `plug, ${name}`,
    group: "plug",
    baseline: bandwidth === undefined,
    ignore: !setup,
    ...OPTS,
    async fn(b) {
      b.start();
      const r = await plug(bandwidth);
      b.end();
      await unplug(r.nodeName, bandwidth !== undefined);
    },
  });
  Deno.bench({
    name: `unplug, ${name}`,
    group: "unplug",
    baseline: bandwidth === undefined,
    ignore: !setup,
    ...OPTS,
    async fn(b) {
      const r = await plug(bandwidth);
      b.start();
      await unplug(r.nodeName, bandwidth !== undefined);
      b.end();
    },
  });
}
