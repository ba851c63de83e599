/**
 * `enim probe`: kubelet's startup, liveness and readiness probe of one agent process, asked
 * on that agent's own probe socket (agent/probe.ts), not the node's API socket, which during
 * a DaemonSet's surge another agent serves.
 *
 * @module
 */
import { Command } from "@commander-js/extra-typings";
import * as z from "zod/mini";
import { DEFAULT_PROBE_SOCKET } from "../api/wire.ts";
import { unixRequest } from "../api/client.ts";
import type { CliIo } from "./io.ts";
import { reportAgentError } from "./_agent.ts";
import { NOT_READY_EXIT } from "./status.ts";

/** What the probe socket answers (agent/probe.ts `ProbeAnswer`). */
const ProbeAnswerSchema = z.object({
  ok: z.boolean(),
  phase: z.optional(z.string()),
  reason: z.optional(z.string()),
});

/** How long the probe waits for its agent (below a probe's usual timeoutSeconds, 5). */
const PROBE_TIMEOUT_MS = 4_000;

/** The `probe` subcommand. */
export function probeCommand(io: CliIo, exit: { code: number }) {
  return new Command("probe")
    .description(
      "Ask one agent, on its own probe socket, whether it is live (default) or ready (--ready).\n" +
        `Exits 0 when it is, ${NOT_READY_EXIT} when it answers that it is not, 1 when it cannot ` +
        "be reached. A standby agent (waiting for another agent's lock) is live and ready.",
    )
    .option(
      "--socket <path>",
      `the agent's probe socket (its --probe-socket; default ${DEFAULT_PROBE_SOCKET})`,
    )
    .option("--ready", "ask for readiness (GET /readyz) instead of liveness (GET /healthz)")
    .action(async (opts) => {
      const socket = opts.socket ?? DEFAULT_PROBE_SOCKET;
      const path = opts.ready ? "/readyz" : "/healthz";
      try {
        const res = await unixRequest(socket, "GET", path, undefined, PROBE_TIMEOUT_MS);
        let body: unknown;
        try {
          body = JSON.parse(res.body);
        } catch {
          body = undefined;
        }
        const answer = ProbeAnswerSchema.safeParse(body);
        if (!answer.success) {
          io.err(`enim probe: the agent answered HTTP ${res.status}, not a probe answer\n`);
          exit.code = 1;
          return;
        }
        io.out(JSON.stringify(answer.data) + "\n");
        if (res.status !== 200 || !answer.data.ok) exit.code = NOT_READY_EXIT;
      } catch (err) {
        exit.code = reportAgentError(io, "probe", err);
      }
    });
}
