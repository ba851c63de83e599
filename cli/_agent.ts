/**
 * What the operator commands share: the socket to talk to, and the message for
 * an agent that does not answer.
 *
 * @module
 */
import { DEFAULT_SOCKET } from "../api/wire.ts";
import { dirname } from "node:path";
import { ApiError } from "../api/schema.ts";
import { AgentUnreachableError } from "../api/client.ts";
import type { CliIo } from "./io.ts";

/** The socket: `--socket`, else `ENIM_SOCKET`, else the default. */
export function socketPath(flag: string | undefined): string {
  if (flag) return flag;
  let fromEnv: string | undefined;
  try {
    fromEnv = Deno.env.get("ENIM_SOCKET");
  } catch { /* no env permission */ }
  return fromEnv || DEFAULT_SOCKET;
}

/** The `--socket` option's help text. */
export const SOCKET_HELP = `the agent's API socket (env ENIM_SOCKET; default ${DEFAULT_SOCKET})`;

/** Prints why a command could not talk to the agent and returns the exit code (1). */
export function reportAgentError(io: CliIo, command: string, err: unknown): number {
  if (err instanceof AgentUnreachableError && err.cause instanceof Deno.errors.NotCapable) {
    io.err(
      `enim ${command}: not allowed to connect to ${err.socketPath}: ` +
        `the enim permission set reads and writes sockets only in ${dirname(DEFAULT_SOCKET)}\n`,
    );
  } else if (err instanceof AgentUnreachableError) {
    const cause = err.cause instanceof Error ? ` (${err.cause.message})` : "";
    io.err(`the enim agent is not running: cannot connect to ${err.socketPath}${cause}\n`);
  } else if (err instanceof ApiError) {
    io.err(`enim ${command}: the agent answered ${err.code}: ${err.message}\n`);
  } else {
    io.err(`enim ${command}: ${err instanceof Error ? err.message : String(err)}\n`);
  }
  return 1;
}
