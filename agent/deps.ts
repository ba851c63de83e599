/**
 * The real modules the agent wires together. Imports with literal specifiers
 * (so `deno compile` embeds them); the fake device layer and the veth device
 * simulator load only when the configuration asks for them.
 *
 * @module
 */
import type { AgentDeps } from "./agent.ts";
import type { AgentConfig } from "./config.ts";
import { openDatabase } from "../lib/sqlite.ts";
import { loadProvider } from "../providers/registry.ts";
import { createManager } from "../manager/manager.ts";
import type { DeviceSimulator } from "../providers/contract.ts";

/**
 * Loads the veth-based device simulator of `cfg.deviceSimulator` (test and demo
 * only); `netns/sim.ts` is imported only then, so production never loads it.
 */
export async function loadDeviceSimulator(
  cfg: AgentConfig,
): Promise<DeviceSimulator | undefined> {
  if (!cfg.deviceSimulator) return undefined;
  const { VethDeviceSimulator } = await import("../netns/sim.ts");
  return new VethDeviceSimulator(cfg.deviceSimulator);
}

/** The production wiring. */
export const defaultDeps: AgentDeps = {
  openDatabase: (path) => openDatabase(path),
  loadProvider: (name) => loadProvider(name),
  async createDevices(kind, log, opts) {
    if (kind === "fake") {
      const { AgentFakeDevices } = await import("./fake_devices.ts");
      const devices = new AgentFakeDevices();
      return { devices, simulator: devices.simulator() };
    }
    const { IpDeviceLayer, setCommandTimeout } = await import("../netns/mod.ts");
    // Every child the agent starts from now on (they all start in netns/ip.ts).
    setCommandTimeout(opts.commandTimeoutMs);
    return { devices: new IpDeviceLayer({ log: log.child({ component: "netns" }) }) };
  },
  loadDeviceSimulator,
  createManager: (opts) => createManager(opts),
};
