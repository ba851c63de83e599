/**
 * What the operator commands take from the outside, as parameters (the shape of
 * the dispatcher's `DispatchIo`): where output goes and how to reach the agent. Tests
 * pass their own; `processIo` is the real process.
 *
 * @module
 */
import { type AgentClient, SocketAgentClient } from "../api/client.ts";

/** Output streams and the agent, injectable for tests. */
export interface CliIo {
  out(text: string): void;
  err(text: string): void;
  /** A client of the agent at `socketPath`. */
  agent(socketPath: string): AgentClient;
}

/** The process's own stdout/stderr and the agent's unix socket. */
export const processIo: CliIo = {
  out: (t) => Deno.stdout.writeSync(new TextEncoder().encode(t)),
  err: (t) => Deno.stderr.writeSync(new TextEncoder().encode(t)),
  agent: (socketPath) => new SocketAgentClient(socketPath),
};
