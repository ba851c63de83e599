/**
 * The BCE provider in exclusive mode (after CCE, reference §6).
 *
 * State lives in the agent's SQLite database:
 * - `bce_enis`: ENIs this provider created that are attached to this node and
 *   ready, each free or owned by one CNI attachment (a UNIQUE index on the
 *   owner and the primary key on the ENI make "one ENI, one owner" a database
 *   invariant);
 * - `bce_intents`: work in flight. A `create` intent carries the clientToken
 *   of its create call (attach/detach/delete use derived tokens) and the ENI
 *   name, so a retry or a restart repeats the *same* operation; a `release`
 *   intent is a surplus ENI being detached and deleted.
 *
 * Node limit: ENIs in `bce_enis` + intents + other ENIs attached to the node
 * (seen at the last sync) never exceed `maxEnisPerNode`. The check and the
 * reservation (inserting the intent) run in one synchronous section, so no
 * interleaving of parallel allocations can overshoot.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import ipaddr from "ipaddr.js";
import {
  type AllocationRequest,
  AllocationRequestSchema,
  type Eni,
  type EniAddress,
  eniMatches,
  type Owner,
  OwnerSchema,
  type Provider,
  type ProviderContext,
  ProviderError,
  type ProviderStatus,
} from "../contract.ts";
import type { Logger } from "../../lib/log.ts";
import { prepared } from "../../lib/sqlite.ts";
import { BceApiError, type BceClient, type BceEni, sleep } from "./client.ts";

/** Settings of {@linkcode BceProvider} (resolved from the config). */
export interface BceProviderOptions {
  client: BceClient;
  instanceId: string;
  vpcId: string;
  subnetId: string;
  /** Known subnet CIDRs (id → CIDR); others are looked up. */
  subnetCidrs?: Record<string, string>;
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
  namePrefix: string;
  description: string;
  /** The node limit; when absent, the instance's ENI quota. */
  maxEnisPerNode?: number;
  warmPool: { minIdle: number; maxIdle: number };
  attachTimeoutMs: number;
  deviceTimeoutMs: number;
  pollMs: number;
  poolIntervalMs: number;
}

interface EniRow {
  eni_id: string;
  mac: string;
  subnet_id: string | null;
  ipv4: string | null;
  ipv6: string | null;
  pod: string | null;
  container_id: string | null;
  if_name: string | null;
}

interface IntentRow {
  id: string;
  kind: "create" | "release";
  client_token: string;
  name: string;
  eni_id: string | null;
  requested_ip: string | null;
  purpose: "owner" | "pool";
  phase: "active" | "cleanup";
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS bce_enis (
  eni_id TEXT PRIMARY KEY,
  mac TEXT NOT NULL,
  subnet_id TEXT,
  ipv4 TEXT,
  ipv6 TEXT,
  pod TEXT,
  container_id TEXT,
  if_name TEXT,
  updated_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS bce_enis_owner ON bce_enis(pod, container_id, if_name)
  WHERE pod IS NOT NULL;
CREATE TABLE IF NOT EXISTS bce_intents (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  client_token TEXT NOT NULL,
  name TEXT NOT NULL,
  eni_id TEXT,
  requested_ip TEXT,
  purpose TEXT NOT NULL,
  phase TEXT NOT NULL DEFAULT 'active',
  created_ms INTEGER NOT NULL
);
`;

/** The BCE exclusive-mode provider. */
export class BceProvider implements Provider {
  readonly name = "bce";
  #o: BceProviderOptions;
  #db: DatabaseSync;
  #log: Logger;
  #ctx: ProviderContext;
  #max = 0;
  /** Other ENIs attached to this node at the last sync (not ours, or ours but untracked). */
  #foreign = 0;
  #synced = false;
  #syncing: Promise<void> | null = null;
  #ownerOps = new Map<string, Promise<Eni>>();
  /** Intent ids some task is working on now. */
  #active = new Set<string>();
  #bg = new Set<Promise<unknown>>();
  #closed = new AbortController();
  #loopTimer: ReturnType<typeof setTimeout> | null = null;
  #tick: Promise<void> | null = null;
  #cidrs = new Map<string, string>();

  constructor(opts: BceProviderOptions, ctx: ProviderContext) {
    this.#o = opts;
    this.#ctx = ctx;
    this.#db = ctx.db;
    this.#log = ctx.log.child({ provider: "bce", instanceId: opts.instanceId });
    for (const [k, v] of Object.entries(opts.subnetCidrs ?? {})) this.#cidrs.set(k, v);
    this.#db.exec(SCHEMA);
  }

  /** The node limit in force. */
  get maxEnisPerNode(): number {
    return this.#max;
  }

  /** Resolves the node limit (config, else quota) and syncs with the cloud once. */
  async init(): Promise<void> {
    if (this.#o.maxEnisPerNode) {
      this.#max = this.#o.maxEnisPerNode;
    } else {
      const q = await this.#o.client.eniQuota(this.#o.instanceId);
      this.#max = Math.max(1, q.totalQuantity);
      this.#log.info("ENI limit taken from the instance quota", { maxEnisPerNode: this.#max });
    }
    try {
      await this.#ensureSynced();
    } catch (e) {
      this.#log.warn("Initial BCE sync failed; will retry on first use", { error: e });
    }
  }

  // ---- Provider ----------------------------------------------------------------

  list(): Promise<Eni[]> {
    return Promise.resolve(this.#rows().map((r) => this.#toEni(r)));
  }

  async allocateNextENI(owner: Owner, request: AllocationRequest): Promise<Eni> {
    const o = OwnerSchema.parse(owner);
    const req = AllocationRequestSchema.parse(request);
    const key = ownerKey(o);
    const running = this.#ownerOps.get(key);
    if (running) return await running;
    const p = this.#allocate(o, req);
    this.#ownerOps.set(key, p);
    try {
      return await p;
    } finally {
      this.#ownerOps.delete(key);
    }
  }

  async deallocateENI(owner: Owner): Promise<void> {
    const o = OwnerSchema.parse(owner);
    const running = this.#ownerOps.get(ownerKey(o));
    if (running) await running.catch(() => {});
    const r = prepared(
      this.#db,
      "UPDATE bce_enis SET pod = NULL, container_id = NULL, if_name = NULL, updated_ms = ? WHERE pod = ? AND container_id = ? AND if_name = ?",
    ).run(Date.now(), o.pod, o.containerId, o.ifName);
    if (Number(r.changes) > 0) this.#log.info("ENI returned to the free pool", { owner: o });
  }

  status(): Promise<ProviderStatus> {
    const rows = this.#rows();
    const owned = rows.filter((r) => r.pod !== null).length;
    const intents = this.#intents();
    return Promise.resolve({
      name: this.name,
      free: rows.length - owned,
      owned,
      attachable: Math.max(0, this.#max - this.#slotsUsed()),
      details: {
        instanceId: this.#o.instanceId,
        maxEnisPerNode: this.#max,
        creating: intents.filter((i) => i.kind === "create" && i.phase === "active").length,
        releasing: intents.filter((i) => i.kind === "release").length,
        cleanup: intents.filter((i) => i.phase === "cleanup").length,
        otherAttached: this.#foreign,
        warmPool: this.#o.warmPool,
      },
    });
  }

  /** Starts the warm pool loop (first pass at once). */
  start(): Promise<void> {
    if (this.#loopTimer === null && !this.#closed.signal.aborted) this.#schedule(0);
    return Promise.resolve();
  }

  async close(): Promise<void> {
    this.#closed.abort();
    if (this.#loopTimer !== null) clearTimeout(this.#loopTimer);
    this.#loopTimer = null;
    this.#o.client.close();
    await this.#tick?.catch(() => {});
    await Promise.allSettled([...this.#bg]);
  }

  // ---- warm pool -------------------------------------------------------------------

  #schedule(ms: number): void {
    this.#loopTimer = setTimeout(() => {
      this.#loopTimer = null;
      this.#tick = this.maintainPool().catch((e) => {
        this.#log.warn("Warm pool pass failed", { error: e });
      }).finally(() => {
        this.#tick = null;
        if (!this.#closed.signal.aborted) this.#schedule(this.#o.poolIntervalMs);
      });
    }, ms);
  }

  /**
   * One warm pool pass: sync with the cloud, finish or clean up intents, then
   * create ENIs up to `minIdle` free (within the node limit) or release free
   * ones above `maxIdle`. Only ENIs this provider created are ever released.
   */
  async maintainPool(): Promise<void> {
    await this.reconcile();
    if (this.#closed.signal.aborted) return;
    await this.#collectOrphans();
    if (this.#closed.signal.aborted) return;
    const { minIdle, maxIdle } = this.#o.warmPool;
    const free = this.#rows().filter((r) => r.pod === null);
    const creating =
      this.#intents().filter((i) =>
        i.kind === "create" && i.purpose === "pool" && i.phase === "active"
      ).length;
    const work: Promise<unknown>[] = [];
    for (let n = free.length + creating; n < minIdle; n++) {
      const intent = this.#reserve("pool", null);
      if (!intent) break;
      work.push(
        this.#finishCreate(intent).catch((e) => {
          this.#log.warn("Warm pool ENI creation failed", { error: e });
        }),
      );
    }
    for (let n = free.length; n > maxIdle; n--) {
      const intent = this.#takeFreeForRelease();
      if (!intent) break;
      work.push(
        this.#release(intent).catch((e) => {
          this.#log.warn("Warm pool ENI release failed; will retry", { error: e });
        }),
      );
    }
    await Promise.all(work);
  }

  /**
   * Syncs with the cloud: resumes or cleans up intents left by a crash or a
   * failure, adopts attached ENIs with our marker that are not tracked, drops
   * rows of ENIs that are no longer attached here, and counts other ENIs.
   */
  reconcile(): Promise<void> {
    if (!this.#syncing) {
      this.#syncing = this.#reconcile().then(() => {
        this.#synced = true;
      }).finally(() => {
        this.#syncing = null;
      });
    }
    return this.#syncing;
  }

  async #ensureSynced(): Promise<void> {
    if (!this.#synced) await this.reconcile();
  }

  async #reconcile(): Promise<void> {
    const started = Date.now();
    const attached = await this.#o.client.listEnis({
      vpcId: this.#o.vpcId,
      instanceId: this.#o.instanceId,
    });
    const onNode = attached.filter((e) =>
      e.instanceId === this.#o.instanceId && (e.status === "inuse" || e.status === "attaching")
    );
    const rows = new Map(this.#rows().map((r) => [r.eni_id, r]));
    const intentEnis = new Set(this.#intents().map((i) => i.eni_id).filter((x) => x !== null));
    const cloudIds = new Set(onNode.map((e) => e.eniId));
    // Rows whose ENI left this node (older than the list, so not just added).
    for (const r of rows.values()) {
      if (cloudIds.has(r.eni_id)) continue;
      const fresh = prepared(this.#db, "SELECT updated_ms FROM bce_enis WHERE eni_id = ?").get(
        r.eni_id,
      ) as { updated_ms: number } | undefined;
      if (!fresh || fresh.updated_ms >= started) continue;
      prepared(this.#db, "DELETE FROM bce_enis WHERE eni_id = ?").run(r.eni_id);
      this.#log.warn("ENI is no longer attached to this node; dropped", {
        eniId: r.eni_id,
        owner: r.pod ? { pod: r.pod, containerId: r.container_id, ifName: r.if_name } : null,
      });
    }
    let foreign = 0;
    for (const e of onNode) {
      if (rows.has(e.eniId) || intentEnis.has(e.eniId)) continue;
      if (this.#isOurs(e) && e.status === "inuse") {
        const adopted = await this.#adopt(e.eniId);
        if (adopted) continue;
      }
      foreign++;
    }
    this.#foreign = foreign;
    // Intents nobody works on (a crash, a failed cleanup): finish or clean up.
    for (const intent of this.#intents()) {
      if (this.#active.has(intent.id)) continue;
      const task = intent.kind === "release"
        ? this.#release(intent)
        : intent.phase === "cleanup"
        ? this.#cleanup(intent)
        : this.#finishCreate(intent).then(() => {});
      this.#track(task.catch((e) => {
        this.#log.warn("Resuming a BCE intent failed", { intent: intent.id, error: e });
      }));
    }
  }

  /**
   * Deletes ENIs this node created (name `<prefix>/<instanceId>/…`) that are
   * `available` and known to no row and no intent: leftovers of a crash or of
   * a detach by someone else. ENIs of other nodes or without the marker are
   * never touched.
   */
  async #collectOrphans(): Promise<void> {
    const mine = `${this.#o.namePrefix}/${this.#o.instanceId}/`;
    const listed = await this.#o.client.listEnis({ vpcId: this.#o.vpcId, namePrefix: mine });
    const intents = this.#intents();
    const known = new Set([
      ...this.#rows().map((r) => r.eni_id),
      ...intents.map((i) => i.eni_id).filter((x) => x !== null),
    ]);
    const names = new Set(intents.map((i) => i.name));
    for (const e of listed) {
      if (e.status !== "available" || known.has(e.eniId) || names.has(e.name)) continue;
      if (!e.name.startsWith(mine)) continue;
      try {
        await this.#o.client.deleteEni(e.eniId, crypto.randomUUID());
        this.#log.info("Deleted an orphaned ENI of this node", { eniId: e.eniId, name: e.name });
      } catch (err) {
        this.#log.warn("Cannot delete an orphaned ENI", { eniId: e.eniId, error: err });
      }
    }
  }

  async #adopt(eniId: string): Promise<boolean> {
    const d = await this.#o.client.getEni(eniId);
    if (d.status !== "inuse" || d.instanceId !== this.#o.instanceId || !this.#isOurs(d)) {
      return false;
    }
    const exists = prepared(this.#db, "SELECT 1 FROM bce_enis WHERE eni_id = ?").get(eniId);
    const pending = this.#intents().some((i) => i.eni_id === eniId);
    if (exists || pending) return true;
    await this.#insertRow(d, null);
    this.#log.info("Adopted an attached ENI with our marker into the free pool", { eniId });
    return true;
  }

  // ---- allocation --------------------------------------------------------------------

  async #allocate(owner: Owner, req: AllocationRequest): Promise<Eni> {
    const held = prepared(
      this.#db,
      "SELECT * FROM bce_enis WHERE pod = ? AND container_id = ? AND if_name = ?",
    ).get(owner.pod, owner.containerId, owner.ifName) as EniRow | undefined;
    if (held) return this.#toEni(held);
    const picked = this.#pickFree(owner, req);
    if (picked) return picked;

    await this.#ensureSynced();
    // The sync awaited: look again before creating.
    const again = this.#pickFree(owner, req);
    if (again) return again;

    const wantIp = req.ips.find((ip) => ipaddr.IPv4.isValid(ip)) ?? null;
    // Known before reserving, so nothing after the create can fail on it.
    const cidr = await this.#cidr(this.#o.subnetId);
    const unreachable = req.ranges.find((set) => !set.some((r) => overlaps(r.subnet, cidr)));
    if (unreachable) {
      throw new ProviderError(
        "requested_ip_unavailable",
        `No free ENI matches the requested range ${
          JSON.stringify(unreachable.map((r) => r.subnet))
        } and it does not overlap subnet "${this.#o.subnetId}" (${cidr})`,
      );
    }
    if (req.ips.length > 0) {
      if (!wantIp || !inCidr(wantIp, cidr)) {
        throw new ProviderError(
          "requested_ip_unavailable",
          `No free ENI carries the requested IP ${
            JSON.stringify(req.ips)
          } and it is not in subnet "${this.#o.subnetId}" (${cidr})`,
        );
      }
    }
    const intent = this.#reserve("owner", wantIp);
    if (!intent) {
      const used = this.#slotsUsed();
      throw new ProviderError(
        req.ips.length ? "requested_ip_unavailable" : "no_eni_available",
        `No free ENI on instance "${this.#o.instanceId}"${
          req.ips.length ? ` with IP ${JSON.stringify(req.ips)}` : ""
        } and the node is at its limit (${used} of ${this.#max} ENIs attached or in flight)`,
      );
    }
    const detail = await this.#materialize(intent);
    const eni = await this.#eniFromDetail(detail, null);
    if (!eniMatches(eni, req)) {
      await this.#insertRow(detail, null, intent.id);
      throw new ProviderError(
        "requested_ip_unavailable",
        `The new ENI "${detail.eniId}" (${eni.ipv4?.address}) does not match the requested ranges; it joined the free pool`,
      );
    }
    await this.#insertRow(detail, owner, intent.id);
    this.#log.info("Allocated a new ENI", { eniId: detail.eniId, owner });
    return { ...eni, state: "owned", owner };
  }

  /** Assigns a free matching ENI to `owner` (synchronous: atomic against other allocations). */
  #pickFree(owner: Owner, req: AllocationRequest): Eni | null {
    const free = prepared(this.#db, "SELECT * FROM bce_enis WHERE pod IS NULL ORDER BY eni_id")
      .all() as unknown as EniRow[];
    for (const row of free) {
      const eni = this.#toEni(row);
      if (!eniMatches(eni, req)) continue;
      const r = prepared(
        this.#db,
        "UPDATE bce_enis SET pod = ?, container_id = ?, if_name = ?, updated_ms = ? WHERE eni_id = ? AND pod IS NULL",
      ).run(owner.pod, owner.containerId, owner.ifName, Date.now(), row.eni_id);
      if (Number(r.changes) !== 1) continue;
      this.#log.info("Allocated a free ENI", { eniId: row.eni_id, owner });
      return { ...eni, state: "owned", owner };
    }
    return null;
  }

  /** ENIs counted against the node limit now. */
  #slotsUsed(): number {
    const rows = prepared(this.#db, "SELECT COUNT(*) AS n FROM bce_enis").get() as { n: number };
    const intents = prepared(this.#db, "SELECT COUNT(*) AS n FROM bce_intents").get() as {
      n: number;
    };
    return Number(rows.n) + Number(intents.n) + this.#foreign;
  }

  /**
   * Checks the node limit and reserves a slot by recording a create intent with
   * a fresh clientToken, in one synchronous section. Null when at the limit.
   */
  #reserve(purpose: "owner" | "pool", requestedIp: string | null): IntentRow | null {
    if (this.#closed.signal.aborted) return null;
    if (this.#slotsUsed() >= this.#max) return null;
    const token = crypto.randomUUID();
    const suffix = Array.from(
      crypto.getRandomValues(new Uint8Array(3)),
      (b) => b.toString(16).padStart(2, "0"),
    ).join("");
    const intent: IntentRow = {
      id: token,
      kind: "create",
      client_token: token,
      name: `${this.#o.namePrefix}/${this.#o.instanceId}/${suffix}`.slice(0, 65),
      eni_id: null,
      requested_ip: requestedIp,
      purpose,
      phase: "active",
    };
    prepared(
      this.#db,
      "INSERT INTO bce_intents (id, kind, client_token, name, eni_id, requested_ip, purpose, phase, created_ms) VALUES (?, ?, ?, ?, NULL, ?, ?, 'active', ?)",
    ).run(
      intent.id,
      intent.kind,
      intent.client_token,
      intent.name,
      requestedIp,
      purpose,
      Date.now(),
    );
    this.#active.add(intent.id);
    return intent;
  }

  /** Creates (or finds, via its clientToken), attaches and readies the ENI of an intent. */
  async #materialize(intent: IntentRow): Promise<BceEni> {
    this.#active.add(intent.id);
    try {
      let eniId = intent.eni_id;
      if (!eniId) {
        eniId = await this.#o.client.createEni({
          name: intent.name,
          subnetId: this.#o.subnetId,
          securityGroupIds: this.#o.securityGroupIds,
          enterpriseSecurityGroupIds: this.#o.enterpriseSecurityGroupIds,
          privateIpAddress: intent.requested_ip ?? undefined,
          description: this.#o.description,
        }, intent.client_token);
        intent.eni_id = eniId;
        prepared(this.#db, "UPDATE bce_intents SET eni_id = ? WHERE id = ?").run(eniId, intent.id);
        this.#log.info("Created an ENI", { eniId, clientToken: intent.client_token });
      }
      let d = await this.#o.client.getEni(eniId);
      if (d.status === "available") {
        try {
          await this.#o.client.attachEni(
            eniId,
            this.#o.instanceId,
            `${intent.client_token}-attach`,
          );
        } catch (e) {
          if (!(e instanceof BceApiError) || e.reason !== "wrong_state") throw e;
          d = await this.#o.client.getEni(eniId);
          if (d.instanceId !== this.#o.instanceId) throw e;
        }
      } else if (d.instanceId && d.instanceId !== this.#o.instanceId) {
        throw new ProviderError(
          "wrong_state",
          `ENI "${eniId}" is attached to instance "${d.instanceId}", not "${this.#o.instanceId}"`,
        );
      }
      d = await this.#waitStatus(eniId, "inuse");
      if (this.#ctx.waitForDevice) {
        await this.#ctx.waitForDevice(d.macAddress, this.#o.deviceTimeoutMs);
      }
      return d;
    } catch (e) {
      await this.#abandon(intent, e);
      throw e;
    }
  }

  /** Finishes a create intent into the free pool (pool growth, or resuming after a restart). */
  async #finishCreate(intent: IntentRow): Promise<void> {
    const d = await this.#materialize(intent);
    await this.#insertRow(d, null, intent.id);
    this.#log.info("ENI joined the free pool", { eniId: d.eniId });
  }

  /** After a failed create/attach: undo what the cloud did, or leave it for the loop. */
  async #abandon(intent: IntentRow, cause: unknown): Promise<void> {
    this.#log.warn("Creating or attaching an ENI failed; cleaning up", {
      eniId: intent.eni_id,
      error: cause,
    });
    prepared(this.#db, "UPDATE bce_intents SET phase = 'cleanup' WHERE id = ?").run(intent.id);
    intent.phase = "cleanup";
    if (this.#closed.signal.aborted) {
      this.#active.delete(intent.id);
      return;
    }
    await this.#cleanup(intent).catch((e) => {
      this.#log.warn("ENI cleanup failed; the pool loop will retry", {
        eniId: intent.eni_id,
        error: e,
      });
    });
  }

  /** Detaches (when attached here) and deletes the ENI of a failed intent, then drops the intent. */
  async #cleanup(intent: IntentRow): Promise<void> {
    this.#active.add(intent.id);
    try {
      let eniId = intent.eni_id;
      if (!eniId) {
        // The create may have happened with its response lost: find it by its unique name.
        const found = await this.#o.client.listEnis({
          vpcId: this.#o.vpcId,
          namePrefix: intent.name,
        });
        eniId = found.find((e) => e.name === intent.name)?.eniId ?? null;
      }
      if (eniId) await this.#detachAndDelete(eniId, intent.client_token);
      prepared(this.#db, "DELETE FROM bce_intents WHERE id = ?").run(intent.id);
    } finally {
      this.#active.delete(intent.id);
    }
  }

  /** Moves one free ENI into a release intent (synchronous). */
  #takeFreeForRelease(): IntentRow | null {
    const row = prepared(
      this.#db,
      "SELECT * FROM bce_enis WHERE pod IS NULL ORDER BY updated_ms DESC, eni_id LIMIT 1",
    ).get() as EniRow | undefined;
    if (!row) return null;
    const token = crypto.randomUUID();
    const intent: IntentRow = {
      id: token,
      kind: "release",
      client_token: token,
      name: "",
      eni_id: row.eni_id,
      requested_ip: null,
      purpose: "pool",
      phase: "active",
    };
    this.#db.exec("BEGIN IMMEDIATE");
    try {
      const r = prepared(this.#db, "DELETE FROM bce_enis WHERE eni_id = ? AND pod IS NULL").run(
        row.eni_id,
      );
      if (Number(r.changes) !== 1) {
        this.#db.exec("ROLLBACK");
        return null;
      }
      prepared(
        this.#db,
        "INSERT INTO bce_intents (id, kind, client_token, name, eni_id, requested_ip, purpose, phase, created_ms) VALUES (?, 'release', ?, '', ?, NULL, 'pool', 'active', ?)",
      ).run(intent.id, token, row.eni_id, Date.now());
      this.#db.exec("COMMIT");
    } catch (e) {
      this.#db.exec("ROLLBACK");
      throw e;
    }
    this.#active.add(intent.id);
    return intent;
  }

  async #release(intent: IntentRow): Promise<void> {
    this.#active.add(intent.id);
    try {
      if (intent.eni_id) await this.#detachAndDelete(intent.eni_id, intent.client_token);
      prepared(this.#db, "DELETE FROM bce_intents WHERE id = ?").run(intent.id);
      this.#log.info("Released a surplus ENI", { eniId: intent.eni_id });
    } finally {
      this.#active.delete(intent.id);
    }
  }

  /** Detaches an ENI of ours from this node (if attached here) and deletes it; not-found is done. */
  async #detachAndDelete(eniId: string, token: string): Promise<void> {
    const c = this.#o.client;
    try {
      let d = await c.getEni(eniId);
      if (!this.#isOurs(d)) {
        this.#log.warn("Refusing to delete an ENI without our marker", { eniId, name: d.name });
        return;
      }
      if (d.status === "attaching") d = await this.#waitStatus(eniId, "inuse");
      if (d.status === "inuse") {
        if (d.instanceId !== this.#o.instanceId) return;
        await c.detachEni(eniId, this.#o.instanceId, `${token}-detach`);
      }
      if (d.status !== "available") await this.#waitStatus(eniId, "available");
      await c.deleteEni(eniId, `${token}-delete`);
      this.#log.info("Deleted an ENI", { eniId });
    } catch (e) {
      if (e instanceof ProviderError && e.reason === "not_found") return;
      throw e;
    }
  }

  /** Polls an ENI until it reaches `status` (backoff from pollMs to 5 s), bounded by attachTimeoutMs. */
  async #waitStatus(eniId: string, status: string): Promise<BceEni> {
    const deadline = Date.now() + this.#o.attachTimeoutMs;
    let delay = this.#o.pollMs;
    for (;;) {
      const d = await this.#o.client.getEni(eniId);
      if (d.status === status) return d;
      if (Date.now() + delay > deadline || this.#closed.signal.aborted) {
        throw new ProviderError(
          "unavailable",
          `ENI "${eniId}" did not become ${status} within ${this.#o.attachTimeoutMs} ms (it is ${d.status})`,
        );
      }
      await sleep(delay, this.#closed.signal);
      delay = Math.min(5000, delay * 2);
    }
  }

  // ---- rows and conversion ------------------------------------------------------------

  /** Records a ready ENI (free, or owned) and drops its intent, in one transaction. */
  async #insertRow(d: BceEni, owner: Owner | null, intentId?: string): Promise<void> {
    const eni = await this.#eniFromDetail(d, owner);
    this.#db.exec("BEGIN IMMEDIATE");
    try {
      prepared(
        this.#db,
        "INSERT OR REPLACE INTO bce_enis (eni_id, mac, subnet_id, ipv4, ipv6, pod, container_id, if_name, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
      ).run(
        eni.id,
        eni.mac,
        eni.subnetId,
        eni.ipv4 ? JSON.stringify(eni.ipv4) : null,
        eni.ipv6 ? JSON.stringify(eni.ipv6) : null,
        owner?.pod ?? null,
        owner?.containerId ?? null,
        owner?.ifName ?? null,
        Date.now(),
      );
      if (intentId) prepared(this.#db, "DELETE FROM bce_intents WHERE id = ?").run(intentId);
      this.#db.exec("COMMIT");
    } catch (e) {
      this.#db.exec("ROLLBACK");
      throw e;
    } finally {
      if (intentId) this.#active.delete(intentId);
    }
  }

  async #eniFromDetail(d: BceEni, owner: Owner | null): Promise<Eni> {
    const v4 = d.privateIpSet.find((p) => p.primary) ?? d.privateIpSet[0];
    const v6 = d.ipv6PrivateIpSet[0];
    let ipv4: EniAddress | null = null;
    let ipv6: EniAddress | null = null;
    if (v4) {
      const cidr = await this.#cidr(d.subnetId);
      ipv4 = {
        address: v4.privateIpAddress,
        prefixLength: prefixOf(cidr),
        gateway: firstHost(cidr),
      };
    }
    if (v6) {
      const cidr6 = this.#cidrs.get(`${d.subnetId}#6`);
      if (cidr6) {
        ipv6 = {
          address: v6.privateIpAddress,
          prefixLength: prefixOf(cidr6),
          gateway: firstHost(cidr6),
        };
      }
    }
    return {
      id: d.eniId,
      mac: d.macAddress.toLowerCase(),
      ipv4,
      ipv6,
      subnetId: d.subnetId || null,
      state: owner ? "owned" : "free",
      owner,
    };
  }

  async #cidr(subnetId: string): Promise<string> {
    const known = this.#cidrs.get(subnetId);
    if (known) return known;
    const s = await this.#o.client.getSubnet(subnetId);
    this.#cidrs.set(subnetId, s.cidr);
    if (s.ipv6Cidr) this.#cidrs.set(`${subnetId}#6`, s.ipv6Cidr);
    return s.cidr;
  }

  #toEni(r: EniRow): Eni {
    const owner = r.pod ? { pod: r.pod, containerId: r.container_id!, ifName: r.if_name! } : null;
    return {
      id: r.eni_id,
      mac: r.mac,
      ipv4: r.ipv4 ? JSON.parse(r.ipv4) : null,
      ipv6: r.ipv6 ? JSON.parse(r.ipv6) : null,
      subnetId: r.subnet_id,
      state: owner ? "owned" : "free",
      owner,
    };
  }

  #rows(): EniRow[] {
    return prepared(this.#db, "SELECT * FROM bce_enis ORDER BY eni_id")
      .all() as unknown as EniRow[];
  }

  #intents(): IntentRow[] {
    return prepared(this.#db, "SELECT * FROM bce_intents ORDER BY created_ms")
      .all() as unknown as IntentRow[];
  }

  /** Whether an ENI carries this provider's marker (its name prefix). */
  #isOurs(e: { name: string }): boolean {
    return e.name.startsWith(`${this.#o.namePrefix}/`);
  }

  #track(p: Promise<unknown>): void {
    this.#bg.add(p);
    p.finally(() => this.#bg.delete(p));
  }
}

function ownerKey(o: Owner): string {
  return JSON.stringify([o.pod, o.containerId, o.ifName]);
}

function inCidr(ip: string, cidr: string): boolean {
  try {
    const [net, len] = ipaddr.parseCIDR(cidr);
    const a = ipaddr.parse(ip);
    return a.kind() === net.kind() && a.match(net, len);
  } catch {
    return false;
  }
}

/** Whether two CIDRs share an address (one contains the other's network address). */
function overlaps(a: string, b: string): boolean {
  try {
    const [na, la] = ipaddr.parseCIDR(a);
    const [nb, lb] = ipaddr.parseCIDR(b);
    if (na.kind() !== nb.kind()) return false;
    return na.match(nb, lb) || nb.match(na, la);
  } catch {
    return false;
  }
}

function prefixOf(cidr: string): number {
  return ipaddr.parseCIDR(cidr)[1];
}

/** The first host of a CIDR (network address + 1): BCE's subnet gateway. */
export function firstHost(cidr: string): string {
  const [net, len] = ipaddr.parseCIDR(cidr);
  const bytes = net.toByteArray();
  const bits = bytes.length * 8;
  // Zero the host part, then add one.
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, len - i * 8));
    bytes[i] &= (0xff << (8 - keep)) & 0xff;
  }
  if (len < bits) {
    for (let i = bytes.length - 1; i >= 0; i--) {
      if (bytes[i] < 255) {
        bytes[i]++;
        break;
      }
      bytes[i] = 0;
    }
  }
  return ipaddr.fromByteArray(bytes).toString();
}
