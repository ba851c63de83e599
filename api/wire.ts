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
/**
 * The header of a raw call that tells the agent how long the plugin waits for its answer
 * (ms, the config's `timeoutSeconds`): the agent answers `busy` before then rather than
 * the plugin giving up unanswered. A header, not a body field, so an agent of another
 * version ignores it.
 */
export const TIMEOUT_HEADER = "enim-cni-timeout-ms";

/**
 * How long before the plugin's own deadline the agent answers a call it cannot finish
 * (`busy`): a quarter of the plugin's wait, at most 2 s (the answer's way back).
 */
export function answerBudgetMs(pluginTimeoutMs: number): number {
  return pluginTimeoutMs - Math.min(2000, pluginTimeoutMs / 4);
}
/** The largest stdin a raw call may carry (a GC's valid attachments can be long). */
export const MAX_CALL_STDIN = 4 * 1024 * 1024;

/** The longest value of one CNI variable a raw call may carry. */
export const MAX_CALL_ENV_VALUE = 128 * 1024;

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

/**
 * A rule for a name a call carries, with no zod: the plugin process applies it
 * itself when the agent is down (`cni/spec.ts`), and the API's schemas refine
 * with it (`api/schema.ts`), so both name the same reason.
 *
 * @example
 * ```ts
 * IFNAME.problem("eth0"); // undefined
 * IFNAME.problem("a/b"); // "Expected a Linux interface name: …"
 * ```
 */
export interface NameRule {
  /** Why `value` is malformed (a sentence starting "Expected"), or undefined when it is well-formed. */
  problem(value: string): string | undefined;
}

const utf8 = new TextEncoder();

/** The spec's charset for container ids and network names. */
const SPEC_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_.\-]*$/;
/** What {@linkcode SPEC_NAME_RE} asks for. */
const SPEC_NAME_EXPECTED = "Expected an alphanumeric followed by alphanumerics, '_', '.' or '-'";

/** A container id (CNI_CONTAINERID and the API's `containerId`): the spec's charset, at most 256 characters. */
export const CONTAINER_ID: NameRule = {
  problem: (s) =>
    s.length > 256
      ? "Expected at most 256 characters"
      : SPEC_NAME_RE.test(s)
      ? undefined
      : SPEC_NAME_EXPECTED,
};

/** A Linux interface name (CNI_IFNAME, the API's `ifName`): 1 to 15 bytes, no '/', ':' or whitespace, not "." or "..". */
export const IFNAME: NameRule = {
  problem: (s) =>
    s.length === 0 || s.length > 15 || s === "." || s === ".." || /[\/:\s]/.test(s) ||
      utf8.encode(s).length > 15
      ? "Expected a Linux interface name: at most 15 bytes, no '/', ':' or whitespace"
      : undefined,
};

/** A network namespace path (CNI_NETNS, the API's `netns`): absolute, no "." or ".." component, at most 4096 characters. */
export const NETNS_PATH: NameRule = {
  problem: (s) =>
    s.length > 4096
      ? "Expected at most 4096 characters"
      : s.startsWith("/") && !s.split("/").some((p) => p === ".." || p === ".")
      ? undefined
      : "Expected an absolute path without '.' or '..' components",
};
