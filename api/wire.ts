/**
 * The agent's wire constants: what the plugin process, the CLI and the agent's
 * server must agree on to reach each other. Imports nothing, so the plugin
 * process (`cni/forward.ts`) can load it at no cost.
 *
 * @module
 */

/** The default agent socket. */
export const DEFAULT_SOCKET = "/run/enim/enim.sock";

/** The API path the plugin process posts a raw call to (`cni/forward.ts`). */
export const CNI_CALL_PATH = "/v1/cni";
/** The header of the agent's answer to a raw call that carries the plugin's exit code. */
export const EXIT_HEADER = "enim-cni-exit";
/** The largest stdin a raw call may carry (a GC's valid attachments can be long). */
export const MAX_CALL_STDIN = 4 * 1024 * 1024;

/** The variable that sends the plugin's log line to another file (tests, debugging). */
export const LOG_FILE_ENV = "ENIM_LOG_FILE";

/** The CNI environment variables a call carries (the only ones the plugin reads and forwards). */
export const CNI_ENV_NAMES = [
  "CNI_COMMAND",
  "CNI_CONTAINERID",
  "CNI_NETNS",
  "CNI_IFNAME",
  "CNI_ARGS",
  "CNI_PATH",
] as const;
/** One of {@linkcode CNI_ENV_NAMES}. */
export type CniEnvName = typeof CNI_ENV_NAMES[number];
