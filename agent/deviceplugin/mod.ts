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
 *   agent's state; `accounting.ts` takes off what attachments hold that kubelet counts
 *   no device for, as kubelet's pod-resources API tells (`podresources.ts`);
 * - `plugin.ts`: serving, registering with kubelet, kubelet restarts, the status;
 *   `_service.ts` the DevicePlugin service kubelet calls, `_streams.ts` the
 *   ListAndWatch streams, `_grpc.ts` the gRPC plumbing (the Register call).
 *
 * @module
 */
import type { DevicePluginStatus } from "../../api/schema.ts";
import type { DevicePluginCounts, Metrics } from "../../lib/metrics.ts";
import type { Logger } from "../../lib/log.ts";
import type { NodeCapacity, Provider } from "../../providers/contract.ts";
import { type AgentConfig, DEVICE_PLUGIN_RESOURCE } from "../config.ts";
import { readCapacity } from "./devices.ts";
import { type Consumer, lessConsumers, uncountedConsumers } from "./accounting.ts";
import { podDevices, podResourcesSocket } from "./podresources.ts";
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
  /** The attachments of the node (the manager's rows): whose each is and its state. */
  consumers(): Consumer[];
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
  const log = host.log.child({ component: "deviceplugin" });
  const plugin = await startDevicePlugin({
    dir: c.dir,
    capacity: accountedCapacity({
      provider,
      consumers: host.consumers,
      podDevices: () =>
        podDevices(
          podResourcesSocket(c.dir),
          DEVICE_PLUGIN_RESOURCE,
          c.registerTimeoutSeconds * 1000,
        ),
      log,
    }),
    ready: host.ready,
    log,
    metrics,
    resyncMs: c.resyncSeconds * 1000,
    unreachableAfterMs: c.unreachableSeconds * 1000,
    registerTimeoutMs: c.registerTimeoutSeconds * 1000,
  });
  metrics.setDevicePluginSource(() => metricCounts(plugin.status()));
  return plugin;
}

/** Where {@linkcode accountedCapacity} reads from. */
export interface AccountingSources {
  provider: Pick<Provider, "status" | "capacity">;
  consumers(): Consumer[];
  /** Devices of `enim.dev/eni` per pod, as kubelet tells; throws when it cannot be asked. */
  podDevices(): Promise<Map<string, number>>;
  log: Logger;
}

/**
 * The capacity the plugin advertises: the provider's, less what attachments hold that
 * kubelet counts no device for (`accounting.ts`). A provider that cannot tell fails
 * it (the plugin's health follows); kubelet's pod resources that cannot be read are
 * logged once (and again once they are back) and noted in the result.
 */
export function accountedCapacity(s: AccountingSources): () => Promise<NodeCapacity> {
  let failing: string | null = null;
  return async () => {
    const cap = await readCapacity(s.provider);
    let devices: Map<string, number> | null = null;
    try {
      devices = await s.podDevices();
      if (failing !== null) s.log.info("kubelet's pod resources can be read again");
      failing = null;
    } catch (err) {
      const why = err instanceof Error ? err.message : String(err);
      if (failing === null) {
        s.log.warn(
          "Cannot read kubelet's pod resources: each pod with an attachment is taken to hold one enim.dev/eni device",
          { error: why },
        );
      }
      failing = why;
    }
    const note = failing === null
      ? undefined
      : `${failing}; attachments of pods without an enim.dev/eni request are not taken off the healthy devices`;
    return lessConsumers(cap, uncountedConsumers(s.consumers(), devices), note);
  };
}

/** The metrics' view of the plugin's status. */
export function metricCounts(s: DevicePluginStatus): DevicePluginCounts {
  const unhealthy: DevicePluginCounts["unhealthy"] = {};
  for (const u of s.unhealthyReasons) {
    unhealthy[u.reason as keyof DevicePluginCounts["unhealthy"]] = u.devices;
  }
  return { registered: s.state === "registered", healthy: s.healthy, unhealthy };
}
