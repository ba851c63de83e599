/**
 * `enim gc [--dry-run] [--json]`: asks the agent to reclaim the ENIs of dead
 * attachments (or, with `--dry-run`, to say which it would reclaim, changing nothing).
 *
 * Exits non-zero only when the agent is unreachable or, on a real run, when some
 * reclaim failed.
 *
 * @module
 */
import { Command } from "@commander-js/extra-typings";
import type { GcReport } from "../api/schema.ts";
import type { CliIo } from "./io.ts";
import { type Column, formatAge, renderTable, shortId } from "./_table.ts";
import { reportAgentError, SOCKET_HELP, socketPath } from "./_agent.ts";

type Item = GcReport["items"][number];

const BASE: Column<Item>[] = [
  { header: "ENI", cell: (i) => i.eniId },
  { header: "MAC", cell: (i) => i.mac },
  { header: "DEVICE", cell: (i) => i.device },
  { header: "OWNER", cell: (i) => i.pod },
  { header: "CONTAINER", cell: (i) => shortId(i.containerId) },
  { header: "NETNS", cell: (i) => i.netns },
  { header: "REASON", cell: (i) => i.reason },
  { header: "ACTION", cell: (i) => i.action },
];
const REAL: Column<Item>[] = [
  ...BASE,
  { header: "OUTCOME", cell: (i) => i.outcome },
  { header: "ERROR", cell: (i) => i.error },
];

type Unfinished = GcReport["unfinishedDels"][number];

const UNFINISHED: Column<Unfinished>[] = [
  { header: "ENI", cell: (d) => d.eniId },
  { header: "OWNER", cell: (d) => d.pod },
  { header: "CONTAINER", cell: (d) => shortId(d.containerId) },
  { header: "IFNAME", cell: (d) => d.ifName },
  { header: "DEL ANSWERED", cell: (d) => `${formatAge(d.answeredAt)} ago` },
];

/** The DELs still finishing, which the pass leaves to them. */
function renderUnfinished(r: GcReport): string {
  const n = r.unfinishedDels.length;
  if (n === 0) return "";
  return `\n${n} DEL${n === 1 ? "" : "s"} still finishing (answered; the device on its way home, ` +
    "the ENI being released): left to the DEL, which GC takes over only if it fails\n" +
    renderTable(UNFINISHED, r.unfinishedDels);
}

/** Renders a GC report as `enim gc` prints it. */
export function renderGcReport(r: GcReport): string {
  return renderItems(r) + renderUnfinished(r);
}

function renderItems(r: GcReport): string {
  const n = r.items.length;
  const enis = (k: number) => `${k} ENI${k === 1 ? "" : "s"}`;
  if (r.dryRun) {
    if (n === 0) return "dry run: nothing to reclaim\n";
    return renderTable(BASE, r.items) +
      `\ndry run: ${enis(n)} would be reclaimed; nothing was changed\n`;
  }
  if (n === 0) return "nothing to reclaim\n";
  const failed = r.items.filter((i) => i.outcome === "failed").length;
  return renderTable(REAL, r.items) +
    `\nreclaimed ${n - failed} of ${enis(n)}` +
    (failed ? `; ${failed} failed (retried on the next GC pass)\n` : "\n");
}

/** The `gc` subcommand. */
export function gcCommand(io: CliIo, exit: { code: number }) {
  return new Command("gc")
    .description(
      "Reclaim the ENIs of dead attachments now (asks the running agent).\n" +
        "Exits 1 if the agent is unreachable or, without --dry-run, if a reclaim failed.",
    )
    .option("--dry-run", "only list what would be reclaimed and why; change nothing")
    .option("--json", "print the GC report as JSON")
    .option("--socket <path>", SOCKET_HELP)
    .action(async (opts) => {
      const client = io.agent(socketPath(opts.socket));
      let report: GcReport;
      try {
        report = await client.gc({ dryRun: opts.dryRun ?? false });
      } catch (err) {
        exit.code = reportAgentError(io, "gc", err);
        return;
      }
      io.out(opts.json ? JSON.stringify(report, null, 2) + "\n" : renderGcReport(report));
      if (!report.dryRun && report.items.some((i) => i.outcome === "failed")) exit.code = 1;
    });
}
