/**
 * The mock provider: a simulated cloud for demos and tests.
 *
 * An inventory of ENIs (ids like `eni-mock-0001`, MACs from a prefix, addresses
 * from IPv4 and/or IPv6 subnets) lives in the agent's database (`mock_` tables),
 * so it survives an agent restart like a real cloud. A node capacity limit,
 * attach latency, seeded failure injection and an optional device simulator
 * (each attached ENI appears as a device with its MAC) make it behave like one.
 *
 * Every state change is one SQLite transaction, run synchronously, so no ENI is
 * ever handed to two owners whatever runs concurrently: an ENI being attached is
 * reserved for its owner (`attaching`) before the latency wait.
 *
 * @module
 */
import * as z from "zod/mini";
import "../../lib/zod_locale.ts";
import {
  type Cidr,
  formatIp,
  isCidr,
  normalizeIp,
  nthAddress as nthOf,
  parseCidr,
  prefixSize,
} from "../../lib/ip.ts";
import type { DatabaseSync } from "node:sqlite";
import {
  type AllocationRequest,
  type Eni,
  eniMatches,
  type Owner,
  type Provider,
  type ProviderContext,
  ProviderError,
  type ProviderModule,
  type ProviderStatus,
  unmatchedIps,
} from "../contract.ts";
import { prepared, transaction } from "../../lib/sqlite.ts";
import { mulberry32 } from "../../lib/rng.ts";

/** One simulated subnet: CIDR and gateway (default: the first host). */
export const MockSubnetSchema = z.strictObject({
  cidr: z.string().check(z.refine(isCidr, "Expected a CIDR such as 10.99.0.0/24")),
  gateway: z.optional(z.union([z.ipv4(), z.ipv6()])),
});

/** The mock provider's config (`provider.mock` in the agent config). */
export const MockConfigSchema = z.strictObject({
  /** How many ENIs the simulated cloud has for this node. */
  enis: z._default(z.number().check(z.int(), z.minimum(0), z.maximum(4096)), 8),
  /** How many can be attached to the node at once (default: all of them). */
  maxEnisPerNode: z.optional(z.number().check(z.int(), z.minimum(0))),
  /** How many are attached when the inventory is first created (default: maxEnisPerNode). */
  preattached: z.optional(z.number().check(z.int(), z.minimum(0))),
  subnets: z._default(
    z.strictObject({
      ipv4: z.optional(MockSubnetSchema),
      ipv6: z.optional(MockSubnetSchema),
    }).check(z.refine((s) => s.ipv4 || s.ipv6, "Expected at least one of ipv4 and ipv6")),
    { ipv4: { cidr: "10.99.0.0/24" } },
  ),
  /** The first three bytes of every MAC. */
  macPrefix: z._default(
    z.string().check(
      z.regex(/^[0-9a-f]{2}(:[0-9a-f]{2}){2}$/, 'Expected three bytes like "02:e1:0a"'),
    ),
    "02:e1:0a",
  ),
  /** Id prefix; ids are the prefix and a 4-digit number. */
  idPrefix: z._default(z.string().check(z.minLength(1), z.maxLength(32)), "eni-mock-"),
  /** How long attaching a new ENI takes. */
  attachLatencyMs: z._default(z.number().check(z.int(), z.minimum(0), z.maximum(600_000)), 0),
  /** Probability that an allocate or deallocate fails with reason "unavailable". */
  errorRate: z._default(z.number().check(z.minimum(0), z.maximum(1)), 0),
  /** Probability that an allocate or deallocate fails with reason "throttled". */
  throttleRate: z._default(z.number().check(z.minimum(0), z.maximum(1)), 0),
  /** Seed of the failure injection's random numbers (reproducible runs). */
  seed: z._default(z.number().check(z.int()), 1),
});
/** The mock provider's config, defaults applied. */
export type MockConfig = z.output<typeof MockConfigSchema>;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS mock_enis (
  id TEXT PRIMARY KEY,
  idx INTEGER NOT NULL UNIQUE,
  mac TEXT NOT NULL UNIQUE,
  ipv4 TEXT, ipv4_prefix INTEGER, ipv4_gw TEXT,
  ipv6 TEXT, ipv6_prefix INTEGER, ipv6_gw TEXT,
  subnet_id TEXT,
  attach TEXT NOT NULL CHECK (attach IN ('detached', 'attaching', 'attached')),
  owner_pod TEXT, owner_container TEXT, owner_if TEXT,
  CHECK ((owner_container IS NULL) = (owner_if IS NULL) AND (owner_if IS NULL) = (owner_pod IS NULL)),
  CHECK (attach <> 'detached' OR owner_container IS NULL)
);
CREATE UNIQUE INDEX IF NOT EXISTS mock_enis_owner
  ON mock_enis (owner_container, owner_if) WHERE owner_container IS NOT NULL;
`;

const RowSchema = z.object({
  id: z.string(),
  idx: z.number(),
  mac: z.string(),
  ipv4: z.nullable(z.string()),
  ipv4_prefix: z.nullable(z.number()),
  ipv4_gw: z.nullable(z.string()),
  ipv6: z.nullable(z.string()),
  ipv6_prefix: z.nullable(z.number()),
  ipv6_gw: z.nullable(z.string()),
  subnet_id: z.nullable(z.string()),
  attach: z.enum(["detached", "attaching", "attached"]),
  owner_pod: z.nullable(z.string()),
  owner_container: z.nullable(z.string()),
  owner_if: z.nullable(z.string()),
});
type Row = z.infer<typeof RowSchema>;

/** The `n`-th address of a subnet (0 = the network address). */
export function nthAddress(cidr: string, n: number): string {
  return formatIp(nthOf(cidrOf(cidr), n));
}

function cidrOf(cidr: string): Cidr {
  const c = parseCidr(cidr);
  if (!c) throw new RangeError(`"${cidr}" is not a prefix`);
  return c;
}

/** How many host addresses a subnet offers ENIs (minus network, gateway and, for IPv4, broadcast). */
function hostCapacity(cidr: string): number {
  const c = cidrOf(cidr);
  return prefixSize(c) - (c.ip.family === 4 ? 3 : 2);
}

/** The address table of one subnet: ENI number i (1-based) gets the i-th host after the gateway. */
function addressPlan(subnet: { cidr: string; gateway?: string } | undefined, count: number) {
  if (!subnet) return null;
  const c = cidrOf(subnet.cidr);
  if (count > hostCapacity(subnet.cidr)) {
    throw new RangeError(`Subnet "${subnet.cidr}" is too small for ${count} ENIs`);
  }
  const gateway = subnet.gateway ? normalizeIp(subnet.gateway) : nthAddress(subnet.cidr, 1);
  const addrs: string[] = [];
  for (let n = 1; addrs.length < count; n++) {
    const a = nthAddress(subnet.cidr, n);
    if (a !== gateway) addrs.push(a);
  }
  return { prefixLength: c.prefix, gateway, addrs, kind: c.ip.family === 4 ? "ipv4" : "ipv6" };
}

function rowToEni(r: Row): Eni {
  return {
    id: r.id,
    mac: r.mac,
    ipv4: r.ipv4 ? { address: r.ipv4, prefixLength: r.ipv4_prefix!, gateway: r.ipv4_gw! } : null,
    ipv6: r.ipv6 ? { address: r.ipv6, prefixLength: r.ipv6_prefix!, gateway: r.ipv6_gw! } : null,
    subnetId: r.subnet_id,
    state: r.owner_container ? "owned" : "free",
    owner: r.owner_container
      ? { pod: r.owner_pod!, containerId: r.owner_container, ifName: r.owner_if! }
      : null,
  };
}

function sameOwner(r: Row, o: Owner): boolean {
  return r.owner_container === o.containerId && r.owner_if === o.ifName;
}

/** The mock provider (exported for tests that call its extras: `detach`). */
export class MockProvider implements Provider {
  readonly name = "mock";
  readonly #db: DatabaseSync;
  readonly #cfg: MockConfig;
  readonly #max: number;
  readonly #ctx: ProviderContext;
  readonly #rand: () => number;
  /** In-flight attaches, by ENI id. */
  readonly #attaching = new Map<string, Promise<void>>();
  #closed = false;

  constructor(cfg: MockConfig, ctx: ProviderContext) {
    this.#cfg = cfg;
    this.#ctx = ctx;
    this.#db = ctx.db;
    this.#max = Math.min(cfg.maxEnisPerNode ?? cfg.enis, cfg.enis);
    this.#rand = mulberry32(cfg.seed);
  }

  /** Creates the tables and inventory (first start) and settles attaches a crash interrupted. */
  async init(): Promise<void> {
    const cfg = this.#cfg;
    const v4 = addressPlan(cfg.subnets.ipv4, cfg.enis);
    const v6 = addressPlan(cfg.subnets.ipv6, cfg.enis);
    if (v4 && v4.kind !== "ipv4") throw new Error(`Subnet "${cfg.subnets.ipv4!.cidr}" is not IPv4`);
    if (v6 && v6.kind !== "ipv6") throw new Error(`Subnet "${cfg.subnets.ipv6!.cidr}" is not IPv6`);
    this.#db.exec(SCHEMA);
    transaction(this.#db, () => {
      const existing = prepared(this.#db, "SELECT count(*) AS n FROM mock_enis").get() as {
        n: number;
      };
      const fresh = existing.n === 0;
      const pre = Math.min(cfg.preattached ?? this.#max, this.#max);
      const ins = prepared(
        this.#db,
        `INSERT OR IGNORE INTO mock_enis (id, idx, mac, ipv4, ipv4_prefix, ipv4_gw, ipv6, ipv6_prefix,
           ipv6_gw, subnet_id, attach) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      );
      for (let i = 1; i <= cfg.enis; i++) {
        const mac = `${cfg.macPrefix}:${((i >> 16) & 0xff).toString(16).padStart(2, "0")}:${
          ((i >> 8) & 0xff).toString(16).padStart(2, "0")
        }:${(i & 0xff).toString(16).padStart(2, "0")}`;
        ins.run(
          `${cfg.idPrefix}${String(i).padStart(4, "0")}`,
          i,
          mac,
          v4?.addrs[i - 1] ?? null,
          v4?.prefixLength ?? null,
          v4?.gateway ?? null,
          v6?.addrs[i - 1] ?? null,
          v6?.prefixLength ?? null,
          v6?.gateway ?? null,
          "subnet-mock",
          fresh && i <= pre ? "attached" : "detached",
        );
      }
      // A crash during an attach: the cloud finished it.
      this.#db.exec("UPDATE mock_enis SET attach = 'attached' WHERE attach = 'attaching'");
    });
    const sim = this.#ctx.deviceSimulator;
    if (sim) {
      for (const r of this.#rows("WHERE attach = 'attached' ORDER BY idx")) {
        await sim.plug(rowToEni(r));
      }
    }
  }

  #rows(where: string, ...params: (string | number | null)[]): Row[] {
    return prepared(this.#db, `SELECT * FROM mock_enis ${where}`).all(...params).map((r) =>
      RowSchema.parse(r)
    );
  }

  #inject(op: string): void {
    const { errorRate, throttleRate } = this.#cfg;
    if (errorRate === 0 && throttleRate === 0) return;
    const x = this.#rand();
    if (x < throttleRate) {
      throw new ProviderError("throttled", `Mock cloud throttled "${op}" (injected)`);
    }
    if (x < throttleRate + errorRate) {
      throw new ProviderError("unavailable", `Mock cloud failed "${op}" (injected)`);
    }
  }

  #assertOpen(): void {
    if (this.#closed) throw new ProviderError("unavailable", "The mock provider is closed");
  }

  list(): Promise<Eni[]> {
    this.#assertOpen();
    // One SELECT is one consistent snapshot.
    return Promise.resolve(this.#rows("WHERE attach = 'attached' ORDER BY idx").map(rowToEni));
  }

  async allocateNextENI(owner: Owner, request: AllocationRequest): Promise<Eni> {
    this.#assertOpen();
    this.#inject("allocate");
    const specific = request.ips.length > 0 || request.ranges.length > 0;
    const step = transaction(this.#db, (): { eni: Row; attach: boolean } => {
      const all = this.#rows("ORDER BY idx");
      const held = all.find((r) => sameOwner(r, owner));
      if (held) return { eni: held, attach: false };
      const free = all.find((r) =>
        r.attach === "attached" && !r.owner_container && eniMatches(rowToEni(r), request)
      );
      const claim = (r: Row) => {
        prepared(
          this.#db,
          `UPDATE mock_enis SET owner_pod = ?, owner_container = ?, owner_if = ?,
             attach = CASE attach WHEN 'detached' THEN 'attaching' ELSE attach END WHERE id = ?`,
        ).run(owner.pod, owner.containerId, owner.ifName, r.id);
        return this.#rows("WHERE id = ?", r.id)[0];
      };
      if (free) return { eni: claim(free), attach: false };
      const onNode = all.filter((r) => r.attach !== "detached").length;
      const detached = all.find((r) => r.attach === "detached" && eniMatches(rowToEni(r), request));
      if (onNode < this.#max && detached) return { eni: claim(detached), attach: true };
      if (!specific) {
        throw new ProviderError(
          "no_eni_available",
          `No ENI available: ${
            all.filter((r) => r.attach === "attached" && !r.owner_container).length
          } free, ` +
            `${onNode} of ${this.#max} attached`,
        );
      }
      const matching = all.filter((r) => eniMatches(rowToEni(r), request));
      const why = matching.length === 0
        ? request.ips.length > 0 ? unmatchedIps(request, all.map(rowToEni)) : "no ENI is in range"
        : matching.every((r) => r.owner_container)
        ? `held by ${matching.map((r) => `"${r.owner_pod}"`).join(", ")}`
        : `the node is at its limit of ${this.#max} ENIs`;
      const what = request.ips.length > 0
        ? `The requested IP${request.ips.length > 1 ? "s" : ""} ${request.ips.join(", ")}`
        : `An ENI in the requested ranges ${JSON.stringify(request.ranges)}`;
      throw new ProviderError(
        "requested_ip_unavailable",
        `${what} cannot be had on one ENI: ${why}`,
      );
    });
    if (step.eni.attach === "attaching") {
      // Either we attach it now, or another call for this owner is attaching it: wait.
      let p = this.#attaching.get(step.eni.id);
      if (!p) {
        p = this.#attach(step.eni);
        this.#attaching.set(step.eni.id, p);
        p.finally(() => this.#attaching.delete(step.eni.id)).catch(() => {});
      }
      await p;
      const now = this.#rows("WHERE id = ?", step.eni.id)[0];
      if (!sameOwner(now, owner)) {
        throw new ProviderError(
          "wrong_state",
          `ENI "${now.id}" was released while it was attached`,
        );
      }
      return rowToEni(now);
    }
    return rowToEni(step.eni);
  }

  async #attach(r: Row): Promise<void> {
    try {
      if (this.#cfg.attachLatencyMs > 0) {
        await new Promise((res) => setTimeout(res, this.#cfg.attachLatencyMs));
      }
      const eni = rowToEni({ ...r, attach: "attached" });
      await this.#ctx.deviceSimulator?.plug(eni);
      if (this.#ctx.waitForDevice) await this.#ctx.waitForDevice(r.mac, 10_000);
      prepared(this.#db, "UPDATE mock_enis SET attach = 'attached' WHERE id = ?").run(r.id);
    } catch (err) {
      prepared(
        this.#db,
        `UPDATE mock_enis SET attach = 'detached', owner_pod = NULL, owner_container = NULL,
           owner_if = NULL WHERE id = ?`,
      ).run(r.id);
      throw new ProviderError("other", `Cannot attach "${r.id}": ${(err as Error).message}`, {
        cause: err,
      });
    }
  }

  deallocateENI(owner: Owner): Promise<void> {
    this.#assertOpen();
    this.#inject("deallocate");
    // An ENI still attaching loses its owner but stays unavailable until the attach settles.
    prepared(
      this.#db,
      `UPDATE mock_enis SET owner_pod = NULL, owner_container = NULL, owner_if = NULL
         WHERE owner_container = ? AND owner_if = ?`,
    ).run(owner.containerId, owner.ifName);
    return Promise.resolve();
  }

  status(): Promise<ProviderStatus> {
    this.#assertOpen();
    const rows = this.#rows("");
    const attached = rows.filter((r) => r.attach === "attached");
    const onNode = rows.filter((r) => r.attach !== "detached").length;
    return Promise.resolve({
      name: this.name,
      free: attached.filter((r) => !r.owner_container).length,
      owned: attached.filter((r) => r.owner_container).length,
      attachable: Math.max(0, Math.min(this.#max - onNode, rows.length - onNode)),
      details: {
        inventory: rows.length,
        maxEnisPerNode: this.#max,
        attaching: rows.filter((r) => r.attach === "attaching").length,
      },
    });
  }

  /** Detaches a free ENI from the node (test and demo extra); the device disappears. */
  async detach(id: string): Promise<void> {
    const r = this.#rows("WHERE id = ?", id)[0];
    if (!r) throw new ProviderError("not_found", `No ENI "${id}" in the mock cloud`);
    if (r.attach !== "attached" || r.owner_container) {
      throw new ProviderError("wrong_state", `ENI "${id}" is not attached and free`);
    }
    prepared(
      this.#db,
      "UPDATE mock_enis SET attach = 'detached' WHERE id = ? AND owner_container IS NULL",
    )
      .run(id);
    await this.#ctx.deviceSimulator?.unplug(rowToEni(r));
  }

  /**
   * Makes an attached ENI's vanished device reappear on the node. A simulated
   * ENI is a veth pair, which the kernel destroys with the pod namespace it was
   * in (a physical device would return to the node); the simulator plugs it again.
   */
  async repairDevice(id: string): Promise<void> {
    const r = this.#rows("WHERE id = ?", id)[0];
    if (!r) throw new ProviderError("not_found", `No ENI "${id}" in the mock cloud`);
    if (r.attach === "attached") await this.#ctx.deviceSimulator?.plug(rowToEni(r));
  }

  async close(): Promise<void> {
    this.#closed = true;
    await Promise.allSettled([...this.#attaching.values()]);
  }
}

/** The mock provider's factory. */
const mod: ProviderModule<MockConfig> = {
  configSchema: MockConfigSchema,
  async create(config, ctx) {
    const p = new MockProvider(MockConfigSchema.parse(config), ctx);
    await p.init();
    return p;
  },
};
export default mod;
export const { configSchema, create } = mod;
