/**
 * DEL: what becomes of the attachment's ENI (back to the pool, held for a sticky pod
 * on this node, or parked in the VPC for it), handed to `release.ts`. The caller
 * (`manager.ts` `del`) holds the attachment's lock and answers the runtime when
 * `answer` is called or this returns, whichever is first: a plain pod's DEL answers
 * once its intent is recorded and its namespace held, before its device's move home.
 *
 * @module
 */
import type { DelInput } from "./types.ts";
import { type ManagerContext, message, zoneHoldMs } from "./context.ts";
import type { OpTimer } from "./op_timer.ts";
import { release } from "./release.ts";
import { hostLinkOf } from "./state.ts";
import { keyOf } from "../providers/schema.ts";

/** Releases the attachment of `req` as its DEL; `answer` may be called before the end. */
export async function del(
  ctx: ManagerContext,
  req: DelInput,
  t: OpTimer,
  answer: () => void,
): Promise<void> {
  const row = ctx.state.get(req);
  if (!row) {
    ctx.log.debug("DEL of an unknown attachment: nothing to do", { key: keyOf(req) });
    return;
  }
  if (row.state === "held") {
    ctx.log.debug("DEL of a held attachment: done already", { key: keyOf(req) });
    return;
  }
  // A sticky pod keeps its ENI for a while: it comes back with its next container.
  const hold = row.sticky && row.state === "ready" && row.result !== null;
  // Zone scope: on this node for the node hold (instant same-node re-creates), then
  // parked in the VPC for the rest of the hold, where any node of the zone takes it.
  const zone = hold ? zoneHoldMs(ctx, row.profile) : null;
  const now = ctx.now();
  const until = now + ctx.holdMs;
  const how = !hold
    ? {}
    : zone === null
    ? { holdUntil: until }
    : zone > 0
    ? { holdUntil: now + Math.min(zone, ctx.holdMs), parkUntil: until }
    : { park: { until } };
  const link = hold ? hostLinkOf(row) : null;
  try {
    await release(ctx, row, {
      netnsUsable: true,
      leaveCallerDevice: true,
      ...how,
      // A plain pod's DEL answers before its device's move home, and its host link goes
      // in that move's batch; a sticky pod's DEL answers once its hold is recorded, and
      // its link is removed after that answer (below).
      deferHostLink: link !== null,
      ...(hold ? {} : { answer, reuseWait: true }),
    }, t);
    ctx.log.info(
      !hold
        ? "DEL done"
        : "park" in how
        ? "DEL done; the ENI is parked in the VPC for the sticky pod"
        : "DEL done; the ENI is held for the sticky pod",
      {
        key: keyOf(req),
        eniId: row.eniId,
        ...(hold ? { pod: row.pod, holdSeconds: Math.round(ctx.holdMs / 1000) } : {}),
        ...(zone !== null ? { scope: "zone", nodeHoldSeconds: Math.round(zone / 1000) } : {}),
      },
    );
    if (link) {
      // Still under the attachment's lock, after the answer: a later call of this key
      // (an ADD sent again) waits for it on that lock, and an ADD in the same namespace
      // or one that needs a held ENI waits for it in `settled()`; nothing queued behind
      // this DEL is waited for. A failure is logged; GC removes what is left.
      answer();
      await ctx.devices.removeHostLink(link.nodeIfName).catch((err) =>
        ctx.log.warn("Cannot remove a DEL's host link; GC removes it", {
          key: keyOf(req),
          nodeIfName: link.nodeIfName,
          error: message(err),
        })
      );
    }
  } catch (err) {
    const apiErr = ctx.apiError(err);
    // A DEL answers success only when what it did is recorded. The state could not be
    // written: fail, so the runtime retries (nothing it asked for is acknowledged); one
    // that has answered already is retried by the manager (manager.ts finishAnswered).
    if (apiErr.code === "state_unavailable") throw apiErr;
    // A device or provider step failed, and the row records it (`deleting`, the error):
    // the pod's side is done as far as the runtime can help, and GC finishes the rest.
    ctx.log.warn("DEL could not finish; GC will retry", {
      key: keyOf(req),
      error: message(err),
    });
  }
}
