/** `enim status`. @module */
import { Command } from "@commander-js/extra-typings";
import type { CliIo } from "./mod.ts";

/** The `status` subcommand (not implemented yet). */
export function statusCommand(io: CliIo, exit: { code: number }) {
  return new Command("status").description("status (not implemented yet)").action(() => {
    io.err("enim status: not implemented yet\n");
    exit.code = 1;
  });
}
