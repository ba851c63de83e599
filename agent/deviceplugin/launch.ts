/**
 * Whether the agent runs the device plugin, and starting it: unless `enabled` is
 * false, or `auto` where kubelet's folder does not exist (a node without kubelet),
 * the plugin's code (`mod.ts`, with `@grpc/grpc-js`) is imported and started;
 * otherwise none of it loads. A plugin that fails to start is logged and shown
 * off with the reason: pods still get their ENIs, only the scheduler's view is
 * missing.
 *
 * @module
 */
import { type DevicePluginStatus, DevicePluginStatusSchema } from "../../api/schema.ts";
import { userMessage } from "../../lib/message.ts";
import { type AgentConfig, DEVICE_PLUGIN_RESOURCE } from "../config.ts";
import type { PluginHost } from "./mod.ts";

/** The device plugin as the agent holds it: its status, and how to stop it. */
export interface LaunchedPlugin {
  status(): DevicePluginStatus;
  close(): Promise<void>;
}

/** A device plugin that does not run, and why. */
export function pluginOff(reason: string): LaunchedPlugin {
  const status = DevicePluginStatusSchema.parse({
    state: "off",
    reason,
    resourceName: DEVICE_PLUGIN_RESOURCE,
  });
  return { status: () => status, close: () => Promise.resolve() };
}

/** Why the plugin stays off (null: it runs). */
async function offReason(c: AgentConfig["devicePlugin"]): Promise<string | null> {
  if (c.enabled === false) return "devicePlugin.enabled is false";
  if (c.enabled === true) return null;
  try {
    if ((await Deno.stat(c.dir)).isDirectory) return null;
    return `kubelet's device-plugin folder "${c.dir}" is not a directory`;
  } catch (err) {
    return err instanceof Deno.errors.NotFound
      ? `kubelet's device-plugin folder "${c.dir}" does not exist (no kubelet on this node; devicePlugin.enabled true waits for it)`
      : `Cannot look at kubelet's device-plugin folder "${c.dir}": ${userMessage(err)}`;
  }
}

/** Starts the device plugin when the config and the node want it (see the module doc). */
export async function launchDevicePlugin(
  c: AgentConfig["devicePlugin"],
  host: PluginHost,
): Promise<LaunchedPlugin> {
  const off = await offReason(c);
  if (off !== null) {
    host.log.info("The device plugin is off", { reason: off });
    return pluginOff(off);
  }
  try {
    const { startForAgent } = await import("./mod.ts");
    return await startForAgent(c, host);
  } catch (err) {
    host.log.error("Cannot start the device plugin; the agent serves CNI without it", {
      error: err,
    });
    return pluginOff(`It failed to start: ${userMessage(err)}`);
  }
}
