/**
 * `enim agent`: runs the agent (normally as a systemd service), or with
 * `--check-config` validates the configuration and exits.
 *
 * @module
 */
import { DEFAULT_SOCKET } from "../api/wire.ts";
import { Command } from "@commander-js/extra-typings";
import type { CliIo } from "./io.ts";
import {
  type AgentConfig,
  ConfigError,
  DEFAULT_CONFIG_PATH,
  DEFAULT_STATE_PATH,
  enimEnv,
  loadConfig,
} from "../agent/config.ts";
import { LEVELS, Logger, type Sink, stderrSink } from "../lib/log.ts";
import { privateDir, privateFile } from "../lib/private_fs.ts";
import { dirname } from "node:path";

/**
 * Opens the configured log sink: stderr, or a file opened for appending, 0600 in a
 * directory 0750 at most (the plugin's log, 0640, may share it).
 */
async function openSink(cfg: AgentConfig): Promise<{ sink: Sink; close(): void }> {
  if (!cfg.log.file) return { sink: stderrSink, close: () => {} };
  await privateDir(dirname(cfg.log.file), 0o750);
  await privateFile(cfg.log.file);
  const file = await Deno.open(cfg.log.file, { append: true });
  const enc = new TextEncoder();
  return {
    sink: (line) => {
      file.writeSync(enc.encode(line + "\n"));
    },
    close: () => file.close(),
  };
}

/** Runs the agent until SIGTERM or SIGINT; returns the exit code. */
export async function runAgentProcess(cfg: AgentConfig): Promise<number> {
  const { runAgent } = await import("../agent/agent.ts");
  const { defaultDeps } = await import("../agent/deps.ts");
  let out: { sink: Sink; close(): void };
  try {
    out = await openSink(cfg);
  } catch (err) {
    stderrSink(JSON.stringify({
      ts: new Date().toISOString(),
      level: "error",
      msg: "cannot open the agent's log file",
      file: cfg.log.file,
      error: err instanceof Error ? err.message : String(err),
    }));
    return 1;
  }
  const log = new Logger(out.sink, cfg.log.level, { role: "agent" });
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  const signals: Deno.Signal[] = ["SIGTERM", "SIGINT"];
  for (const s of signals) Deno.addSignalListener(s, onSignal);
  try {
    await runAgent(cfg, { deps: defaultDeps, log, signal: stop.signal });
    return 0;
  } catch (err) {
    log.error("the agent failed", { error: err });
    return 1;
  } finally {
    for (const s of signals) Deno.removeSignalListener(s, onSignal);
    out.close();
  }
}

/** The `agent` subcommand. */
export function agentCommand(io: CliIo, exit: { code: number }) {
  return new Command("agent")
    .description(
      "Run the enim agent: owns the node's ENIs and serves the API on a root-only unix socket.\n" +
        "Precedence: flags > ENIM_* environment variables > config file > defaults.\n" +
        "Stops in order on SIGTERM or SIGINT.",
    )
    .option(
      "-c, --config <path>",
      `the JSONC config file (env ENIM_CONFIG; default ${DEFAULT_CONFIG_PATH}, optional)`,
    )
    .option("--socket <path>", `the API socket (env ENIM_SOCKET; default ${DEFAULT_SOCKET})`)
    .option(
      "--state <path>",
      `the SQLite state database (env ENIM_STATE; default ${DEFAULT_STATE_PATH})`,
    )
    .option("--provider <name>", "the cloud provider: bce or mock (env ENIM_PROVIDER)")
    .option(
      "--log-level <level>",
      `log level: ${LEVELS.join(", ")} (env ENIM_LOG_LEVEL; default info)`,
    )
    .option(
      "--gc-interval <seconds>",
      "seconds between periodic GC passes (env ENIM_GC_INTERVAL; default 30)",
    )
    .option(
      "--gc-grace <seconds>",
      "seconds before GC may reclaim a new or recycling attachment (env ENIM_GC_GRACE; default 30)",
    )
    .option(
      "--lock-wait <seconds>",
      "seconds to wait for another agent on the node to stop (env ENIM_LOCK_WAIT; default 60)",
    )
    .option(
      "--probe-socket <path>",
      "serve this agent's own startup, liveness and readiness probes (enim probe) on this " +
        "socket from start-up, also while it waits for another agent (env ENIM_PROBE_SOCKET)",
    )
    .option(
      "--check-config",
      "validate the configuration (the provider's own section too) and exit 0 or 1",
    )
    .action(async (opts) => {
      let cfg: AgentConfig;
      try {
        cfg = await loadConfig(opts, enimEnv());
        if (opts.checkConfig) {
          const { checkConfig } = await import("../agent/agent.ts");
          const { loadProvider } = await import("../providers/registry.ts");
          await checkConfig(cfg, { loadProvider });
          let conflist = "";
          if (cfg.cniConfig) {
            const { checkConflistConfig } = await import("../agent/cni_conflist.ts");
            const { problems, note } = await checkConflistConfig(cfg.cniConfig);
            if (problems.length > 0) throw new ConfigError(`the "cniConfig" section`, problems);
            conflist = `CNI config ${cfg.cniConfig.source} -> ${cfg.cniConfig.destination} ` +
              `once the agent answers (${note})\n`;
          }
          io.out(
            `configuration OK: provider ${cfg.provider.name}, socket ${cfg.socket}, ` +
              `state ${cfg.statePath}\n` + conflist,
          );
          return;
        }
      } catch (err) {
        if (!(err instanceof ConfigError)) throw err;
        io.err(`enim agent: ${err.message}\n`);
        exit.code = 1;
        return;
      }
      exit.code = await runAgentProcess(cfg);
    });
}
