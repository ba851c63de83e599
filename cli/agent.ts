/** `enim agent`. @module */
import { Command } from "@commander-js/extra-typings";
import type { CliIo } from "./mod.ts";

/** The `agent` subcommand (not implemented yet). */
export function agentCommand(io: CliIo, exit: { code: number }) {
  return new Command("agent").description("agent (not implemented yet)").action(() => {
    io.err("enim agent: not implemented yet\n");
    exit.code = 1;
  });
}
