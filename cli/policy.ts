/**
 * `enim policy <namespace>/<pod> [--json]`: the pod's effective NetworkPolicy as the
 * agent enforces it (`GET /v1/policy`): which policies select it, and per direction
 * whether it is isolated and what it admits, one row per peer.
 *
 * @module
 */
import { Command } from "@commander-js/extra-typings";
import type { PodPolicyView } from "../api/schema.ts";
import type { CliIo } from "./io.ts";
import { type Column, renderTable } from "./_table.ts";
import { reportAgentError, SOCKET_HELP, socketPath } from "./_agent.ts";

type Row = { direction: string; rule: PodPolicyView["ingress"]["rules"][number] };

/** How many members a row shows before "…". */
const SHOWN = 4;

const COLUMNS: Column<Row>[] = [
  { header: "DIRECTION", cell: (r) => r.direction },
  { header: "PEER", cell: (r) => r.rule.peer },
  { header: "PORTS", cell: (r) => r.rule.ports.join(", ") },
  {
    header: "MEMBERS",
    cell: (r) =>
      r.rule.kind === "any"
        ? "-"
        : `${r.rule.members.length}${
          r.rule.members.length
            ? `: ${r.rule.members.slice(0, SHOWN).join(", ")}${
              r.rule.members.length > SHOWN ? ", …" : ""
            }`
            : ""
        }`,
  },
];

/** One direction's headline: what is admitted when nothing is listed, or that everything is. */
function headline(name: "ingress" | "egress", d: PodPolicyView["ingress"]): string {
  if (!d.isolated) return `${name}: not isolated: everything is admitted`;
  const n = d.rules.length;
  return `${name}: isolated: ${
    n === 0 ? "nothing is admitted" : n === 1 ? "1 rule admits" : `${n} rules admit`
  } (besides replies, the node and the pod itself)`;
}

/** Renders a pod's effective policy as `enim policy` prints it. */
export function renderPolicy(v: PodPolicyView): string {
  let out = `pod ${v.pod} (${v.addresses.join(", ") || "no address"})\n`;
  out += v.policies.length
    ? `selected by ${v.policies.length} polic${v.policies.length === 1 ? "y" : "ies"}: ${
      v.policies.map((p) =>
        `${p.name} (${
          [
            p.ingress ? "Ingress" : "",
            p.egress ? "Egress" : "",
            p.unreadable !== undefined ? "UNREADABLE: admits nothing" : "",
          ].filter(Boolean).join(", ")
        })`
      ).join(", ")
    }\n`
    : "selected by no NetworkPolicy\n";
  out += `always allowed: the node (${
    v.nodeAddresses.join(", ") || "-"
  }), the pod itself, replies\n`;
  out += `${headline("ingress", v.ingress)}\n${headline("egress", v.egress)}\n`;
  const rows: Row[] = [
    ...(v.ingress.isolated ? v.ingress.rules.map((rule) => ({ direction: "ingress", rule })) : []),
    ...(v.egress.isolated ? v.egress.rules.map((rule) => ({ direction: "egress", rule })) : []),
  ];
  if (rows.length) out += "\n" + renderTable(COLUMNS, rows);
  for (const w of v.warnings) out += `WARNING: ${w}\n`;
  if (v.bypass) out += `NOT ENFORCED: ${v.bypass}\n`;
  else if (v.rawSocketGuard) {
    out += "raw sockets: guarded (what leaves by its ENI came through the IP stack's rules)\n";
  }
  return out;
}

/** The `policy` subcommand. */
export function policyCommand(io: CliIo, exit: { code: number }) {
  return new Command("policy")
    .description(
      "Show a pod's effective NetworkPolicy on this node: what it admits in and out (asks the running agent)",
    )
    .argument("<pod>", "the pod, as <namespace>/<name>")
    .option("--socket <path>", SOCKET_HELP)
    .option("--json", "print the pod's policy as JSON")
    .action(async (pod, opts) => {
      const client = io.agent(socketPath(opts.socket));
      if (!client.policy) {
        io.err("enim policy: this client cannot ask the agent for a pod's policy\n");
        exit.code = 1;
        return;
      }
      try {
        const v = await client.policy(pod);
        io.out(opts.json ? JSON.stringify(v, null, 2) + "\n" : renderPolicy(v));
      } catch (err) {
        exit.code = reportAgentError(io, "policy", err);
      }
    });
}
