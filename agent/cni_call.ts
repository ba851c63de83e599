/**
 * Serves a CNI call forwarded by the plugin process (`POST /v1/cni`): the CNI
 * dispatcher (`cni/dispatch.ts`) runs here, in the agent, against the agent's own
 * operations, so the plugin process loads none of the schemas it needs.
 *
 * The call's log line goes to the plugin's log file (the config's `logFile`,
 * or `ENIM_LOG_FILE` from the plugin's environment), as when the plugin
 * process wrote it itself.
 *
 * @module
 */
import { LOG_FILE_ENV } from "../api/wire.ts";
import { dispatchCall } from "../cni/dispatch.ts";
import { fileSink } from "../cni/log_file.ts";
import { Logger } from "../lib/log.ts";
import type { CniCall } from "../api/schema.ts";
import type { LocalAgentClient } from "./local_client.ts";

/** What a served call prints and how it exits. */
export interface CniCallResult {
  exit: number;
  stdout: string;
}

/**
 * Runs one forwarded CNI call against `api` (the agent's {@linkcode LocalAgentClient});
 * `pluginTimeoutMs`, when the plugin said how long it waits, bounds the ADD's answer.
 */
export async function serveCniCall(
  call: CniCall,
  api: LocalAgentClient,
  pluginTimeoutMs?: number,
): Promise<CniCallResult> {
  let stdout = "";
  const override = call.env[LOG_FILE_ENV];
  const exit = await dispatchCall({
    env: call.env,
    stdin: call.stdin,
    stdout: (s) => (stdout += s),
    agent: pluginTimeoutMs === undefined ? api : api.forPlugin(pluginTimeoutMs),
    openLog: (logFile) => new Logger(fileSink(override || logFile)),
  });
  return { exit, stdout };
}
