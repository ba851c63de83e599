/**
 * Runs inside the simulated node namespace, as the agent does (no `node` option):
 * plugs a simulated ENI with the default VethDeviceSimulator (ENI end in this
 * process's namespace), moves it into a pod and back with the default
 * IpDeviceLayer (home = Deno.pid), and prints what it saw as JSON.
 *
 * Usage: `ip netns exec <node> deno run -A tests/support/device_probe.ts '<json>'`
 * with `{vpcNetns, bridge, podPath, eni}`.
 *
 * @module
 */
import { IpDeviceLayer } from "../../netns/mod.ts";
import { VethDeviceSimulator } from "../../netns/sim.ts";
import { SimulatedVpc } from "./vpc.ts";
import { EniSchema } from "../../providers/contract.ts";

const args = JSON.parse(Deno.args[0]);
const eni = EniSchema.parse(args.eni);
const sim = new VethDeviceSimulator({ vpcNetns: args.vpcNetns, bridge: args.bridge });
await sim.plug(eni);
await sim.plug(eni);
const devices = new IpDeviceLayer();
const before = await devices.findByMac(eni.mac);
const plugged = await devices.plug({
  mac: eni.mac,
  netns: args.podPath,
  ifName: "eth0",
  ...SimulatedVpc.plugSpec(eni),
});
const inPod = await devices.inspect({ netns: args.podPath, ifName: "eth0" });
const outcome = await devices.unplug({
  mac: eni.mac,
  nodeName: plugged.nodeName,
  netns: args.podPath,
});
const after = await devices.findByMac(eni.mac);
await sim.unplug(eni);
const gone = await devices.findByMac(eni.mac);
console.log(JSON.stringify({ before, plugged, inPod, outcome, after, gone }));
