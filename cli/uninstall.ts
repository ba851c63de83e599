/**
 * `enim uninstall`: takes enim off a node whose agent is stopped (`agent/uninstall.ts`),
 * printing each step; `--release-enis` or `--keep-enis` says what becomes of the node's
 * ENIs (one of them is required), `--dry-run` only says what it would do. Exit 0 when
 * every step worked, 1 when one failed (the rest still ran), 2 when it did not start (the
 * agent still runs, no choice of ENIs, a bad config).
 *
 * @module
 */
import { Command } from "@commander-js/extra-typings";
import type { CliIo } from "./io.ts";
import {
  type AgentConfig,
  ConfigError,
  DEFAULT_CONFIG_PATH,
  enimEnv,
  loadConfig,
} from "../agent/config.ts";
import { Logger, stderrSink } from "../lib/log.ts";

/** The `uninstall` subcommand. */
export function uninstallCommand(io: CliIo, exit: { code: number }) {
  return new Command("uninstall")
    .description(
      "Take enim off this node once its agent is stopped: undo every pod's attachment, release or\n" +
        "keep the node's ENIs, remove enim's nftables tables, rules, routes and host links, then the\n" +
        "state, the plugin and the conflist; print each step (docs/upgrading.md)",
    )
    .option(
      "-c, --config <path>",
      `the agent's JSONC config file (env ENIM_CONFIG; default ${DEFAULT_CONFIG_PATH}, optional)`,
    )
    .option("--release-enis", "give the node's ENIs back to the cloud")
    .option("--keep-enis", "leave the node's ENIs attached, free")
    .option("--dry-run", "say what would be done, change nothing")
    .option("--cni-bin-dir <dir>", "where the plugin is", "/opt/cni/bin")
    .option("--cni-conf-dir <dir>", "where the conflist is", "/etc/cni/net.d")
    .option("--json", "print the steps as JSON")
    .action(async (opts) => {
      if (!!opts.releaseEnis === !!opts.keepEnis) {
        io.err(
          "enim uninstall: say what becomes of the node's ENIs: --release-enis or --keep-enis\n",
        );
        exit.code = 2;
        return;
      }
      let cfg: AgentConfig;
      try {
        cfg = await loadConfig({ config: opts.config }, enimEnv());
      } catch (err) {
        if (!(err instanceof ConfigError)) throw err;
        io.err(`enim uninstall: ${err.message}\n`);
        exit.code = 2;
        return;
      }
      const { uninstall, UninstallRefused } = await import("../agent/uninstall.ts");
      const { defaultDeps } = await import("../agent/deps.ts");
      const log = new Logger(stderrSink, "warn", { role: "uninstall" });
      try {
        const steps = await uninstall(cfg, defaultDeps, log, {
          releaseEnis: !!opts.releaseEnis,
          dryRun: !!opts.dryRun,
          cniBinDir: opts.cniBinDir,
          cniConfDir: opts.cniConfDir,
        }, (s) => {
          if (!opts.json) {
            io.out(`${s.outcome.padEnd(8)}  ${s.what}${s.error ? `: ${s.error}` : ""}\n`);
          }
        });
        if (opts.json) io.out(JSON.stringify({ dryRun: !!opts.dryRun, steps }) + "\n");
        const failed = steps.filter((s) => s.outcome === "failed").length;
        if (!opts.json) {
          io.out(
            opts.dryRun
              ? `dry run: ${steps.length} steps, nothing changed\n`
              : `${steps.length} steps, ${failed} failed\n`,
          );
        }
        exit.code = failed > 0 ? 1 : 0;
      } catch (err) {
        if (!(err instanceof UninstallRefused)) throw err;
        io.err(`enim uninstall: ${err.message}\n`);
        exit.code = 2;
      }
    });
}
