/**
 * The node's status: the provider's pool per profile, the recorded attachments
 * (recycling, held), each ENI with its device and attachment, and (zone-wide
 * sticky pods) the ENIs this node parked in the VPC and the claims it made.
 *
 * @module
 */
import { VERSION } from "../lib/version.ts";
import type { Attachment, Status, UnfinishedDel } from "../api/schema.ts";
import { type AttachmentRow, hostLinkOf, toAttachment } from "./state.ts";
import type { ManagerContext } from "./context.ts";
import type { PoolCounts } from "../lib/metrics.ts";
import { keyOf } from "../providers/schema.ts";

/** A recorded attachment as the API shows it: with when its DEL answered, if still finishing. */
export function attachmentView(ctx: ManagerContext, r: AttachmentRow): Attachment {
  const del = r.state === "deleting" ? ctx.releasing.get(keyOf(r)) : undefined;
  return {
    ...toAttachment(r),
    delAnsweredAt: del ? new Date(del.answeredAt).toISOString() : null,
  };
}

/** The DELs that have answered and are still finishing, oldest first. */
export function unfinishedDels(ctx: ManagerContext, rows: AttachmentRow[]): UnfinishedDel[] {
  return rows.map((r) => ({ r, del: ctx.releasing.get(keyOf(r)) }))
    .filter(({ r, del }) => del !== undefined && r.state === "deleting")
    .sort((a, b) => a.del!.answeredAt - b.del!.answeredAt)
    .map(({ r, del }) => ({
      pod: r.pod,
      containerId: r.containerId,
      ifName: r.ifName,
      eniId: r.eniId,
      answeredAt: new Date(del!.answeredAt).toISOString(),
    }));
}

/** The pool gauges' counts, from a status. */
export function poolCounts(s: Status): PoolCounts {
  return {
    attachable: s.pool.attachable,
    profiles: s.pool.profiles,
    lost: s.enis.filter((e) => e.cloudState === "lost").length,
    details: s.providerDetails,
    ready: s.ready,
    exhausted: Object.fromEntries(
      Object.entries(s.pool.profiles).map((
        [name, c],
      ) => [name, c.free === 0 && s.pool.attachable === 0]),
    ),
  };
}

export async function status(ctx: ManagerContext, ready: boolean): Promise<Status> {
  const [ps, enis] = await Promise.all([ctx.provider.status(), ctx.provider.list()]);
  const rows = ctx.state.all();
  const byEni = new Map(rows.filter((r) => r.eniId).map((r) => [r.eniId!, r]));
  const out: Status["enis"] = [];
  for (const e of enis) {
    const r = byEni.get(e.id);
    let device = r?.nodeName ?? null;
    if (!r) device = (await ctx.devices.findByMac(e.mac).catch(() => null))?.ifname ?? null;
    out.push({ ...e, device, attachment: r ? attachmentView(ctx, r) : null });
  }
  const profiles: Status["pool"]["profiles"] = {};
  const names = new Set([
    ...ctx.provider.profiles().map((p) => p.name),
    ...Object.keys(ps.profiles),
  ]);
  for (const name of names) {
    const mine = rows.filter((r) => r.profile === name);
    profiles[name] = {
      free: ps.profiles[name]?.free ?? 0,
      owned: ps.profiles[name]?.owned ?? 0,
      recycling: mine.filter((r) => r.state === "recycling").length,
      held: mine.filter((r) => r.state === "held").length,
    };
  }
  return {
    version: VERSION,
    provider: ctx.provider.name,
    ready,
    canAllocate: ps.free > 0 || ps.attachable > 0,
    pool: {
      exhausted: ps.free === 0 && ps.attachable === 0,
      free: ps.free,
      owned: ps.owned,
      recycling: rows.filter((r) => r.state === "recycling").length,
      held: rows.filter((r) => r.state === "held").length,
      attachable: ps.attachable,
      profiles,
    },
    enis: out,
    providerDetails: ps.details,
    sticky: ps.sticky ?? { parked: [], claims: [] },
    hostLinks: hostLinkCounts(rows),
    unfinishedDels: unfinishedDels(ctx, rows),
  };
}

/**
 * The node's host links (ready and recycling attachments), and per network the pods
 * whose link routes no Service CIDR: they cannot reach Services.
 */
function hostLinkCounts(rows: ReturnType<ManagerContext["state"]["all"]>): Status["hostLinks"] {
  const live = rows.filter((r) => r.state === "ready" || r.state === "recycling");
  const withLink = live.flatMap((r) => {
    const h = hostLinkOf(r);
    return h ? [{ r, h }] : [];
  });
  const without = new Map<string, string[]>();
  for (const { r, h } of withLink) {
    if (h.serviceCidrs.length > 0) continue;
    without.set(r.network, [...(without.get(r.network) ?? []), r.pod]);
  }
  return {
    links: withLink.length,
    withoutServiceCidrs: [...without].map(([network, pods]) => ({ network, pods })),
  };
}
