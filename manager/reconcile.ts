/**
 * Reconcile (start-up) and the orphan rule: finish or roll back what a crash left
 * half done, free ENIs the provider shows owned by attachments the state does not
 * know, and report every divergence between the provider and the state.
 *
 * @module
 */
import { type Eni, EniSchema, type Owner } from "../providers/contract.ts";
import { keyOf } from "./state.ts";
import type { ReconcileReport } from "./types.ts";
import { type ManagerContext, message } from "./context.ts";
import { release } from "./release.ts";

/**
 * Reconciles the state with the provider and the devices (run at start-up, under
 * the GC lock). `complete` is false when the provider could not be listed: the
 * agent is then not ready.
 */
export async function reconcile(
  ctx: ManagerContext,
): Promise<{ report: ReconcileReport; complete: boolean }> {
  const report: ReconcileReport = { rolledBack: 0, finished: 0, orphansFreed: 0, errors: [] };
  const log = ctx.log.child({ op: "reconcile" });
  for (const row of ctx.state.inState("adding", "deleting")) {
    await ctx.locks.run(`att:${keyOf(row)}`, async () => {
      const was = row.state;
      try {
        await release(ctx, row, { netnsUsable: true });
        if (was === "adding") report.rolledBack++;
        else report.finished++;
        log.info(was === "adding" ? "Rolled back a half-done ADD" : "Finished a half-done DEL", {
          key: keyOf(row),
          eniId: row.eniId,
        });
      } catch (err) {
        report.errors.push(`${was} "${keyOf(row)}": ${message(err)}`);
      }
    });
  }
  let enis: Eni[];
  try {
    enis = (await ctx.provider.list()).map((e) => EniSchema.parse(e));
  } catch (err) {
    report.errors.push(`Cannot list the provider's ENIs: ${message(err)}`);
    return { report, complete: false };
  }
  const rows = new Map(ctx.state.all().map((r) => [keyOf(r), r]));
  for (const e of enis) {
    if (!e.owner) continue;
    const k = keyOf(e.owner);
    const r = rows.get(k);
    if (!r) {
      await ctx.locks.run(`att:${k}`, async () => {
        if (ctx.state.get(e.owner!)) return;
        try {
          if (!(await freeOrphan(ctx, e.owner!, e))) return;
          report.orphansFreed++;
          log.info("Freed an ENI owned by an unknown attachment", { eniId: e.id, owner: k });
        } catch (err) {
          report.errors.push(`orphan "${e.id}" of "${k}": ${message(err)}`);
        }
      });
    } else if (r.eniId !== e.id) {
      report.errors.push(
        `Attachment "${k}" records ENI "${r.eniId}" but the provider shows it holding "${e.id}"`,
      );
    }
  }
  const byId = new Map(enis.map((e) => [e.id, e]));
  for (const r of rows.values()) {
    if (r.state !== "ready" && r.state !== "recycling" && r.state !== "held") continue;
    const e = r.eniId ? byId.get(r.eniId) : undefined;
    if (!e?.owner || keyOf(e.owner) !== keyOf(r)) {
      report.errors.push(
        `Attachment "${keyOf(r)}" holds ENI "${r.eniId}" but the provider shows it ${
          e?.owner ? `owned by "${keyOf(e.owner)}"` : e ? "free" : "missing"
        }`,
      );
    }
  }
  for (const e of report.errors) log.error("Reconcile problem", { problem: e });
  log.info("Reconcile done", { ...report, errors: report.errors.length });
  return { report, complete: true };
}

/**
 * Frees an ENI held in the provider by an attachment without a row; the caller holds
 * the attachment's key. Under the ENI's lock it first checks that the ENI is still that
 * owner's and no attachment records it (a DEL and a new ADD may have raced the plan),
 * so a device another attachment now uses is never touched. Returns whether it freed it.
 */
export async function freeOrphan(
  ctx: ManagerContext,
  owner: Owner,
  eni: { id: string; mac: string },
): Promise<boolean> {
  return await ctx.locks.run(`eni:${eni.id}`, async () => {
    if (ctx.state.byEni(eni.id)) return false;
    const now = (await ctx.provider.list()).find((e) => e.id === eni.id);
    if (!now?.owner || keyOf(now.owner) !== keyOf(owner)) return false;
    const link = await ctx.devices.findByMac(eni.mac);
    if (link) await ctx.devices.unplug({ mac: eni.mac, nodeName: link.ifname, netns: null });
    await ctx.provider.deallocateENI(owner);
    return true;
  });
}
