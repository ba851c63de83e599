/**
 * The mock provider: a simulated cloud for demos and tests.
 *
 * An inventory of ENIs (ids like `eni-mock-0001`, MACs from a prefix, addresses
 * from IPv4 and/or IPv6 subnets) lives in the agent's database (`mock_` tables),
 * so it survives an agent restart like a real cloud. A node capacity limit,
 * attach latency, seeded failure injection and an optional device simulator
 * (each attached ENI appears as a device with its MAC) make it behave like one.
 *
 * The node's side of the cloud lives in `mock_node` (`store.ts`): its ENI quota
 * now (the config's `maxEnisPerNode` until the cloud says otherwise), ENIs
 * attached to it that are not enim's (each takes a slot), and whether the cloud
 * answers at all ({@linkcode MockProvider.setNode} and `setMockNode` change it, as
 * a cloud changes behind the agent's back). {@linkcode MockProvider.capacity}
 * tells how many ENIs pods can get from that.
 *
 * Profiles: the top-level settings are the `default` profile; `profiles` adds
 * named ones, each with its own subnets, security groups and inventory (ids
 * `eni-mock-<profile>-0001`, MACs `<prefix>:<profile number>:…`). The node limit
 * is shared: when a pod of one profile needs an ENI at the limit, an idle ENI
 * of another profile is detached first (pods go before warm pools). Like BCE, a
 * pod may get an ENI with a fixed IP (a new ENI with that address in the
 * profile's subnet when no ENI of the inventory carries it), inline security
 * groups (replacing the ENI's while the pod owns it, the profile's restored when
 * it is freed), and a description naming it.
 *
 * Every state change is one SQLite transaction, run synchronously, so no ENI is
 * ever handed to two owners whatever runs concurrently: an ENI being attached is
 * reserved for its owner (`attaching`) before the latency wait.
 *
 * Why one file: `MockProvider` is one state machine over one table (`store.ts`);
 * its config, store and address plan live beside it, and its methods share the
 * transaction helpers and the attach bookkeeping.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { contains, normalizeIp, parseIp, prefixSize } from "../../lib/ip.ts";
import {
  type AllocationRequestInput,
  AllocationRequestSchema,
  DEFAULT_PROFILE,
  eniMatches,
  isEnterpriseGroup,
  type NodeCapacityInput,
  type Owner,
  type ProfileInfo,
  type Provider,
  type ProviderContext,
  ProviderError,
  type ProviderModule,
  type ProviderStatus,
  unmatchedIps,
} from "../contract.ts";
import type { Eni } from "../contract.ts";
import { migrateComponent, prepared, transaction } from "../../lib/sqlite.ts";
import { mulberry32 } from "../../lib/rng.ts";
import { type MockConfig, MockConfigSchema } from "./config.ts";
import {
  changeStamp,
  hex,
  MIGRATIONS,
  type MockNode,
  readMockNode,
  type Row,
  RowSchema,
  rowToEni,
  sameOwner,
  setMockNode,
} from "./store.ts";
import { addressPlan, cidrOf, type MockProfile, nthAddress, type Plan } from "./plan.ts";

export {
  type MockConfig,
  type MockConfigInput,
  MockConfigSchema,
  MockGroupRuleSchema,
  MockProfileSchema,
  MockSubnetSchema,
} from "./config.ts";
export { nthAddress } from "./plan.ts";
export { type MockNode, readMockNode, setMockNode } from "./store.ts";

/** The mock provider (exported for tests that call its extras: `detach`). */
export class MockProvider implements Provider {
  readonly name = "mock";
  readonly #db: DatabaseSync;
  #all: { stamp: string; rows: Row[] } | null = null;
  readonly #cfg: MockConfig;
  /** How many ENIs the inventory has (all profiles). */
  readonly #inventory: number;
  readonly #ctx: ProviderContext;
  readonly #rand: () => number;
  readonly #profiles: Map<string, MockProfile>;
  /** In-flight attaches, by ENI id. */
  readonly #attaching = new Map<string, Promise<void>>();
  #closed = false;

  constructor(cfg: MockConfig, ctx: ProviderContext) {
    this.#cfg = cfg;
    this.#ctx = ctx;
    this.#db = ctx.db;
    const named = Object.entries(cfg.profiles).sort(([a], [b]) => a.localeCompare(b));
    const all: [string, typeof cfg.profiles[string] | MockConfig][] = [
      [DEFAULT_PROFILE, cfg],
      ...named,
    ];
    this.#profiles = new Map(all.map(([name, p], number) => {
      const profile: MockProfile = {
        name,
        number,
        enis: p.enis,
        preattached: p.preattached,
        v4: addressPlan(p.subnets.ipv4, p.enis),
        v6: addressPlan(p.subnets.ipv6, p.enis),
        securityGroupIds: p.securityGroupIds,
        enterpriseSecurityGroupIds: p.enterpriseSecurityGroupIds,
        namespaces: p.namespaces ?? null,
        allowedSecurityGroupIds: p.allowedSecurityGroupIds,
      };
      for (const [fam, plan] of [["ipv4", profile.v4], ["ipv6", profile.v6]] as const) {
        const want = fam === "ipv4" ? 4 : 6;
        if (plan && cidrOf(plan.cidr).ip.family !== want) {
          throw new Error(`Subnet "${plan.cidr}" of profile "${name}" is not ${fam.toUpperCase()}`);
        }
      }
      return [name, profile];
    }));
    this.#inventory = all.reduce((n, [, p]) => n + p.enis, 0);
    this.#rand = mulberry32(cfg.seed);
  }

  /**
   * How many ENIs the node can have attached: the quota the cloud says now (the
   * config's `maxEnisPerNode` until it says otherwise; the inventory when neither says).
   * Not capped at the inventory (issue 25): a fixed IP no ENI carries makes the mock
   * create one more ENI, which takes a free slot under the limit before any idle ENI of
   * another profile is released for it.
   */
  #limit(node: MockNode): number {
    return node.maxEnis ?? this.#cfg.maxEnisPerNode ?? this.#inventory;
  }

  /** Fails as a cloud that does not answer, while `mock_node.unreachable` is set. */
  #assertReachable(node: MockNode, op: string): void {
    if (node.unreachable !== null) {
      throw new ProviderError(
        "unavailable",
        `The mock cloud did not answer "${op}": ${node.unreachable}`,
      );
    }
  }

  /** Creates the tables and inventory (first start) and settles attaches a crash interrupted. */
  async init(): Promise<void> {
    migrateComponent(this.#db, "mock", MIGRATIONS);
    transaction(this.#db, () => {
      const max = this.#limit(readMockNode(this.#db));
      let attachedSoFar = (prepared(
        this.#db,
        "SELECT count(*) AS n FROM mock_enis WHERE attach <> 'detached'",
      ).get() as { n: number }).n;
      for (const p of this.#profiles.values()) {
        // A profile's inventory is made once, when the profile first appears.
        const fresh = !prepared(this.#db, "SELECT 1 FROM mock_enis WHERE profile = ? LIMIT 1")
          .get(p.name);
        const pre = Math.min(p.preattached ?? p.enis, p.enis);
        for (let i = 1; i <= p.enis; i++) {
          const attach = fresh && i <= pre && attachedSoFar < max;
          if (attach) attachedSoFar++;
          this.#insert(p, i, p.v4?.addrs[i - 1] ?? null, p.v6?.addrs[i - 1] ?? null, attach);
        }
      }
      // A crash during an attach: the cloud finished it.
      this.#db.exec("UPDATE mock_enis SET attach = 'attached' WHERE attach = 'attaching'");
    });
    const sim = this.#ctx.deviceSimulator;
    if (sim?.setSecurityGroupRules && this.#cfg.securityGroupRules.length > 0) {
      await sim.setSecurityGroupRules(this.#cfg.securityGroupRules);
    }
    if (sim) {
      for (const r of this.#rows("WHERE attach = 'attached' ORDER BY idx")) {
        await sim.plug(rowToEni(r));
      }
    }
  }

  /** Adds inventory ENI number `i` of profile `p` (kept if it exists: the inventory is stable). */
  #insert(p: MockProfile, i: number, v4: string | null, v6: string | null, attached: boolean) {
    const cfg = this.#cfg;
    const id = p.name === DEFAULT_PROFILE
      ? `${cfg.idPrefix}${String(i).padStart(4, "0")}`
      : `${cfg.idPrefix}${p.name}-${String(i).padStart(4, "0")}`;
    const mac = `${cfg.macPrefix}:${hex(p.number)}:${hex(i >> 8)}:${hex(i)}`;
    prepared(
      this.#db,
      `INSERT OR IGNORE INTO mock_enis (id, idx, mac, ipv4, ipv4_prefix, ipv4_gw, ipv6, ipv6_prefix,
         ipv6_gw, subnet_id, attach, profile, security_groups, enterprise_security_groups)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ).run(
      id,
      p.number * 65536 + i,
      mac,
      v4,
      v4 ? p.v4!.prefixLength : null,
      v4 ? p.v4!.gateway : null,
      v6,
      v6 ? p.v6!.prefixLength : null,
      v6 ? p.v6!.gateway : null,
      p.name === DEFAULT_PROFILE ? "subnet-mock" : `subnet-mock-${p.name}`,
      attached ? "attached" : "detached",
      p.name,
      JSON.stringify(p.securityGroupIds),
      JSON.stringify(p.enterpriseSecurityGroupIds),
    );
  }

  /**
   * Every row by `idx`, parsed again only when the table may have changed (an ADD asks
   * for all of them once or twice: parsed each time, they were a megabyte of garbage per
   * ADD at 70 ENIs). Only what is committed is cached. The rows are shared: never
   * changed in place.
   */
  #allRows(): Row[] {
    const stamp = changeStamp(this.#db);
    if (this.#all?.stamp === stamp) return this.#all.rows;
    const rows = this.#rows("ORDER BY idx");
    // Read inside a transaction, it may yet be rolled back: kept only once committed.
    if (!this.#db.isTransaction) this.#all = { stamp, rows };
    return rows;
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

  #profile(name: string): MockProfile {
    const p = this.#profiles.get(name);
    if (!p) throw new ProviderError("other", `The mock cloud has no profile "${name}"`);
    return p;
  }

  profiles(): ProfileInfo[] {
    return [...this.#profiles.values()].map((p) => ({
      name: p.name,
      subnets: {
        ...(p.v4 ? { ipv4: p.v4.cidr } : {}),
        ...(p.v6 ? { ipv6: p.v6.cidr } : {}),
      },
      securityGroupIds: [...p.securityGroupIds],
      enterpriseSecurityGroupIds: [...p.enterpriseSecurityGroupIds],
      namespaces: p.namespaces === null ? null : [...p.namespaces],
      allowedSecurityGroupIds: [...p.allowedSecurityGroupIds],
    }));
  }

  async list(): Promise<Eni[]> {
    this.#assertOpen();
    if (this.#cfg.listLatencyMs > 0) {
      await new Promise((res) => setTimeout(res, this.#cfg.listLatencyMs));
      this.#assertOpen();
    }
    // One SELECT is one consistent snapshot.
    return this.#allRows().filter((r) => r.attach === "attached").map(rowToEni);
  }

  async allocateNextENI(owner: Owner, request: AllocationRequestInput): Promise<Eni> {
    this.#assertOpen();
    this.#assertReachable(readMockNode(this.#db), "allocate");
    this.#inject("allocate");
    const req = AllocationRequestSchema.parse(request);
    const profile = this.#profile(req.profile);
    const specific = req.ips.length > 0 || req.ranges.length > 0;
    const step = transaction(this.#db, (): {
      eni: Row;
      detach?: Row;
      why?: string;
      /** The claimed ENI is on the node already and its groups changed (a pod's inline ones). */
      regroup?: boolean;
    } => {
      const node = readMockNode(this.#db);
      const max = this.#limit(node);
      const all = this.#allRows();
      const held = all.find((r) => sameOwner(r, owner));
      if (held) return { eni: held };
      let regroup = false;
      const claim = (r: Row) => {
        // Inline groups replace the ENI's; without them it has its profile's (a held ENI
        // taken back may still carry the pod's earlier inline groups).
        const groups = req.securityGroupIds;
        const regular = groups === undefined
          ? profile.securityGroupIds
          : groups.filter((g) => !isEnterpriseGroup(g));
        const enterprise = groups === undefined
          ? profile.enterpriseSecurityGroupIds
          : groups.filter(isEnterpriseGroup);
        prepared(
          this.#db,
          `UPDATE mock_enis SET owner_pod = ?, owner_container = ?, owner_if = ?,
             attach = CASE attach WHEN 'detached' THEN 'attaching' ELSE attach END,
             security_groups = ?, enterprise_security_groups = ? WHERE id = ?`,
        ).run(
          owner.pod,
          owner.containerId,
          owner.ifName,
          JSON.stringify(regular),
          JSON.stringify(enterprise),
          r.id,
        );
        const now = this.#rows("WHERE id = ?", r.id)[0];
        regroup = r.attach === "attached" && groupsChanged(r, now);
        return now;
      };
      if (req.eniId !== undefined) {
        const it = all.find((r) => r.id === req.eniId);
        if (!it || it.attach !== "attached" || it.owner_container) {
          throw new ProviderError(
            "wrong_state",
            `ENI "${req.eniId}" is ${
              !it ? "not in the mock cloud" : it.owner_container ? "owned" : "not attached"
            }; it cannot be claimed back`,
          );
        }
        return { eni: claim(it), regroup };
      }
      // A sticky pod's comeback: its previous container's ENI becomes this one's.
      if (req.takeOver) {
        const kept = all.find((r) => sameOwner(r, req.takeOver!));
        if (kept) return { eni: claim(kept), regroup };
      }
      const fits = (r: Row) => r.profile === profile.name && eniMatches(rowToEni(r), req);
      const free = all.find((r) => r.attach === "attached" && !r.owner_container && fits(r));
      if (free) return { eni: claim(free), regroup };
      let candidate = all.find((r) => r.attach === "detached" && fits(r));
      if (!candidate && req.ips.length > 0) candidate = this.#createWithIps(profile, req.ips, all);
      const onNode = all.filter((r) => r.attach !== "detached").length;
      // ENIs that are not enim's take slots of the node's quota too.
      const taken = onNode + node.foreignEnis;
      if (candidate && taken < max) return { eni: claim(candidate), regroup };
      if (candidate) {
        // At the limit: an idle ENI of another profile makes room (pods go before pools).
        const idle = all.find((r) =>
          r.attach === "attached" && !r.owner_container && r.profile !== profile.name
        );
        if (idle) {
          prepared(this.#db, "UPDATE mock_enis SET attach = 'detached' WHERE id = ?").run(idle.id);
          const why = `the node is at its limit of ${max} ENIs (${taken} taken, ` +
            `maxEnisPerNode) and a pod of profile "${profile.name}" needs ${candidate.id}: ` +
            `pods go before another profile's idle ENIs`;
          return { eni: claim(candidate), regroup, detach: idle, why };
        }
      }
      if (!specific) {
        throw new ProviderError(
          "no_eni_available",
          `No ENI available for profile "${profile.name}": ${
            all.filter((r) =>
              r.attach === "attached" && !r.owner_container && r.profile === profile.name
            )
              .length
          } free, ${onNode} of ${max} attached${
            node.foreignEnis > 0 ? ` and ${node.foreignEnis} not enim's` : ""
          }`,
        );
      }
      const matching = all.filter(fits);
      const why = matching.length === 0
        ? req.ips.length > 0
          ? unmatchedIps(req, all.filter((r) => r.profile === profile.name).map(rowToEni))
          : "no ENI is in range"
        : matching.every((r) => r.owner_container)
        ? `held by ${matching.map((r) => `"${r.owner_pod}"`).join(", ")}`
        : `the node is at its limit of ${max} ENIs`;
      const what = req.ips.length > 0
        ? `The requested IP${req.ips.length > 1 ? "s" : ""} ${req.ips.join(", ")}`
        : `An ENI in the requested ranges ${JSON.stringify(req.ranges)}`;
      throw new ProviderError(
        "requested_ip_unavailable",
        `${what} cannot be had on one ENI: ${why}`,
      );
    });
    if (step.detach) {
      this.#ctx.log.info("Released an idle ENI of another profile to make room", {
        eniId: step.detach.id,
        profile: step.detach.profile,
        forProfile: profile.name,
        forEni: step.eni.id,
        pod: owner.pod,
        reason: step.why,
      });
      await this.#ctx.deviceSimulator?.unplug(rowToEni(step.detach));
    }
    if (step.regroup) await this.#regroup(step.eni);
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

  /**
   * A fixed IP no ENI of the inventory carries: a new ENI of the profile with it,
   * as a cloud creates one with a chosen private IP. The IPs must lie in the
   * profile's subnets and be taken by no other ENI; otherwise there is none.
   */
  #createWithIps(p: MockProfile, ips: string[], all: Row[]): Row | undefined {
    const want = { v4: null as string | null, v6: null as string | null };
    for (const ip of ips) {
      const a = parseIp(ip);
      const plan = a?.family === 4 ? p.v4 : p.v6;
      if (!a || !plan || !contains(cidrOf(plan.cidr), a)) return undefined;
      if (normalizeIp(ip) === plan.gateway) return undefined;
      want[a.family === 4 ? "v4" : "v6"] = normalizeIp(ip);
    }
    const taken = new Set(all.flatMap((r) => [r.ipv4, r.ipv6]).filter((a) => a !== null));
    if ([want.v4, want.v6].some((a) => a !== null && taken.has(a))) return undefined;
    // The other family, when the profile has it: the next address no ENI has.
    const next = (plan: Plan | null) => {
      if (!plan) return null;
      for (let n = 2; n < prefixSize(cidrOf(plan.cidr)) - 1; n++) {
        const a = nthAddress(plan.cidr, n);
        if (a !== plan.gateway && !taken.has(a)) return a;
      }
      return null;
    };
    const i = 1 + Math.max(
      p.enis,
      ...all.filter((r) => r.profile === p.name).map((r) => r.idx - p.number * 65536),
    );
    this.#insert(p, i, want.v4 ?? next(p.v4), want.v6 ?? next(p.v6), false);
    return this.#rows("WHERE idx = ?", p.number * 65536 + i)[0];
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

  /** Applies an attached ENI's groups now to its simulated port (the cloud's groups follow the ENI). */
  async #regroup(r: Row): Promise<void> {
    const sim = this.#ctx.deviceSimulator;
    if (!sim?.setSecurityGroups) return;
    try {
      await sim.setSecurityGroups(rowToEni(r));
    } catch (err) {
      throw new ProviderError(
        "other",
        `Cannot apply the security groups of "${r.id}": ${(err as Error).message}`,
        { cause: err },
      );
    }
  }

  async deallocateENI(owner: Owner): Promise<void> {
    this.#assertOpen();
    this.#assertReachable(readMockNode(this.#db), "deallocate");
    this.#inject("deallocate");
    const held = this.#rows(
      "WHERE owner_container = ? AND owner_if = ?",
      owner.containerId,
      owner.ifName,
    );
    for (const r of held) {
      const p = this.#profiles.get(r.profile);
      // The profile's groups and no description again: the next pod gets a clean ENI.
      // An ENI still attaching loses its owner but stays unavailable until the attach settles.
      prepared(
        this.#db,
        `UPDATE mock_enis SET owner_pod = NULL, owner_container = NULL, owner_if = NULL,
           security_groups = ?, enterprise_security_groups = ?, description = NULL WHERE id = ?`,
      ).run(
        JSON.stringify(p?.securityGroupIds ?? r.security_groups),
        JSON.stringify(p?.enterpriseSecurityGroupIds ?? r.enterprise_security_groups),
        r.id,
      );
    }
    for (const r of held) {
      const now = this.#rows("WHERE id = ?", r.id)[0];
      if (now.attach === "attached" && groupsChanged(r, now)) await this.#regroup(now);
    }
  }

  describeENI(eniId: string, text: string | null): Promise<void> {
    this.#assertOpen();
    this.#assertReachable(readMockNode(this.#db), "describe");
    prepared(this.#db, "UPDATE mock_enis SET description = ? WHERE id = ?").run(text, eniId);
    return Promise.resolve();
  }

  status(): Promise<ProviderStatus> {
    this.#assertOpen();
    const node = readMockNode(this.#db);
    const max = this.#limit(node);
    const rows = this.#allRows();
    const attached = rows.filter((r) => r.attach === "attached");
    const onNode = rows.filter((r) => r.attach !== "detached").length;
    const profiles: ProviderStatus["profiles"] = {};
    for (const p of this.#profiles.values()) {
      const mine = attached.filter((r) => r.profile === p.name);
      const owned = mine.filter((r) => r.owner_container).length;
      profiles[p.name] = { free: mine.length - owned, owned };
    }
    return Promise.resolve({
      name: this.name,
      free: attached.filter((r) => !r.owner_container).length,
      owned: attached.filter((r) => r.owner_container).length,
      attachable: Math.max(0, Math.min(max - onNode - node.foreignEnis, rows.length - onNode)),
      details: {
        inventory: rows.length,
        maxEnisPerNode: max,
        // ENIs on the node that are not enim's (shown when there are some, as BCE shows them).
        ...(node.foreignEnis > 0 ? { otherAttached: node.foreignEnis } : {}),
        attaching: rows.filter((r) => r.attach === "attaching").length,
      },
      profiles,
    });
  }

  /**
   * How many ENIs pods can get: the node's limit less the ENIs attached to it that
   * are not enim's. Fails while the cloud does not answer.
   */
  capacity(): Promise<NodeCapacityInput> {
    return Promise.resolve().then((): NodeCapacityInput => {
      this.#assertOpen();
      const node = readMockNode(this.#db);
      this.#assertReachable(node, "capacity");
      const limit = this.#limit(node);
      const foreign = Math.min(node.foreignEnis, limit);
      return {
        limit,
        // The mock creates ENIs only for a fixed IP no pooled ENI carries: a plain pod can
        // get one of the inventory's, so slots past the inventory are not advertised.
        forPods: Math.max(0, Math.min(limit, this.#inventory) - foreign),
        unavailable: foreign > 0 ? [{ reason: "foreign", count: foreign }] : [],
        source: node.maxEnis !== null
          ? "cloud"
          : this.#cfg.maxEnisPerNode !== undefined
          ? "config"
          : "inventory",
      };
    });
  }

  /** Changes what the cloud says of the node (test and demo extra; see `setMockNode`). */
  setNode(patch: Partial<MockNode>): void {
    setMockNode(this.#db, patch);
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

  /** Gives a free ENI back to the mock cloud (uninstall): detached, its device gone. */
  releaseENI(id: string): Promise<void> {
    return this.detach(id);
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

/** Whether an ENI's groups differ between two of its rows. */
function groupsChanged(before: Row, after: Row): boolean {
  return JSON.stringify([before.security_groups, before.enterprise_security_groups]) !==
    JSON.stringify([after.security_groups, after.enterprise_security_groups]);
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
