/**
 * Garbage collection: find attachments whose pod is gone and reclaim their ENIs.
 *
 * Liveness is pluggable: each {@linkcode LivenessSource} reports the attachments
 * it knows to be dead, with a reason; the pass reclaims the union. Built in:
 * the pod's netns is gone or replaced, a CNI GC call's valid-attachments list,
 * the seed's recycling rule, and releases that did not finish. A Kubernetes
 * source can be added without touching the rest.
 *
 * Two kinds of pass:
 * - the agent's own (periodic, at start-up, `enim gc`): every attachment and
 *   every orphan ENI (owned in the provider by an attachment the state does not
 *   know); a grace period protects attachments younger than `graceMs`, and
 *   every `adding` one;
 * - a CNI GC call for network N: only N's attachments, and no orphans (their
 *   network is unknown; the agent's own pass covers them). The spec makes the
 *   runtime run GC exclusively of ADD and DEL ("must ensure that no add or
 *   delete operations are in progress before executing gc"), so from a runtime
 *   that keeps the rule the valid list is complete. Defence in depth against
 *   one that does not (a runtime bug, a restarted kubelet, a second tool on the
 *   node with an older list): the list alone never takes an attachment younger
 *   than `graceMs` (since its row was made, or an ADD last answered for it),
 *   which is left for the next pass and logged with the reason; the kernel's
 *   facts (its netns gone or replaced) and unfinished releases still count at
 *   any age. What is truly in flight is spared as before: an `adding`
 *   attachment, and one whose operation holds its lock (reclaim waits for the
 *   lock and re-reads the row).
 *
 * Either kind of pass leaves an attachment for which an ADD answered success
 * after the pass was asked for: the runtime asserted it after the facts the
 * pass works from.
 *
 * Sticky pods' held ENIs (state `held`) are no attachment of the runtime: no
 * liveness source sees them (their netns is gone by design, and a CNI GC list
 * never names them). The agent's own pass frees each one when its hold expires,
 * or, for a zone-sticky pod whose node hold ended, parks it in the VPC for the
 * rest of its hold (`park`).
 *
 * A dry run reads (state, provider list, netns identities) and changes
 * nothing. A reclaim failure is recorded on its row and retried by the next
 * pass; it never stops the pass.
 *
 * @module
 */
import type { DeviceLayer } from "../netns/types.ts";
import type { Owner, Provider } from "../providers/contract.ts";
import type { Logger } from "../lib/log.ts";
import type { GcItemSchema, GcReport } from "../api/schema.ts";
import type { AttachmentRow, StateStore } from "./state.ts";
import { keyOf } from "../providers/schema.ts";
import type { GcInput } from "./types.ts";
import type { KeyedMutex } from "./mutex.ts";
import type * as z from "zod/mini";

type GcItem = z.infer<typeof GcItemSchema>;

import {
  cniGcLiveness,
  type LivenessContext,
  type LivenessSource,
  type Verdict,
} from "./liveness/mod.ts";
export type { LivenessContext, LivenessSource, Verdict };
export {
  cniGcLiveness,
  defaultLivenessSources,
  netnsLiveness,
  recyclingLiveness,
  unfinishedLiveness,
} from "./liveness/mod.ts";

/** What the GC needs from the manager. */
export interface GcDeps {
  state: StateStore;
  provider: Provider;
  devices: DeviceLayer;
  log: Logger;
  locks: KeyedMutex;
  now: () => number;
  graceMs: number;
  sources: LivenessSource[];
  /** Releases one attachment (state deleting → device back → deallocate → row deleted). */
  release(
    row: AttachmentRow,
    opts: { netnsUsable: boolean; park?: { until: number }; reuseWait?: boolean },
  ): Promise<void>;
  /** Frees an ENI the provider shows owned by an attachment the state does not know. */
  freeOrphan(owner: Owner, eni: { id: string; mac: string }): Promise<boolean>;
  /** When an ADD last answered success for the key, if known. */
  addAnsweredAt?(key: string): AddAnswered | undefined;
  /**
   * When the key's DEL answered, while that DEL is still finishing (the clock): the pass
   * leaves the attachment to it and reports it as such.
   */
  delAnsweredAt?(key: string): number | undefined;
}

/** When an ADD answered success: `performance.now()` (ordering) and the clock (`now()`, age). */
export interface AddAnswered {
  mono: number;
  at: number;
}

/** A pass's request: what it is asked to do, and when the agent received it. */
export interface GcPassOptions {
  /** When the request reached the agent (`performance.now()`); default: when the pass begins. */
  receivedAt?: number;
}

interface PlanItem {
  item: GcItem;
  row: AttachmentRow | null;
  owner: Owner;
  netnsUsable: boolean;
  /** A zone-sticky pod's node hold ended: the ENI is parked until then instead of freed. */
  park?: { until: number };
}

/** Whether a held row whose node hold ended is parked (zone scope, hold left) rather than freed. */
function parks(r: AttachmentRow, now: number): boolean {
  return r.state === "held" && r.parkUntil !== null && r.parkUntil > now;
}

/** Whether the grace period protects `r` from GC. */
function protectedByGrace(r: AttachmentRow, now: number, graceMs: number): boolean {
  if (r.state === "adding") return true;
  if (r.state === "deleting") return false;
  return now - r.createdAt < graceMs;
}

function describeAction(r: AttachmentRow, netnsUsable: boolean, park = false): string {
  const free = r.eniId
    ? `${park ? "park" : "free"} ${r.eniId}${park ? " in the VPC" : ""}`
    : "forget the attachment";
  if (!r.mac) return free;
  const name = r.nodeName ? `"${r.nodeName}"` : "its node name";
  const where = r.mode === "interface" && netnsUsable
    ? `move "${r.ifName}" from ${r.netns} back to the node as ${name}`
    : `find ${r.mac} on the node, rename it ${name}`;
  return `${where}, scrub it, ${free}`;
}

/** An attachment a CNI GC's list left out that the pass leaves alone for now, and why. */
interface LeftItem {
  key: string;
  eniId: string | null;
  reason: string;
  ageSeconds: number;
}

/**
 * What a pass would reclaim, what a CNI GC's list alone would have taken but is left,
 * and the DELs still finishing (left to them).
 */
interface Plan {
  items: PlanItem[];
  left: LeftItem[];
  unfinishedDels: GcReport["unfinishedDels"];
}

/**
 * How long ago the attachment was made or an ADD last answered for it (ms): the
 * younger of the two, so a retried ADD the runtime just saw succeed counts as new.
 */
function ageOf(deps: GcDeps, r: AttachmentRow, now: number): number {
  const answered = deps.addAnsweredAt?.(keyOf(r))?.at;
  return now - Math.max(r.createdAt, answered ?? -Infinity);
}

/** Works out what a pass would reclaim (reads only). */
export async function planGc(deps: GcDeps, req: GcInput): Promise<Plan> {
  const now = deps.now();
  // The provider first, then the state: an ENI owned in this snapshot by a key without
  // a row is a real orphan (rows are written before allocating and deleted after freeing).
  const enis = await deps.provider.list();
  const all = deps.state.all();
  // A DEL that answered and is finishing owns its attachment: not GC's unless it fails
  // (its record then stays `deleting`, and a later pass takes it).
  const finishing = all.filter((r) =>
    r.state === "deleting" && deps.delAnsweredAt?.(keyOf(r)) !== undefined
  );
  const unfinishedDels = finishing
    .filter((r) => req.network === undefined || r.network === req.network)
    .map((r) => ({
      pod: r.pod,
      containerId: r.containerId,
      ifName: r.ifName,
      eniId: r.eniId,
      answeredAt: new Date(deps.delAnsweredAt!(keyOf(r))!).toISOString(),
    }));
  const rows = all.filter((r) => !finishing.includes(r));
  const cniGc = req.network !== undefined && req.validAttachments !== undefined;
  const candidates = cniGc
    ? rows.filter((r) => r.network === req.network && r.state !== "adding")
    : rows.filter((r) => !protectedByGrace(r, now, deps.graceMs));
  const ctx: LivenessContext = { now, graceMs: deps.graceMs, request: req, devices: deps.devices };
  const attached = candidates.filter((r) => r.state !== "held");
  const verdicts = new Map<string, Verdict[]>();
  /** Keys some source other than the CNI GC list found dead. */
  const otherwise = new Set<string>();
  for (const src of deps.sources) {
    const dead = await src.dead(attached, ctx);
    for (const [k, v] of dead) {
      verdicts.set(k, [...(verdicts.get(k) ?? []), v]);
      if (src.name !== cniGcLiveness.name) otherwise.add(k);
    }
  }
  const left: LeftItem[] = [];
  if (cniGc) {
    // The list alone never takes a young attachment: a stale list (taken before that
    // ADD answered) would tear the network out of a pod that has just started.
    for (const r of attached) {
      const k = keyOf(r);
      if (!verdicts.has(k) || otherwise.has(k) || r.state === "deleting") continue;
      const age = ageOf(deps, r, now);
      if (age >= deps.graceMs) continue;
      verdicts.delete(k);
      left.push({
        key: k,
        eniId: r.eniId,
        ageSeconds: Math.round(age / 100) / 10,
        reason: `not in cni.dev/valid-attachments of network "${req.network}", but made or ` +
          `confirmed by an ADD ${Math.round(age / 100) / 10} s ago, within the GC grace period ` +
          `of ${deps.graceMs / 1000} s: the list may predate that ADD; left for the next pass`,
      });
    }
  }
  if (!cniGc) {
    for (const r of rows) {
      if (r.state !== "held" || r.holdUntil === null || r.holdUntil > now) continue;
      verdicts.set(keyOf(r), [{
        reason: parks(r, now)
          ? `the sticky pod "${r.pod}" did not come back before its node hold ended at ${
            new Date(r.holdUntil).toISOString()
          }; its ENI is parked in the VPC for it until ${new Date(r.parkUntil!).toISOString()}`
          : `the sticky pod "${r.pod}" did not come back before its hold expired at ${
            new Date(r.holdUntil).toISOString()
          }`,
        netnsUsable: false,
      }]);
    }
  }
  const plan: PlanItem[] = [];
  for (const r of cniGc ? attached : rows) {
    const vs = verdicts.get(keyOf(r));
    if (!vs) continue;
    const netnsUsable = vs.every((v) => v.netnsUsable !== false);
    const park = !cniGc && parks(r, now);
    plan.push({
      row: r,
      owner: { pod: r.pod, containerId: r.containerId, ifName: r.ifName },
      netnsUsable,
      ...(park ? { park: { until: r.parkUntil! } } : {}),
      item: {
        eniId: r.eniId ?? "",
        mac: r.mac ?? "",
        device: r.nodeName ?? "",
        pod: r.pod,
        containerId: r.containerId,
        ifName: r.ifName,
        netns: r.netns,
        reason: vs.map((v) => v.reason).join("; "),
        action: describeAction(r, netnsUsable, park),
        outcome: "planned",
        kind: park ? "park" : r.state === "held" ? "hold" : "dead",
        profile: r.profile,
      },
    });
  }
  if (cniGc) return { items: plan, left, unfinishedDels };
  const known = new Set(all.map(keyOf));
  for (const e of enis) {
    if (!e.owner || known.has(keyOf(e.owner))) continue;
    plan.push({
      row: null,
      owner: e.owner,
      netnsUsable: false,
      item: {
        eniId: e.id,
        mac: e.mac,
        device: "",
        pod: e.owner.pod,
        containerId: e.owner.containerId,
        ifName: e.owner.ifName,
        netns: "",
        reason: "the provider shows it owned by an attachment the agent does not know",
        action: `find ${e.mac} on the node, scrub it, free ${e.id}`,
        outcome: "planned",
        kind: "orphan",
        profile: e.profile,
      },
    });
  }
  return { items: plan, left, unfinishedDels };
}

/** Runs one GC pass (or plans it, for a dry run). */
export async function runGc(
  deps: GcDeps,
  req: GcInput,
  opts: GcPassOptions = {},
): Promise<GcReport> {
  const began = Math.min(opts.receivedAt ?? Infinity, performance.now());
  const { items: plan, left, unfinishedDels } = await planGc(deps, req);
  if (req.dryRun) return { dryRun: true, items: plan.map((p) => p.item), unfinishedDels };
  for (const l of left) {
    deps.log.info("GC leaves a young attachment a CNI GC did not list", {
      key: l.key,
      eniId: l.eniId,
      ageSeconds: l.ageSeconds,
      graceSeconds: deps.graceMs / 1000,
      reason: l.reason,
    });
  }
  const items: GcItem[] = [];
  const queue = [...plan];
  const worker = async () => {
    for (let p = queue.shift(); p; p = queue.shift()) {
      const item = await reclaim(deps, p, began);
      if (item) items.push(item);
    }
  };
  await Promise.all(Array.from({ length: Math.min(8, queue.length) }, worker));
  const order = new Map(plan.map((p, i) => [keyOf(p.owner), i]));
  items.sort((a, b) => (order.get(keyOf(a)) ?? 0) - (order.get(keyOf(b)) ?? 0));
  const failed = items.filter((i) => i.outcome === "failed").length;
  if (items.length > 0) {
    deps.log.info("GC pass done", { reclaimed: items.length - failed, failed });
  }
  return { dryRun: false, items, unfinishedDels };
}

/**
 * Reclaims one planned item under its attachment's lock; null when it went away
 * meanwhile, or when an ADD for it answered success after the pass was asked for
 * (`began`: the runtime asserted it after the facts the pass works from: a CNI GC
 * whose plugin process was killed, then the runtime's ADD retry, must not take it
 * away).
 */
async function reclaim(deps: GcDeps, p: PlanItem, began: number): Promise<GcItem | null> {
  const key = keyOf(p.owner);
  return await deps.locks.run(`att:${key}`, async () => {
    const row = deps.state.get(p.owner);
    try {
      if (p.row) {
        // Released or replaced by a DEL/ADD while we planned: not ours any more.
        if (!row || row.createdAt !== p.row.createdAt || row.state === "adding") return null;
        const answered = deps.addAnsweredAt?.(key)?.mono;
        if (row.state !== "deleting" && answered !== undefined && answered > began) {
          deps.log.info("GC leaves an attachment an ADD confirmed after the pass was asked for", {
            key,
            eniId: p.item.eniId,
            reason: p.item.reason,
          });
          return null;
        }
        await deps.release(row, {
          netnsUsable: p.netnsUsable,
          ...(p.park ? { park: p.park } : { reuseWait: true }),
        });
      } else {
        if (row) return null;
        if (!(await deps.freeOrphan(p.owner, { id: p.item.eniId, mac: p.item.mac }))) return null;
      }
      deps.log.info("GC reclaimed an ENI", { eniId: p.item.eniId, key, reason: p.item.reason });
      return { ...p.item, outcome: "reclaimed" as const };
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      // release() has recorded the failure on the row (gc_failures, last_error).
      deps.log.warn("GC could not reclaim an ENI", { eniId: p.item.eniId, key, error: msg });
      return { ...p.item, outcome: "failed" as const, error: msg };
    }
  });
}
