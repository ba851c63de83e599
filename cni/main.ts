/**
 * The CNI plugin's process entry: the real environment (the CNI_* names only),
 * stdin, stdout, the unix-socket agent client and the log file.
 *
 * Kept lean on purpose: it loads `cni/`, the agent API schemas and client, and
 * the logger; never commander, the agent, the manager or the providers.
 *
 * The log file is the config's `logFile` (default /var/log/enim/cni.log);
 * `ENIM_LOG_FILE` overrides it.
 *
 * @module
 */
import { Logger } from "../lib/log.ts";
import { SocketAgentClient } from "../manager/client.ts";
import { CNI_ENV_NAMES } from "./env.ts";
import { fileSink } from "./log_file.ts";
import { runPlugin } from "./plugin.ts";

/** Reads only the named variables (the permission set allows CNI_* and ENIM_*, not toObject()). */
export function readEnv(names: readonly string[]): Record<string, string | undefined> {
  const env: Record<string, string | undefined> = {};
  for (const name of names) {
    try {
      env[name] = Deno.env.get(name);
    } catch {
      env[name] = undefined;
    }
  }
  return env;
}

/** Reads all of stdin as UTF-8 (an unreadable stdin counts as empty). */
export async function readStdin(): Promise<string> {
  try {
    return await new Response(Deno.stdin.readable).text();
  } catch {
    return "";
  }
}

/** Writes all of `text` to stdout. */
function writeStdout(text: string): void {
  const bytes = new TextEncoder().encode(text);
  let off = 0;
  while (off < bytes.length) off += Deno.stdout.writeSync(bytes.subarray(off));
}

/** Runs the plugin against the real process environment, stdin and stdout. */
export async function runPluginFromProcess(): Promise<number> {
  const env = readEnv([...CNI_ENV_NAMES, "ENIM_LOG_FILE"]);
  const stdin = await readStdin();
  const logOverride = env.ENIM_LOG_FILE;
  return await runPlugin({
    env,
    stdin,
    stdout: writeStdout,
    agent: (socketPath, timeoutMs) => new SocketAgentClient(socketPath, timeoutMs),
    openLog: (logFile) => new Logger(fileSink(logOverride || logFile)),
  });
}
