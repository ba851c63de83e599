/**
 * The agent's wire constants: what the plugin process, the CLI and the agent's
 * server must agree on to reach each other. Imports nothing, so the plugin
 * process (`cni/forward.ts`) can load it at no cost.
 *
 * @module
 */

/** The default agent socket. */
export const DEFAULT_SOCKET = "/run/enim/enim.sock";

/**
 * Where `enim probe` asks by default: the DaemonSet's agent serves its own probes there
 * (`--probe-socket`, `health.probeSocket`, agent/probe.ts), in the pod's own folder.
 */
export const DEFAULT_PROBE_SOCKET = "/run/enim-agent/probe.sock";

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

/**
 * The header of a raw call that carries the plugin's enim version (`lib/version.ts`). A
 * plugin of 0.1.0 sends none: the agent takes its absence for
 * {@linkcode UNLABELLED_PLUGIN_VERSION}. The agent's answer carries its own in
 * {@linkcode AGENT_VERSION_HEADER}.
 */
export const PLUGIN_VERSION_HEADER = "enim-plugin-version";
/** The header of the agent's answer to a raw call that carries the agent's enim version. */
export const AGENT_VERSION_HEADER = "enim-agent-version";
/** The version of a plugin whose call carries no {@linkcode PLUGIN_VERSION_HEADER}. */
export const UNLABELLED_PLUGIN_VERSION = "0.1.0";

const SEMVER_RE = /^(\d{1,6})\.(\d{1,6})\.(\d{1,6})$/;

/**
 * Why a plugin of `plugin`'s version and an agent of `agent`'s cannot serve calls together
 * (a sentence naming both), or undefined when they can: the supported skew is the same
 * major version and at most one minor version apart, either way (docs/upgrading.md). A
 * version that is not `MAJOR.MINOR.PATCH` is outside it.
 *
 * @example
 * ```ts
 * skewProblem("0.1.0", "0.2.0"); // undefined
 * skewProblem("0.1.0", "0.3.0"); // "The enim plugin 0.1.0 and agent 0.3.0 are …"
 * ```
 */
export function skewProblem(plugin: string, agent: string): string | undefined {
  const p = SEMVER_RE.exec(plugin), a = SEMVER_RE.exec(agent);
  const fine = p && a && p[1] === a[1] && Math.abs(Number(p[2]) - Number(a[2])) <= 1;
  if (fine) return undefined;
  return `The enim plugin ${JSON.stringify(plugin)} and agent ${
    JSON.stringify(agent)
  } are too far apart: a plugin and an agent of the same major version and at most one ` +
    "minor version apart work together; install the plugin of the agent's version " +
    "(the DaemonSet's init container does)";
}

/**
 * The agent's record beside its socket (`agent.json` in the socket's directory): which
 * enim serves there, and when a graceful stop (SIGTERM) began. The plugin reads it when the
 * agent does not answer: within {@linkcode RESTART_GRACE_SECONDS} of a graceful stop the
 * agent is being replaced (a rollout, a restart), so STATUS answers success and ADD, DEL,
 * CHECK and GC wait for the new agent; without a record, or after the grace, the agent is
 * gone (STATUS 50). A record of the time the agent served is rewritten at each start.
 */
export interface AgentRecord {
  /** The agent's enim version. */
  version: string;
  pid: number;
  /** When it started serving, epoch milliseconds. */
  servingSince: number;
  /** When its graceful stop began, epoch milliseconds; absent while it serves. */
  stoppedAt?: number;
}

/** The name of the {@linkcode AgentRecord} file, in the directory of the agent's socket. */
export const AGENT_RECORD_NAME = "agent.json";

/**
 * How long after a graceful stop of the agent its replacement is waited for: the plugin
 * answers STATUS success and ADD/DEL/CHECK/GC wait (within the call's `timeoutSeconds`) for
 * this long, then STATUS answers 50. Long enough for a DaemonSet rollout with the image
 * pre-pulled (the old pod's stop, the new pod's init container and the agent's start); a
 * node whose agent does not come back in that time goes NotReady.
 */
export const RESTART_GRACE_SECONDS = 30;

/** The path of the {@linkcode AgentRecord} beside the socket `socket`. */
export function agentRecordPath(socket: string): string {
  const slash = socket.lastIndexOf("/");
  return `${slash <= 0 ? "" : socket.slice(0, slash)}/${AGENT_RECORD_NAME}`;
}

/**
 * Parses an {@linkcode AgentRecord}'s text (no zod: the plugin process reads it); undefined
 * when it is not one.
 */
export function parseAgentRecord(text: string): AgentRecord | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return undefined;
  const r = v as Record<string, unknown>;
  const time = (x: unknown) => typeof x === "number" && Number.isFinite(x) && x >= 0;
  if (typeof r.version !== "string" || !SEMVER_RE.test(r.version)) return undefined;
  if (typeof r.pid !== "number" || !Number.isInteger(r.pid) || r.pid <= 0) return undefined;
  if (!time(r.servingSince)) return undefined;
  if (r.stoppedAt !== undefined && !time(r.stoppedAt)) return undefined;
  return {
    version: r.version,
    pid: r.pid,
    servingSince: r.servingSince as number,
    ...(r.stoppedAt !== undefined ? { stoppedAt: r.stoppedAt as number } : {}),
  };
}

/**
 * Whether `record` says its agent is being replaced at `now`: it began a graceful stop less
 * than {@linkcode RESTART_GRACE_SECONDS} ago (or, a clock stepped back, at most that long
 * "in the future").
 */
export function restarting(record: AgentRecord | undefined, now: number): boolean {
  if (record?.stoppedAt === undefined) return false;
  return withinGrace(record.stoppedAt, now);
}

/** Whether `since` (epoch ms) is less than {@linkcode RESTART_GRACE_SECONDS} from `now`. */
function withinGrace(since: number, now: number): boolean {
  const age = now - since, grace = RESTART_GRACE_SECONDS * 1000;
  return age > -grace && age < grace;
}

/**
 * The replacement marker's name, in the directory of the agent's socket: the DaemonSet's
 * init container writes `{"since": <epoch ms>}` there once it has installed the plugin,
 * right before its pod's agent starts (deploy/kubernetes/daemonset.yaml). An agent is on
 * its way then, whatever the agent before it left: 0.1.0 writes no {@linkcode AgentRecord},
 * so without the marker a rollout from 0.1.0 had the new plugin answer STATUS 50 until the
 * new agent served (tests/k8s_rollout_test.ts). The agent removes it when it serves.
 */
export const REPLACING_NAME = "replacing.json";

/** The path of the replacement marker beside the socket `socket`. */
export function replacingPath(socket: string): string {
  const slash = socket.lastIndexOf("/");
  return `${slash <= 0 ? "" : socket.slice(0, slash)}/${REPLACING_NAME}`;
}

/**
 * Whether the replacement marker's text (undefined: no marker) says a new agent is on its
 * way at `now`: written less than {@linkcode RESTART_GRACE_SECONDS} ago. No zod: the plugin
 * process reads it.
 */
export function replacing(text: string | undefined, now: number): boolean {
  if (text === undefined) return false;
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return false;
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return false;
  const since = (v as Record<string, unknown>).since;
  if (typeof since !== "number" || !Number.isFinite(since) || since < 0) return false;
  return withinGrace(since, now);
}
