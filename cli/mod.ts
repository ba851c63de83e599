/**
 * The operator program: `enim agent`, `enim gc`, `enim status`, `enim policy`, `enim probe`,
 * `enim uninstall`, `enim version`.
 *
 * Each subcommand lives in its own file and registers itself on the program.
 * Parsing never exits the process: `runCli` returns the exit code.
 *
 * @module
 */
import { Command, CommanderError } from "@commander-js/extra-typings";
import { VERSION } from "../lib/version.ts";
import { agentCommand } from "./agent.ts";
import { gcCommand } from "./gc.ts";
import { policyCommand } from "./policy.ts";
import { probeCommand } from "./probe.ts";
import { statusCommand } from "./status.ts";
import { versionCommand } from "./version.ts";
import { uninstallCommand } from "./uninstall.ts";

import { type CliIo, processIo } from "./io.ts";

export { type CliIo, processIo };

/** Builds the commander program; each action stores its exit code in `exit`. */
export function buildProgram(io: CliIo, exit: { code: number }) {
  const program = new Command()
    .name("enim")
    .description(
      "enim gives each Kubernetes pod a whole cloud ENI.\n" +
        "Run with CNI_COMMAND set, it is the CNI plugin; otherwise one of the commands below.",
    )
    .version(VERSION, "-V, --version")
    .exitOverride()
    .configureOutput({ writeOut: io.out, writeErr: io.err })
    .showHelpAfterError();
  program.addCommand(agentCommand(io, exit));
  program.addCommand(gcCommand(io, exit));
  program.addCommand(statusCommand(io, exit));
  program.addCommand(policyCommand(io, exit));
  program.addCommand(probeCommand(io, exit));
  program.addCommand(uninstallCommand(io, exit));
  program.addCommand(versionCommand(io, exit));
  return program;
}

/** Runs the operator program on `argv` (without the executable) and returns the exit code. */
export async function runCli(argv: string[], io: CliIo = processIo): Promise<number> {
  const exit = { code: 0 };
  const program = buildProgram(io, exit);
  try {
    await program.parseAsync(argv, { from: "user" });
  } catch (err) {
    if (err instanceof CommanderError) return err.exitCode === 0 ? 0 : 2;
    io.err(`enim: ${err instanceof Error ? err.message : String(err)}\n`);
    return 1;
  }
  return exit.code;
}
