/**
 * Test fixtures for the manager: the mock provider and the fake device layer
 * on one database, a movable clock, request builders and crash helpers.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { openDatabase } from "../../lib/sqlite.ts";
import { type Logger, nullLogger } from "../../lib/log.ts";
import mock, {
  type MockConfigInput,
  MockConfigSchema,
  type MockProvider,
} from "../../providers/mock/mod.ts";
import type { AllocationRequestInput, Eni, Owner, Provider } from "../../providers/contract.ts";
import { FakeDeviceLayer } from "../../netns/fake.ts";
import { createManager, type Manager } from "../../manager/manager.ts";
import { AddRequestSchema, type AddResponse, DelRequestSchema } from "../../api/schema.ts";
import type { AddInput, DelInput, PolicyHook } from "../../manager/types.ts";
import type { LivenessSource } from "../../manager/gc.ts";
import type { PhaseRecorder } from "../../lib/metrics.ts";

/** A clock tests move by hand. */
export class Clock {
  t = 1_700_000_000_000;
  now = (): number => this.t;
  advance(ms: number): void {
    this.t += ms;
  }
}

/** Which provider call hangs forever (a crash at that point). */
export type ProviderHang = "before-allocate" | "after-allocate" | "after-deallocate" | null;

/** Wraps a provider so a test can make a call throw or hang (simulated crash). */
export class ControlledProvider implements Provider {
  readonly name: string;
  readonly inner: Provider;
  hang: ProviderHang = null;
  failNext: Error | null = null;
  allocations = 0;
  /**
   * Zone-wide stickiness, simulated over the mock: every profile reports zone scope
   * with this node hold, and `parkENI` records the park and frees the ENI (it left
   * the node). Null: the mock as it is (node scope).
   */
  zone: { nodeHoldSeconds: number } | null = null;
  /** The parks asked for, in order. */
  readonly parks: { owner: Owner; until: number }[] = [];
  /** The allocation requests received, in order. */
  readonly requests: AllocationRequestInput[] = [];
  constructor(inner: Provider) {
    this.inner = inner;
    this.name = inner.name;
  }
  list(): Promise<Eni[]> {
    return this.inner.list();
  }
  async allocateNextENI(owner: Owner, req: AllocationRequestInput): Promise<Eni> {
    if (this.failNext) {
      const e = this.failNext;
      this.failNext = null;
      throw e;
    }
    if (this.hang === "before-allocate") await new Promise(() => {});
    this.allocations++;
    this.requests.push(req);
    const eni = await this.inner.allocateNextENI(owner, req);
    if (this.hang === "after-allocate") await new Promise(() => {});
    return eni;
  }
  async deallocateENI(owner: Owner): Promise<void> {
    await this.inner.deallocateENI(owner);
    if (this.hang === "after-deallocate") await new Promise(() => {});
  }
  status() {
    return this.inner.status();
  }
  profiles() {
    const zone = this.zone;
    return zone
      ? this.inner.profiles().map((p) => ({ ...p, sticky: { scope: "zone" as const, ...zone } }))
      : this.inner.profiles();
  }
  async parkENI(owner: Owner, o: { until: number }): Promise<void> {
    this.parks.push({ owner, until: o.until });
    await this.inner.deallocateENI(owner);
  }
  describeENI(eniId: string, text: string | null): Promise<void> {
    return this.inner.describeENI?.(eniId, text) ?? Promise.resolve();
  }
  repairDevice(eniId: string): Promise<void> {
    return this.inner.repairDevice?.(eniId) ?? Promise.resolve();
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

/**
 * One node: state DB, mock cloud, fake devices and the manager. `mgr.del()` resolves
 * when the manager's DEL answers, as a runtime sees it (a plain pod's DEL answers before
 * its device is home: manager.ts `del`); a test that checks what a DEL leaves behind
 * waits for `mgr.settled()` itself.
 */
export interface Node {
  db: DatabaseSync;
  path: string;
  devices: FakeDeviceLayer;
  mock: MockProvider;
  provider: ControlledProvider;
  mgr: Manager;
  clock: Clock;
  /** Stops the manager and provider and closes the DB (a clean stop, or the aftermath of a crash). */
  close(): Promise<void>;
  /** Simulates kill -9 and a restart: new connection, provider and manager on the same file and devices. */
  restart(): Promise<void>;
  /** ENIs the provider shows owned, by id → owner key. */
  owned(): Promise<Map<string, string>>;
}

/** Options for {@linkcode makeNode}. */
export interface NodeOptions {
  mock?: MockConfigInput;
  graceMs?: number;
  /** A database file (default: a fresh temp file). */
  path?: string;
  devices?: FakeDeviceLayer;
  livenessSources?: LivenessSource[];
  /** How long sticky pods' ENIs are held (default: the manager's). */
  stickyHoldMs?: number;
  /** The node name in cloud descriptions (default: descriptions off). */
  describeAs?: string;
  /** The manager's and the provider's logger (default: none). */
  log?: Logger;
  /** Zone-wide stickiness with this node hold (see {@linkcode ControlledProvider.zone}). */
  zone?: { nodeHoldSeconds: number };
  /** Where the manager records its timings and counts (default: nowhere). */
  metrics?: PhaseRecorder;
  /** NetworkPolicy enforcement (default: none). */
  policy?: PolicyHook;
  /** How long an ADD waits for DELs still finishing (default: the manager's). */
  delWaitMs?: number;
}

/** Builds a node and runs reconcile once (as the agent does at start-up). */
export async function makeNode(o: NodeOptions = {}): Promise<Node> {
  const dir = o.path ? null : await Deno.makeTempDir({ prefix: "enim-mgr-" });
  const path = o.path ?? `${dir}/enim.db`;
  const devices = o.devices ?? new FakeDeviceLayer();
  const clock = new Clock();
  const cfg = MockConfigSchema.parse({ enis: 4, ...o.mock });
  const open = async () => {
    const db = openDatabase(path);
    const m = await mock.create(cfg, {
      db,
      log: o.log ?? nullLogger,
      deviceSimulator: devices.simulator(),
    }) as MockProvider;
    const provider = new ControlledProvider(m);
    provider.zone = o.zone ?? null;
    const mgr = createManager({
      db,
      provider,
      devices,
      log: o.log ?? nullLogger,
      gcGraceMs: o.graceMs ?? 60_000,
      now: clock.now,
      livenessSources: o.livenessSources,
      stickyHoldMs: o.stickyHoldMs,
      describeAs: o.describeAs,
      metrics: o.metrics,
      policy: o.policy,
      delWaitMs: o.delWaitMs,
    });
    return { db, mock: m, provider, mgr };
  };
  let parts = await open();
  await parts.mgr.reconcile();
  const node: Node = {
    get db() {
      return parts.db;
    },
    path,
    devices,
    get mock() {
      return parts.mock;
    },
    get provider() {
      return parts.provider;
    },
    get mgr() {
      return parts.mgr;
    },
    clock,
    async close() {
      // Hung operations (simulated crashes) never settle: do not wait for them. Otherwise
      // every operation ends first, a DEL's rest after its answer included.
      const closing = parts.mgr.close();
      const hung = parts.provider.hang !== null || devices.hanging;
      await (hung ? Promise.race([closing, Promise.resolve()]) : closing);
      await parts.mock.close();
      parts.db.close();
      if (dir) await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
    async restart() {
      parts.db.close();
      devices.clearFaults();
      parts = await open();
    },
    async owned() {
      const out = new Map<string, string>();
      for (const e of await parts.mock.list()) {
        if (e.owner) out.set(e.id, `${e.owner.containerId}/${e.owner.ifName}`);
      }
      return out;
    },
  };
  return node;
}

/** An ADD request for pod `i` (container `c<i>`, netns `/run/netns/p<i>`), parsed. */
export function addReq(i: number | string, over: Record<string, unknown> = {}): AddInput {
  return AddRequestSchema.parse({
    containerId: `c${i}`,
    ifName: "eth0",
    netns: `/run/netns/p${i}`,
    network: "enim",
    pod: { namespace: "default", name: `pod-${i}` },
    mode: "interface",
    ...over,
  });
}

/** A DEL request for the attachment of {@linkcode addReq}. */
export function delReq(i: number | string, over: Record<string, unknown> = {}): DelInput {
  return DelRequestSchema.parse({
    containerId: `c${i}`,
    ifName: "eth0",
    netns: `/run/netns/p${i}`,
    network: "enim",
    ...over,
  });
}

/** Lets pending promise callbacks and zero timers run. */
export function settle(): Promise<void> {
  return new Promise((r) => setTimeout(r, 0));
}

/** Runs `fn` on a fresh node (see {@linkcode makeNode}) and closes it. */
export async function withNode(
  fn: (n: Node) => Promise<void>,
  opts: NodeOptions = {},
): Promise<void> {
  const n = await makeNode(opts);
  try {
    await fn(n);
  } finally {
    await n.close();
  }
}

/** ADD for pod `i` (see {@linkcode addReq}), creating its namespace in the fake devices first. */
export async function add(
  n: Node,
  i: number | string,
  over: Record<string, unknown> = {},
): Promise<AddResponse> {
  const req = addReq(i, over);
  if (!n.devices.snapshot()[req.netns]) n.devices.addNetns(req.netns);
  return await n.mgr.add(req);
}
