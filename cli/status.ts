/**
 * `enim status`: the node's ENIs and pool counts, from the agent's `GET /v1/status`.
 *
 * @module
 */
import { Command } from "@commander-js/extra-typings";
import type { Status } from "../manager/api_schema.ts";
import { SocketAgentClient } from "../manager/client.ts";
import type { CliIo } from "./mod.ts";
import { type Column, formatAge, renderTable, shortId } from "./_table.ts";
import { reportAgentError, SOCKET_HELP, socketPath } from "./_agent.ts";

type Row = Status["enis"][number];

const COLUMNS: Column<Row>[] = [
  { header: "ENI", cell: (e) => e.id },
  { header: "MAC", cell: (e) => e.mac },
  { header: "DEVICE", cell: (e) => e.device ?? e.attachment?.nodeName },
  { header: "IPV4", cell: (e) => e.ipv4 && `${e.ipv4.address}/${e.ipv4.prefixLength}` },
  { header: "IPV6", cell: (e) => e.ipv6 && `${e.ipv6.address}/${e.ipv6.prefixLength}` },
  { header: "STATE", cell: (e) => e.attachment?.state ?? e.state },
  { header: "OWNER", cell: (e) => e.attachment?.pod ?? e.owner?.pod },
  {
    header: "CONTAINER",
    cell: (e) => shortId(e.attachment?.containerId ?? e.owner?.containerId),
  },
  { header: "NETNS", cell: (e) => e.attachment?.netns },
  { header: "AGE", cell: (e) => (e.attachment ? formatAge(e.attachment.createdAt) : "-") },
];

/** Renders the Status object as `enim status` prints it. */
export function renderStatus(s: Status): string {
  const p = s.pool;
  const head = `provider ${s.provider}, agent ${s.version}, ` +
    `${s.ready ? "ready" : "NOT READY"}, ${s.canAllocate ? "can allocate" : "CANNOT ALLOCATE"}\n` +
    `pool: ${p.free} free, ${p.owned} owned, ${p.recycling} recycling, ` +
    `${p.attachable} more attachable\n\n`;
  return head + (s.enis.length ? renderTable(COLUMNS, s.enis) : "no ENIs attached to this node\n");
}

/** The `status` subcommand. */
export function statusCommand(io: CliIo, exit: { code: number }) {
  return new Command("status")
    .description("Show the node's ENIs and pool counts (asks the running agent)")
    .option("--socket <path>", SOCKET_HELP)
    .option("--json", "print the agent's Status object as JSON")
    .action(async (opts) => {
      const client = new SocketAgentClient(socketPath(opts.socket));
      try {
        const s = await client.status();
        io.out(opts.json ? JSON.stringify(s, null, 2) + "\n" : renderStatus(s));
      } catch (err) {
        exit.code = reportAgentError(io, "status", err);
      }
    });
}
