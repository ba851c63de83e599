/**
 * The kubelet device plugin `enim.dev/eni`: the agent advertises one device per
 * ENI slot of the node, Healthy while pods can get it, so the scheduler places a
 * pod only on a node that can give it an ENI (pods ask for it with
 * `resources.limits: {enim.dev/eni: 1}`).
 *
 * The agent imports this module (and with it `@grpc/grpc-js`) only when the
 * device plugin is on (`launch.ts` decides), so the plugin process and an agent
 * without it load none of it. The parts:
 *
 * - `v1beta1.ts`: kubelet's API (services, messages, constants), written from the
 *   published api.proto;
 * - `devices.ts`: what is advertised, decided from the provider's capacity and the
 *   agent's state;
 * - `plugin.ts`: serving, registering with kubelet, kubelet restarts, the status;
 *   `_service.ts` the DevicePlugin service kubelet calls, `_streams.ts` the
 *   ListAndWatch streams, `_grpc.ts` the gRPC plumbing (the Register call).
 *
 * @module
 */
import type { DevicePluginStatus } from "../../api/schema.ts";
import type { DevicePluginCounts, Metrics } from "../../lib/metrics.ts";
import type { Logger } from "../../lib/log.ts";
import type { Provider } from "../../providers/contract.ts";
import type { AgentConfig } from "../config.ts";
import { readCapacity } from "./devices.ts";
import { type DevicePlugin, startDevicePlugin } from "./plugin.ts";

export {
  type DevicePlugin,
  type DevicePluginOptions,
  type DevicePluginRecorder,
  SOCKET_NAME,
  startDevicePlugin,
} from "./plugin.ts";
export { advertise, deviceId, readCapacity, type UnhealthyReason } from "./devices.ts";

/** What the plugin takes from the agent. */
export interface PluginHost {
  provider: Pick<Provider, "status" | "capacity">;
  metrics: Metrics;
  log: Logger;
  /** Whether the agent is ready to serve pods (false once it shuts down). */
  ready(): boolean;
}

/**
 * Starts the device plugin as the agent runs it: its config section, the capacity
 * of the agent's provider, the agent's metrics (which then show the plugin).
 */
export async function startForAgent(
  c: AgentConfig["devicePlugin"],
  host: PluginHost,
): Promise<DevicePlugin> {
  const { provider, metrics } = host;
  const plugin = await startDevicePlugin({
    dir: c.dir,
    capacity: () => readCapacity(provider),
    ready: host.ready,
    log: host.log.child({ component: "deviceplugin" }),
    metrics,
    resyncMs: c.resyncSeconds * 1000,
    unreachableAfterMs: c.unreachableSeconds * 1000,
    registerTimeoutMs: c.registerTimeoutSeconds * 1000,
  });
  metrics.setDevicePluginSource(() => metricCounts(plugin.status()));
  return plugin;
}

/** The metrics' view of the plugin's status. */
export function metricCounts(s: DevicePluginStatus): DevicePluginCounts {
  const unhealthy: DevicePluginCounts["unhealthy"] = {};
  for (const u of s.unhealthyReasons) {
    unhealthy[u.reason as keyof DevicePluginCounts["unhealthy"]] = u.devices;
  }
  return { registered: s.state === "registered", healthy: s.healthy, unhealthy };
}
