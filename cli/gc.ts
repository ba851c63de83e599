/** `enim gc`. @module */
import { Command } from "@commander-js/extra-typings";
import type { CliIo } from "./mod.ts";

/** The `gc` subcommand (not implemented yet). */
export function gcCommand(io: CliIo, exit: { code: number }) {
  return new Command("gc").description("gc (not implemented yet)").action(() => {
    io.err("enim gc: not implemented yet\n");
    exit.code = 1;
  });
}
