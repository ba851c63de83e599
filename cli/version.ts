/** `enim version`. @module */
import { Command } from "@commander-js/extra-typings";
import { VERSION } from "../lib/version.ts";
import type { CliIo } from "./io.ts";

/** The `version` subcommand: prints enim's version and the CNI versions it speaks. */
export function versionCommand(io: CliIo, _exit: { code: number }) {
  return new Command("version").description("Print enim's version").option("--json", "print JSON")
    .action((opts) => {
      const info = {
        version: VERSION,
        cniVersions: ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
        deno: Deno.version.deno,
      };
      io.out(
        opts.json
          ? JSON.stringify(info) + "\n"
          : `enim ${info.version} (CNI ${info.cniVersions.join(", ")}; deno ${info.deno})\n`,
      );
    });
}
