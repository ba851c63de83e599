/**
 * The CNI plugin process: what a container runtime execs for every CNI call.
 *
 * It forwards the raw call (the CNI_* environment and stdin) to the agent, which runs
 * the whole CNI protocol (`cni/dispatch.ts`: env, config, CNI_ARGS, versions, results,
 * error codes) with its schemas already compiled, and prints what the agent answers.
 * So the process loads nothing but `api/wire.ts`, `cni/spec.ts`, `cni/log_file.ts`,
 * `lib/`'s `clip.ts`, `http1.ts`, `utf8.ts`, `timestamp.ts`, `version.ts` and this
 * file: no zod, no agent, CLI or provider code; a call costs about Deno's start-up.
 *
 * What it answers itself:
 * - VERSION, without the agent;
 * - what is wrong whatever the agent says, before it asks the agent, with the
 *   code and message the agent's dispatcher gives (`specProblem` in
 *   `cni/spec.ts`, the one table both check first), so a runtime gets the same
 *   answer whether the agent is up or down: a missing or unknown CNI_COMMAND, a
 *   required variable unset, a malformed CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS,
 *   a CNI_ARGS of ADD or CHECK that is not `K=V;…`, any CNI variable too long for
 *   the agent's API → 4; a stdin that is not a JSON object → 6; a `cniVersion`
 *   enim does not speak, CHECK before 0.4.0, GC or STATUS before 1.1.0 → 1; a
 *   stdin over 4 MiB, a `cniVersion` or `name` that is no string, a malformed
 *   `name`, a config whose `type` and `ipam.type` are not enim, a GC without
 *   `cni.dev/valid-attachments` → 7; an `ipam` of another type under enim as the
 *   interface plugin → 2;
 * - when the agent cannot be reached (no socket, nobody listening, the connection broke)
 *   and its record beside the socket (`agent.json`, `AgentRecord`) says it began a graceful
 *   stop less than `RESTART_GRACE_SECONDS` (30 s) ago, or the init container's replacement
 *   marker (`replacing.json`, `REPLACING_NAME`) is that recent, it is being replaced:
 *   - STATUS → success (the node stays Ready through a rollout);
 *   - every other verb waits for the new agent (tried again every 100 ms) within the
 *     grace and the config's `timeoutSeconds`, then is sent to it as usual;
 * - when the agent cannot be reached otherwise (no record, a record of an agent that
 *   never stopped gracefully (killed), the grace over, no answer within `timeoutSeconds`):
 *   - STATUS → 50;
 *   - DEL → success when the pod's namespace is gone (`CNI_NETNS` empty or the
 *     path no longer exists: nothing is left in the pod to undo, and the
 *     agent's GC reclaims the ENI), otherwise 11 so the runtime retries;
 *   - anything else → 11, naming the socket.
 *   The rest of the config is not validated then (that needs the agent's schemas).
 *
 * The socket, the time limit and the log file come from enim's section of the config as
 * it is (`agentSocket`, `timeoutSeconds`, `logFile`), or their defaults when absent or
 * not of the right type; the agent validates them. The agent writes the call's log
 * line; the process writes one itself only for what it answered alone.
 *
 * Wire format: `POST /v1/cni` with `{"env": {...}, "stdin": "..."}`, the plugin's enim
 * version in the `enim-plugin-version` header (the agent refuses a plugin outside the
 * supported skew: `skewProblem` in `api/wire.ts`), and how long
 * the plugin waits in the `enim-cni-timeout-ms` header (so the agent answers
 * `busy` before the plugin gives up: `answerBudgetMs` in `api/wire.ts`); the agent
 * answers 200 with the exact stdout as the body and the exit code in the
 * `enim-cni-exit` header.
 *
 * @module
 */
import {
  agentRecordPath,
  CNI_CALL_PATH,
  CNI_ENV_NAMES,
  DEFAULT_SOCKET,
  EXIT_HEADER,
  LOG_FILE_ENV,
  parseAgentRecord,
  PLUGIN_VERSION_HEADER,
  replacing,
  replacingPath,
  RESTART_GRACE_SECONDS,
  restarting,
  TIMEOUT_HEADER,
} from "../api/wire.ts";
import { VERSION } from "../lib/version.ts";
import {
  answer,
  answerVersion,
  CNI_CODES,
  type CniErrorObject,
  decodeStdin,
  DEFAULT_LOG_FILE,
  DEFAULT_TIMEOUT_SECONDS,
  enimSection,
  errorObject,
  type InvocationRecord,
  isPlainObject,
  LATEST_VERSION,
  specProblem,
  statNetns,
} from "./spec.ts";
import {
  bodyText,
  encodeRequest,
  type HttpResponse,
  UnixHttpError,
  unixRoundTrip,
} from "../lib/http1.ts";
import { appendLine } from "./log_file.ts";
import { decodeUtf8 } from "../lib/utf8.ts";
import { isoTimestamp } from "../lib/timestamp.ts";

/** What {@linkcode forward} needs from its caller (main: the real process). */
export interface ForwardIo {
  /** CNI_* and ENIM_LOG_FILE (others are ignored). */
  env: Record<string, string | undefined>;
  stdin: string;
  stdout(text: string): void;
  /** Appends one line to a log file; must not throw. */
  log(file: string, line: string): void;
  /** Sends one HTTP request over a unix socket (default: {@linkcode unixRoundTrip}). */
  roundTrip?(socketPath: string, request: Uint8Array, timeoutMs: number): Promise<HttpResponse>;
  /** Whether a netns path exists: undefined when it cannot be told (default: `Deno.statSync`). */
  netnsExists?(path: string): boolean | undefined;
  /** Reads a small file; undefined when it cannot be read (default: `Deno.readTextFileSync`). */
  readFile?(path: string): string | undefined;
  /** Waits `ms` (default: a timer). */
  sleep?(ms: number): Promise<void>;
  /** The wall clock, epoch ms (default: `Date.now`). */
  now?(): number;
}

/** How often a call waiting for an agent being replaced tries it again. */
const RESTART_POLL_MS = 100;

function readFileSync(path: string): string | undefined {
  try {
    return Deno.readTextFileSync(path);
  } catch {
    return undefined;
  }
}

/** Where the call goes, read from enim's section of the config as it is. */
interface Route {
  socket: string;
  timeoutMs: number;
  logFile: string;
  cniVersion: string;
}

function routeOf(env: Record<string, string | undefined>, value: unknown): Route {
  const raw = isPlainObject(value) ? value : {};
  const section = enimSection(raw) ?? {};
  const s = section.agentSocket;
  const t = section.timeoutSeconds;
  const f = section.logFile;
  const override = env[LOG_FILE_ENV];
  return {
    socket: typeof s === "string" && s.startsWith("/") && s.length <= 107 ? s : DEFAULT_SOCKET,
    timeoutMs: (typeof t === "number" && t > 0 && t <= 600 ? t : DEFAULT_TIMEOUT_SECONDS) * 1000,
    logFile: override
      ? override
      : typeof f === "string" && f.startsWith("/")
      ? f
      : DEFAULT_LOG_FILE,
    cniVersion: typeof raw.cniVersion === "string" ? raw.cniVersion : LATEST_VERSION,
  };
}

/**
 * Serves one CNI call: forwards it to the agent, or answers what it can alone
 * (see the module doc). Returns the exit code.
 */
export async function forward(io: ForwardIo): Promise<number> {
  const started = performance.now();
  const env = io.env;
  const verb = env.CNI_COMMAND;
  const decoded = decodeStdin(io.stdin);
  const route = routeOf(env, decoded.ok ? decoded.value : undefined);
  const record: InvocationRecord = {
    verb: verb ?? null,
    cniVersion: route.cniVersion,
    pluginVersion: VERSION,
    code: 0,
    durationMs: 0,
  };
  for (const [k, name] of [["containerId", "CNI_CONTAINERID"], ["ifName", "CNI_IFNAME"]] as const) {
    if (env[name]) record[k] = env[name];
  }
  if (env.CNI_NETNS) record.netns = env.CNI_NETNS;

  const finish = (code: number, out: string | undefined): number => {
    const exit = answer(io.stdout, out, code, record, started);
    io.log(
      route.logFile,
      JSON.stringify({
        ts: isoTimestamp(Date.now()),
        level: exit !== 0 ? "error" : record.warnings ? "warn" : "info",
        msg: "cni invocation",
        ...record,
      }),
    );
    return exit;
  };
  const fail = (e: CniErrorObject): number => {
    record.code = e.code;
    record.msg = e.msg;
    return finish(1, JSON.stringify(e));
  };

  if (verb === "VERSION") {
    const v = answerVersion(decoded);
    if (!v.ok) return fail(errorObject(route.cniVersion, CNI_CODES.DECODE_FAILED, v.msg));
    return finish(0, JSON.stringify(v.result));
  }

  // Wrong whatever the agent says: answered here, from the table the agent checks first.
  const problem = specProblem(env, decoded);
  if (problem) return fail(errorObject(route.cniVersion, problem.code, problem.msg));

  const call: Record<string, string> = {};
  for (const name of [...CNI_ENV_NAMES, LOG_FILE_ENV]) {
    const v = env[name];
    if (v !== undefined) call[name] = v;
  }
  const body = new TextEncoder().encode(JSON.stringify({ env: call, stdin: io.stdin }));
  const now = io.now ?? Date.now;
  const deadline = now() + route.timeoutMs;
  let res: HttpResponse;
  for (let attempt = 0;; attempt++) {
    const left = attempt === 0 ? route.timeoutMs : Math.max(1, Math.round(deadline - now()));
    try {
      res = await (io.roundTrip ?? unixRoundTrip)(
        route.socket,
        encodeRequest("POST", CNI_CALL_PATH, body, {
          [TIMEOUT_HEADER]: String(left),
          [PLUGIN_VERSION_HEADER]: VERSION,
        }),
        left,
      );
      break;
    } catch (err) {
      // An agent being replaced: STATUS says the network is still there; the rest waits.
      const away = err instanceof UnixHttpError && err.phase !== "timeout" && beingReplaced();
      if (away && verb === "STATUS") {
        record.warnings = [
          `The enim agent at "${route.socket}" is being replaced (a graceful stop, or a new agent's install, less than ${RESTART_GRACE_SECONDS} s ago): the network stays ready meanwhile`,
        ];
        return finish(0, undefined);
      }
      // A DEL whose pod is gone has nothing to wait for (the agent's GC reclaims the ENI).
      const gone = verb === "DEL" && netnsGone();
      if (away && !gone && deadline - now() > RESTART_POLL_MS) {
        await (io.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms))))(RESTART_POLL_MS);
        continue;
      }
      return unreachable(err);
    }
  }

  const exit = res.headers.get(EXIT_HEADER);
  if (res.status === 200 && (exit === "0" || exit === "1")) {
    const out = bodyText(res);
    try {
      if (out !== "") io.stdout(out);
    } catch {
      return 1;
    }
    return Number(exit);
  }
  // The agent refused the call itself (not a CNI error): too large, shutting down, a bug.
  let message = bodyText(res).slice(0, 500);
  try {
    const parsed: unknown = JSON.parse(message);
    if (isPlainObject(parsed) && isPlainObject(parsed.error)) {
      message = String(parsed.error.message ?? message);
    }
  } catch { /* not JSON: keep the text */ }
  const code = res.status === 503
    ? CNI_CODES.TRY_AGAIN_LATER
    : res.status >= 400 && res.status < 500
    ? CNI_CODES.INVALID_CONFIG
    : CNI_CODES.INTERNAL;
  return fail(
    errorObject(
      route.cniVersion,
      code,
      `The enim agent refused the call (HTTP ${res.status}): ${message}`,
    ),
  );

  /** Whether the call's namespace is known to be gone (unset, empty or no such path). */
  function netnsGone(): boolean {
    const netns = env.CNI_NETNS;
    if (netns === undefined || netns === "") return true;
    return (io.netnsExists ?? statNetns)(netns) === false;
  }

  /**
   * Whether the agent's record says it began a graceful stop within the grace, or the
   * replacement marker says a new agent's init container installed the plugin within it.
   */
  function beingReplaced(): boolean {
    const read = io.readFile ?? readFileSync;
    const text = read(agentRecordPath(route.socket));
    if (text !== undefined && restarting(parseAgentRecord(text), now())) return true;
    return replacing(read(replacingPath(route.socket)), now());
  }

  /** The agent did not answer: the rules of the module doc. */
  function unreachable(err: unknown): number {
    const why = err instanceof Error ? err.message : String(err);
    const socket = route.socket;
    const cause = err instanceof UnixHttpError ? err.cause : undefined;
    if (verb === "STATUS") {
      return fail(
        errorObject(
          route.cniVersion,
          CNI_CODES.NOT_AVAILABLE,
          `The enim agent is not reachable at "${socket}": the plugin cannot serve ADD`,
          why,
        ),
      );
    }
    if (verb === "DEL") {
      if (netnsGone()) {
        record.warnings = [
          `The enim agent is not reachable at "${socket}" and the network namespace is ` +
          "gone: nothing to undo in the pod; the agent's GC reclaims the ENI",
        ];
        return finish(0, undefined);
      }
    }
    if (cause instanceof Deno.errors.NotCapable) {
      return fail(
        errorObject(
          route.cniVersion,
          CNI_CODES.TRY_AGAIN_LATER,
          `The enim agent is not reachable at "${socket}": the plugin's permissions do not allow that socket (only the default ${DEFAULT_SOCKET} is allowed)`,
          why,
        ),
      );
    }
    const timedOut = err instanceof UnixHttpError && err.phase === "timeout";
    return fail(
      errorObject(
        route.cniVersion,
        CNI_CODES.TRY_AGAIN_LATER,
        timedOut
          ? `The enim agent at "${socket}" did not answer within ${
            route.timeoutMs / 1000
          } s; try again later`
          : `The enim agent is not reachable at "${socket}"; try again later`,
        why,
      ),
    );
  }
}

/** Reads all of stdin synchronously (an unreadable stdin counts as empty). */
export function readStdinSync(): string {
  const parts: Uint8Array[] = [];
  let total = 0;
  try {
    for (;;) {
      const buf = new Uint8Array(65536);
      const n = Deno.stdin.readSync(buf);
      if (n === null || n === 0) break;
      parts.push(buf.subarray(0, n));
      total += n;
    }
  } catch { /* closed or unreadable: what was read so far */ }
  const all = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  return decodeUtf8(all);
}

/** Reads only the named variables (the permission set allows CNI_* and ENIM_*). */
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

/** Runs the plugin against the real process environment, stdin and stdout. */
export function runPluginProcess(): Promise<number> {
  const encoder = new TextEncoder();
  return forward({
    env: readEnv([...CNI_ENV_NAMES, LOG_FILE_ENV]),
    stdin: readStdinSync(),
    stdout(text) {
      const bytes = encoder.encode(text);
      let off = 0;
      while (off < bytes.length) off += Deno.stdout.writeSync(bytes.subarray(off));
    },
    log(file, line) {
      try {
        appendLine(file, line);
      } catch { /* logging never changes a result */ }
    },
  });
}
