/**
 * A tiny in-memory {@linkcode EniManager} for API and CLI tests: it records every
 * call, hands out ENIs from a fixed pool and can be told to throw.
 *
 * @module
 */
import { ApiError, type Attachment, type GcReport, type Status } from "../../api/schema.ts";
import type {
  AddInput,
  CheckInput,
  DelInput,
  EniManager,
  GcInput,
  ReconcileReport,
} from "../../manager/types.ts";
import { type Eni, makeEni, podKeyOf } from "../../providers/contract.ts";

/** A fake manager; `calls` lists what it was asked, `failWith` makes the next call throw. */
export class FakeManager implements EniManager {
  calls: { op: string; arg?: unknown }[] = [];
  failWith: unknown = undefined;
  closed = false;
  /** What `status()` says of `ready` (an agent that has not reconciled, or is stopping: false). */
  ready = true;
  enisList: Eni[];
  atts = new Map<string, Attachment>();
  /** GC items returned by `gc`; `failed` ones fail on a real run. */
  gcPlan: { eniId: string; reason: string; fail?: string }[] = [];

  constructor(count = 3) {
    this.enisList = Array.from({ length: count }, (_, i) =>
      makeEni({
        id: `eni-mock-${String(i + 1).padStart(4, "0")}`,
        mac: `02:00:00:00:00:${(i + 1).toString(16).padStart(2, "0")}`,
        ipv4: { address: `10.0.1.${10 + i}`, prefixLength: 24, gateway: "10.0.1.1" },
        ipv6: i % 2 === 0
          ? { address: `fd00::${10 + i}`, prefixLength: 64, gateway: "fd00::1" }
          : null,
        subnetId: "sbn-mock",
        state: "free",
        owner: null,
      }));
  }

  #maybeFail(op: string, arg?: unknown) {
    this.calls.push({ op, arg });
    if (this.failWith !== undefined) {
      const e = this.failWith;
      this.failWith = undefined;
      throw e;
    }
  }

  /** A JSON dump of the whole state, for before/after comparisons. */
  dump(): string {
    return JSON.stringify({ enis: this.enisList, atts: [...this.atts.entries()] });
  }

  add(req: AddInput) {
    this.#maybeFail("add", req);
    const key = `${req.containerId}/${req.ifName}`;
    const existing = this.atts.get(key);
    let eni = existing ? this.enisList.find((e) => e.id === existing.eniId) : undefined;
    if (!eni) {
      eni = this.enisList.find((e) => e.state === "free");
      if (!eni) return Promise.reject(new ApiError("no_eni_available", "No ENI is available"));
      eni.state = "owned";
      eni.owner = {
        pod: podKeyOf(req.pod),
        containerId: req.containerId,
        ifName: req.ifName,
      };
      const now = new Date(Date.now() - 90_000).toISOString();
      this.atts.set(key, {
        containerId: req.containerId,
        ifName: req.ifName,
        pod: podKeyOf(req.pod),
        podUid: req.pod.uid ?? null,
        network: req.network,
        netns: req.netns,
        mode: req.mode,
        state: "ready",
        eniId: eni.id,
        mac: eni.mac,
        nodeName: `eni${eni.id.slice(-4)}`,
        createdAt: now,
        updatedAt: now,
        profile: "default",
        sticky: false,
        holdUntil: null,
        parkUntil: null,
        hostLink: null,
        delAnsweredAt: null,
      });
    }
    return Promise.resolve({
      eniId: eni.id,
      mac: eni.mac,
      ifindex: 7,
      nodeName: `eni${eni.id.slice(-4)}`,
      ips: [{ address: `${eni.ipv4!.address}/24`, gateway: eni.ipv4!.gateway }],
      routes: req.routes.map((r) => ({ dst: r.dst, gw: r.gw ?? eni!.ipv4!.gateway })),
    });
  }

  del(req: DelInput) {
    this.#maybeFail("del", req);
    const key = `${req.containerId}/${req.ifName}`;
    const att = this.atts.get(key);
    if (att) {
      const eni = this.enisList.find((e) => e.id === att.eniId)!;
      eni.state = "free";
      eni.owner = null;
      this.atts.delete(key);
    }
    return Promise.resolve();
  }

  check(req: CheckInput) {
    this.#maybeFail("check", req);
    if (!this.atts.has(`${req.containerId}/${req.ifName}`)) {
      return Promise.reject(new ApiError("check_failed", "No such attachment"));
    }
    return Promise.resolve();
  }

  gc(req: GcInput): Promise<GcReport> {
    this.#maybeFail("gc", req);
    const items = this.gcPlan.map((p) => {
      const eni = this.enisList.find((e) => e.id === p.eniId)!;
      const att = [...this.atts.values()].find((a) => a.eniId === p.eniId);
      const base = {
        eniId: eni.id,
        mac: eni.mac,
        device: att?.nodeName ?? "",
        pod: att?.pod ?? "",
        containerId: att?.containerId ?? "",
        ifName: att?.ifName ?? "",
        netns: att?.netns ?? "",
        reason: p.reason,
        action: "move device back, scrub, deallocate",
        kind: "dead" as const,
        profile: "default",
      };
      if (req.dryRun) return { ...base, outcome: "planned" as const };
      if (p.fail) return { ...base, outcome: "failed" as const, error: p.fail };
      if (att) this.atts.delete(`${att.containerId}/${att.ifName}`);
      eni.state = "free";
      eni.owner = null;
      return { ...base, outcome: "reclaimed" as const };
    });
    return Promise.resolve({ dryRun: req.dryRun, items, unfinishedDels: [] });
  }

  reconcile(): Promise<ReconcileReport> {
    this.#maybeFail("reconcile");
    return Promise.resolve({
      rolledBack: 0,
      finished: 0,
      orphansFreed: 0,
      repaired: 0,
      errors: [],
    });
  }

  status(): Promise<Status> {
    this.#maybeFail("status");
    const free = this.enisList.filter((e) => e.state === "free").length;
    return Promise.resolve({
      version: "0.1.0",
      provider: "mock",
      ready: this.ready,
      canAllocate: free > 0,
      pool: {
        exhausted: free === 0,
        free,
        owned: this.enisList.length - free,
        recycling: 0,
        held: 0,
        attachable: 0,
        profiles: { default: { free, owned: this.enisList.length - free, recycling: 0, held: 0 } },
      },
      enis: this.enisList.map((e) => {
        const att = [...this.atts.values()].find((a) => a.eniId === e.id) ?? null;
        return { ...e, device: att?.nodeName ?? `eni${e.id.slice(-4)}`, attachment: att };
      }),
      providerDetails: {},
      sticky: { parked: [], claims: [] },
      hostLinks: { links: 0, withoutServiceCidrs: [] },
      unfinishedDels: [],
    });
  }

  attachments(): Attachment[] {
    this.#maybeFail("attachments");
    return [...this.atts.values()];
  }

  enis(): Promise<Eni[]> {
    this.#maybeFail("enis");
    return Promise.resolve(this.enisList);
  }

  close(): Promise<void> {
    this.closed = true;
    return Promise.resolve();
  }
}
