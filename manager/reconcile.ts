/**
 * Reconcile (start-up) and the orphan rule: finish or roll back what a crash left
 * half done, free ENIs the provider shows owned by attachments the state does not
 * know, then repair each divergence between the provider, the state and the kernel
 * that it can, logging each repair ("Repaired …") and reporting the rest:
 *
 * | the state records        | the provider / the kernel shows        | repair                              |
 * | ------------------------ | -------------------------------------- | ----------------------------------- |
 * | an attachment holding X  | X free                                 | X claimed back for the attachment   |
 * | an attachment holding X  | X owned by a key with no attachment    | X freed, then claimed back          |
 * | an attachment holding X  | X owned by another attachment, missing | none: reported (status, next GC)    |
 * | an attachment holding X  | X's device in neither pod nor node     | the provider brings it back (node)  |
 * | nothing for X (X free)   | X's device not on the node             | the provider brings it back (node)  |
 *
 * @module
 */
import { type Eni, EniSchema, type Owner } from "../providers/contract.ts";
import type { AttachmentState } from "../api/schema.ts";
import { keyOf } from "../providers/schema.ts";
import type { ReconcileReport } from "./types.ts";
import { type ManagerContext, message, ownerOf, zoneHoldMs } from "./context.ts";
import { release, repairDevice } from "./release.ts";

/**
 * Reconciles the state with the provider and the devices (run at start-up, under
 * the GC lock). `complete` is false when the provider could not be listed: the
 * agent is then not ready.
 */
export async function reconcile(
  ctx: ManagerContext,
): Promise<{ report: ReconcileReport; complete: boolean }> {
  const report: ReconcileReport = {
    rolledBack: 0,
    finished: 0,
    orphansFreed: 0,
    repaired: 0,
    errors: [],
  };
  const log = ctx.log.child({ op: "reconcile" });
  for (const row of ctx.state.inState("adding", "deleting")) {
    await ctx.locks.run(`att:${keyOf(row)}`, async () => {
      const was = row.state;
      try {
        // A zone-sticky pod's ENI is parked for it (a fresh hold), never pooled: the
        // DEL that was parking it is finished, the ADD that had claimed it undone.
        const park = row.sticky && zoneHoldMs(ctx, row.profile) !== null
          ? { park: { until: ctx.now() + ctx.holdMs } }
          : {};
        await release(ctx, row, { netnsUsable: true, ...park });
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
  // The provider again when orphans were freed (their ENIs are free now).
  if (report.orphansFreed > 0) {
    try {
      enis = (await ctx.provider.list()).map((e) => EniSchema.parse(e));
    } catch (err) {
      report.errors.push(`Cannot list the provider's ENIs: ${message(err)}`);
      return { report, complete: false };
    }
  }
  await repairOwnership(ctx, enis, report, log);
  await repairDevices(ctx, enis, report, log);
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

/** States in which an attachment holds its ENI. */
const HOLDING: AttachmentState[] = ["ready", "recycling", "held"];

/** Provider vs state: what the state holds, the provider must show held by that attachment. */
async function repairOwnership(
  ctx: ManagerContext,
  enis: Eni[],
  report: ReconcileReport,
  log: ManagerContext["log"],
): Promise<void> {
  const byId = new Map(enis.map((e) => [e.id, e]));
  for (const r of ctx.state.inState(...HOLDING)) {
    if (!r.eniId) continue;
    const e = byId.get(r.eniId);
    if (e?.owner && keyOf(e.owner) === keyOf(r)) continue;
    const stranger = e?.owner && !ctx.state.get(e.owner) ? e.owner : null;
    if (!e || (e.owner && !stranger)) {
      report.errors.push(
        `Attachment "${keyOf(r)}" holds ENI "${r.eniId}" but the provider shows it ${
          e?.owner ? `owned by "${keyOf(e.owner)}"` : "missing"
        }`,
      );
      continue;
    }
    // Free, or held for a key nobody records: the next allocation could hand it to a
    // second owner. It is this attachment's (its device is where the state says).
    await ctx.locks.run(`att:${keyOf(r)}`, async () => {
      const now = ctx.state.get(r);
      if (!now || now.eniId !== e.id || !HOLDING.includes(now.state)) return;
      try {
        await ctx.locks.run(`eni:${e.id}`, async () => {
          if (stranger) await ctx.provider.deallocateENI(stranger);
          await ctx.provider.allocateNextENI(ownerOf(now), {
            profile: now.profile,
            eniId: e.id,
          });
        });
        report.repaired++;
        log.warn(
          "Repaired: the provider showed an attachment's ENI " +
            (stranger ? "owned by an unknown key" : "free") + "; claimed it back",
          {
            key: keyOf(now),
            eniId: e.id,
            ...(stranger ? { strangerKey: keyOf(stranger) } : {}),
          },
        );
      } catch (err) {
        report.errors.push(
          `Attachment "${keyOf(r)}" holds ENI "${e.id}", which the provider shows ${
            stranger ? `owned by "${keyOf(stranger)}"` : "free"
          }, and it cannot be claimed back: ${message(err)}`,
        );
      }
    });
  }
}

/**
 * The kernel vs both: every device of an ENI the provider has is somewhere enim can
 * reach it. A free ENI's device is on the node; a held attachment's is on the node
 * (sticky hold) or in its pod. A device found nowhere (a simulated veth dies with
 * its namespace; a physical one may be slow to return) is asked back from the
 * provider. One node listing, plus one pod listing per attachment whose device is
 * not on the node.
 */
async function repairDevices(
  ctx: ManagerContext,
  enis: Eni[],
  report: ReconcileReport,
  log: ManagerContext["log"],
): Promise<void> {
  let onNode: Set<string>;
  try {
    onNode = new Set(
      (await ctx.devices.nodeLinks()).flatMap((l) => l.address ? [l.address.toLowerCase()] : []),
    );
  } catch (err) {
    report.errors.push(`Cannot list the node's links: ${message(err)}`);
    return;
  }
  const missing: { eniId: string; mac: string; key?: string }[] = [];
  const recorded = new Set(ctx.state.all().map((r) => r.eniId));
  for (const e of enis) {
    if (!e.owner && !recorded.has(e.id) && !onNode.has(e.mac.toLowerCase())) {
      missing.push({ eniId: e.id, mac: e.mac.toLowerCase() });
    }
  }
  await Promise.all(
    ctx.state.inState(...HOLDING).map(async (r) => {
      if (!r.eniId || !r.mac || onNode.has(r.mac)) return;
      if (r.state !== "held" && (r.mode === "interface" || r.netnsIno !== null)) {
        const inPod = await ctx.devices.findByMac(r.mac, r.netns).catch(() => null);
        if (inPod) return;
      }
      missing.push({ eniId: r.eniId, mac: r.mac, key: keyOf(r) });
    }),
  );
  // Each waits up to repairDevice's bound for its device; start-up waits for the slowest only.
  await Promise.all(missing.map((m) =>
    ctx.locks.run(`eni:${m.eniId}`, async () => {
      const outcome = await repairDevice(ctx, m.eniId, m.mac);
      if (outcome === "back") {
        report.repaired++;
        log.warn(
          "Repaired: an ENI's device was neither on the node nor in its pod; it is back on the node",
          {
            eniId: m.eniId,
            mac: m.mac,
            ...(m.key ? { key: m.key } : {}),
          },
        );
      } else {
        report.errors.push(
          `The device of ENI "${m.eniId}" (MAC ${m.mac}${
            m.key ? `, attachment "${m.key}"` : ""
          }) is neither on the node nor in its pod (${outcome})`,
        );
      }
    })
  ));
}
