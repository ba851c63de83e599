/**
 * The agent's `devices: "fake"` mode: the in-memory {@linkcode FakeDeviceLayer}
 * with every namespace path treated as existing (with a stable identity derived
 * from the path), since no test harness creates namespaces inside the agent.
 *
 * For tests and dry demos only: nothing on the node is touched, and the devices
 * live only as long as the agent process.
 *
 * Why it ships: the tests that run the real agent process (the shipped bundle, under the
 * production permission set: tests/agent_process_test.ts, device_plugin_test.ts,
 * reliability_test.ts, agent_crash_test.ts) select it by config, so it must be in the
 * bundle; agent/deps.ts imports it only when the config says `devices: "fake"`, so an
 * agent on `ip` never loads it.
 *
 * @module
 */
import { FakeDeviceLayer } from "../netns/fake.ts";
import type {
  DeviceLayer,
  HostLinkRef,
  HostLinkState,
  Link,
  LiveShaping,
  NetnsIdentity,
  NodeAddresses,
  PinnedNetns,
  PlugParams,
  PlugResult,
  PodInterfaceState,
  UnplugOutcome,
  UnplugParams,
} from "../netns/types.ts";
import type { DeviceSimulator } from "../providers/contract.ts";

/** A stable pseudo-inode for a path (FNV-1a), so identities survive an agent restart. */
function pathInode(path: string): number {
  let h = 0x811c9dc5;
  for (const c of new TextEncoder().encode(path)) {
    h ^= c;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return 4026531840 + (h % 1_000_000);
}

/** An in-memory device layer in which every referenced namespace exists. */
export class AgentFakeDevices implements DeviceLayer {
  readonly fake: FakeDeviceLayer;
  readonly #known = new Set<string>();

  constructor(fake = new FakeDeviceLayer()) {
    this.fake = fake;
  }

  /** The simulator that makes attached ENIs appear as node links. */
  simulator(): DeviceSimulator {
    return this.fake.simulator();
  }

  #ensure(netns: string | PinnedNetns | null | undefined): void {
    const path = typeof netns === "string" || !netns ? netns : netns.path;
    if (!path || this.#known.has(path)) return;
    this.#known.add(path);
    this.fake.addNetns(path);
  }

  findByMac(mac: string, netns?: string): Promise<Link | null> {
    this.#ensure(netns);
    return this.fake.findByMac(mac, netns);
  }
  nodeLinks(): Promise<Link[]> {
    return this.fake.nodeLinks();
  }
  plug(p: PlugParams): Promise<PlugResult> {
    this.#ensure(p.netns);
    return this.fake.plug(p);
  }
  unplug(p: UnplugParams): Promise<UnplugOutcome> {
    this.#ensure(p.netns);
    return this.fake.unplug(p);
  }
  inspect(p: { netns: string | PinnedNetns; ifName: string }): Promise<PodInterfaceState> {
    this.#ensure(p.netns);
    return this.fake.inspect(p);
  }
  inspectShaping(p: { netns: string | PinnedNetns; ifName: string }): Promise<LiveShaping> {
    this.#ensure(p.netns);
    return this.fake.inspectShaping(p);
  }
  inspectHostLink(
    p: { netns: string | PinnedNetns; hostLink: HostLinkRef },
  ): Promise<HostLinkState> {
    this.#ensure(p.netns);
    return this.fake.inspectHostLink(p);
  }
  hostLinks(): Promise<Link[]> {
    return this.fake.hostLinks();
  }
  removeHostLink(nodeIfName: string): Promise<boolean> {
    return this.fake.removeHostLink(nodeIfName);
  }
  nodeAddresses(): Promise<NodeAddresses> {
    return this.fake.nodeAddresses();
  }
  ensureHostLinkTable(
    legacy?: string[],
    marks?: { node: number; kubeProxyMasquerade: number },
  ): Promise<void> {
    return this.fake.ensureHostLinkTable(legacy, marks);
  }

  sweepHostLinkRules(): Promise<number> {
    return this.fake.sweepHostLinkRules();
  }
  readNodeFile(path: string): Promise<string | null> {
    return this.fake.readNodeFile(path);
  }
  loadRuleset(netns: string | null, text: string): Promise<void> {
    this.#ensure(netns);
    return this.fake.loadRuleset(netns, text);
  }
  listCounters(netns: string | null, table: string): Promise<string> {
    this.#ensure(netns);
    return this.fake.listCounters(netns, table);
  }
  listTable(netns: string | null, table: string): Promise<string | null> {
    this.#ensure(netns);
    return this.fake.listTable(netns, table);
  }
  flushConntrack(
    netns: string | null,
    addresses: string[],
    opts?: { listedOnly?: boolean },
  ): Promise<void> {
    this.#ensure(netns);
    return this.fake.flushConntrack(netns, addresses, opts);
  }
  async netnsIdentity(path: string): Promise<NetnsIdentity | null> {
    this.#ensure(path);
    await this.fake.netnsIdentity(path);
    return { dev: 4, ino: pathInode(path) };
  }
  async pin(path: string): Promise<PinnedNetns> {
    const identity = await this.netnsIdentity(path);
    return {
      path,
      ref: path,
      identity: identity!,
      keepsAlive: !path.startsWith("/proc/"),
      close() {},
    };
  }
}
