/**
 * The parts of the CNI protocol that the plugin process itself needs: the
 * verbs and variable names, the spec versions, the error codes, decoding
 * stdin, the VERSION answer, the error object's shape, and the one table of
 * what a call gets wrong whatever the agent says ({@linkcode specProblem}: the
 * environment, the version, the network's name, whose config it is).
 *
 * This module imports only the wire constants and name rules (`api/wire.ts`) and
 * the message clipping (`lib/clip.ts`), on purpose: the plugin process
 * (`cni/forward.ts`) loads only these, `lib/http1.ts`, `cni/log_file.ts` and
 * itself, so that every CNI call costs little more than Deno's own start-up.
 * Everything that needs a schema (the rest of the network config, CNI_ARGS,
 * results, the agent's API) runs in the agent, where the schemas are already
 * compiled. `cni/dispatch.ts` checks {@linkcode specProblem} first and builds on
 * this module (so do `cni/env.ts`, `cni/negotiate.ts` and `cni/config.ts`), so
 * both sides answer with the same codes and messages.
 *
 * Why one file: it is everything of the protocol the plugin process knows, read
 * top to bottom by whoever checks that the plugin and the agent agree; the
 * plugin loads all of it on every call, so splitting it would add modules to
 * that load and nothing to a reader.
 *
 * @module
 */
import {
  CNI_ENV_NAMES,
  type CniEnvName,
  CONTAINER_ID,
  IFNAME,
  MAX_CALL_ENV_VALUE,
  MAX_CALL_STDIN,
  type NameRule,
  NETNS_PATH,
} from "../api/wire.ts";
import { clip, listOf, MESSAGE_CHARS, quote } from "../lib/clip.ts";

/** The CNI verbs enim serves. */
export const CNI_VERBS = ["ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC"] as const;
/** A CNI verb. */
export type CniVerb = typeof CNI_VERBS[number];

/** Which variables each verb requires, per SPEC.md. */
export const REQUIRED_ENV: Record<CniVerb, readonly CniEnvName[]> = {
  ADD: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
  DEL: ["CNI_CONTAINERID", "CNI_IFNAME"],
  CHECK: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
  GC: ["CNI_PATH"],
  STATUS: [],
  VERSION: [],
};

/** The spec versions enim speaks, oldest first. */
export const SUPPORTED_VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] as const;
/** A spec version enim speaks. */
export type SupportedVersion = typeof SUPPORTED_VERSIONS[number];
/** The newest version, used when the request carries none (VERSION) or none can be read. */
export const LATEST_VERSION: SupportedVersion = "1.1.0";

/** Where the plugin logs by default. */
export const DEFAULT_LOG_FILE = "/var/log/enim/cni.log";
/** How long the plugin waits for the agent by default. */
export const DEFAULT_TIMEOUT_SECONDS = 30;

/** The CNI error codes enim uses (spec codes 1–51, enim's own from 100). */
export const CNI_CODES = {
  /** Spec 1: incompatible CNI version. */
  INCOMPATIBLE_VERSION: 1,
  /** Spec 2: unsupported field in the network config (message names key and value). */
  UNSUPPORTED_FIELD: 2,
  /** Spec 3: container unknown or does not exist. */
  UNKNOWN_CONTAINER: 3,
  /** Spec 4: invalid necessary environment variables (message names them). */
  INVALID_ENV: 4,
  /** Spec 5: I/O failure. */
  IO_FAILURE: 5,
  /** Spec 6: failed to decode content (stdin is not JSON, or not a JSON object). */
  DECODE_FAILED: 6,
  /** Spec 7: invalid network config. */
  INVALID_CONFIG: 7,
  /** Spec 11: try again later (the agent is unreachable or busy). */
  TRY_AGAIN_LATER: 11,
  /** Spec 50: the plugin cannot service ADD requests (STATUS). */
  NOT_AVAILABLE: 50,
  /** Spec 51: not available, and existing containers may have limited connectivity (STATUS). */
  NOT_AVAILABLE_LIMITED: 51,
  /** enim: no ENI available — the pool is empty and nothing more can be attached. */
  NO_ENI_AVAILABLE: 100,
  /** enim: no ENI carries the requested IP. */
  REQUESTED_IP_UNAVAILABLE: 101,
  /** enim: the interface name already exists in the pod. */
  IFNAME_EXISTS: 102,
  /** enim: the network namespace is missing or not a network namespace. */
  INVALID_NETNS: 103,
  /** enim: the cloud provider failed. */
  PROVIDER_ERROR: 104,
  /** enim: moving or configuring the device failed. */
  DEVICE_ERROR: 105,
  /** enim: CHECK found the attachment different from what was set up. */
  CHECK_FAILED: 106,
  /** enim: GC ran but some reclaims failed (they are retried by the agent). */
  GC_INCOMPLETE: 107,
  /**
   * enim: a zone-sticky pod's ENI is held elsewhere: on a node BCE reports running,
   * or claimed by another node at the same moment (the message says which).
   */
  STICKY_ELSEWHERE: 108,
  /** enim: a zone-sticky pod's ENI is in another zone than this node (the message names both). */
  WRONG_ZONE: 109,
  /** enim: an unexpected failure (a bug, or an agent-side internal error). */
  INTERNAL: 110,
  /**
   * enim: NetworkPolicy cannot be enforced on this node (kube-proxy's IPVS mode): the pod
   * is refused rather than started with half its policy (the message says why).
   */
  POLICY_UNENFORCEABLE: 111,
  /**
   * enim: the plugin and the agent are of versions too far apart to work together (the
   * supported skew: `skewProblem` in `api/wire.ts`; the message names both versions).
   */
  VERSION_SKEW: 112,
} as const;

/** A CNI error code. */
export type CniCode = typeof CNI_CODES[keyof typeof CNI_CODES];

/** The CNI error result printed on stdout (SPEC.md "Error"). */
export interface CniErrorObject {
  cniVersion: string;
  code: number;
  msg: string;
  details?: string;
}

/** Builds an error object, leaving out an empty `details`. */
export function errorObject(
  cniVersion: string,
  code: number,
  msg: string,
  details?: string,
): CniErrorObject {
  return { cniVersion, code, msg: msg || "Unknown error", ...(details ? { details } : {}) };
}

/** The stdin document, decoded once, and how many characters it had. */
export type Decoded =
  & ({ ok: true; value: unknown } | { ok: false; empty: boolean; error: string })
  & { chars: number };

/** Decodes stdin as JSON, remembering whether it was empty. */
export function decodeStdin(stdin: string): Decoded {
  const chars = stdin.length;
  if (stdin.trim() === "") return { ok: false, empty: true, error: "stdin is empty", chars };
  try {
    return { ok: true, value: JSON.parse(stdin), chars };
  } catch (err) {
    return {
      ok: false,
      empty: false,
      error: err instanceof Error ? err.message : String(err),
      chars,
    };
  }
}

/** Whether `v` is a JSON object (not null, not an array). */
export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The VERSION answer. */
export function versionResult(requested: string | undefined): {
  cniVersion: string;
  supportedVersions: string[];
} {
  return { cniVersion: requested ?? LATEST_VERSION, supportedVersions: [...SUPPORTED_VERSIONS] };
}

/**
 * VERSION: lenient about stdin (empty is fine), strict about what it can read.
 * Returns the result, or the code-6 message for an unreadable request.
 */
export function answerVersion(
  decoded: Decoded,
): { ok: true; result: ReturnType<typeof versionResult> } | { ok: false; msg: string } {
  if (!decoded.ok) {
    if (decoded.empty) return { ok: true, result: versionResult(undefined) };
    return { ok: false, msg: `Cannot decode the VERSION request on stdin: ${decoded.error}` };
  }
  const v = isPlainObject(decoded.value) ? decoded.value.cniVersion : undefined;
  if (!isPlainObject(decoded.value) || (v !== undefined && typeof v !== "string")) {
    return {
      ok: false,
      msg: 'Cannot decode the VERSION request on stdin: expected {"cniVersion": "<version>"}',
    };
  }
  return { ok: true, result: versionResult(v as string | undefined) };
}

/** The code-6 message for a verb whose stdin could not be decoded as a JSON object. */
export function decodeFailure(verb: string, decoded: Decoded): string | undefined {
  if (!decoded.ok) {
    return decoded.empty
      ? `Cannot decode the network config: stdin is empty (${verb} needs the config)`
      : `Cannot decode the network config on stdin: ${decoded.error}`;
  }
  if (!isPlainObject(decoded.value)) {
    const v = decoded.value;
    return `Cannot decode the network config on stdin: expected a JSON object, got ${
      Array.isArray(v) ? "an array" : v === null ? "null" : typeof v
    }`;
  }
  return undefined;
}

/** The code-4 message for a missing or unknown `CNI_COMMAND`, or undefined when it is a verb. */
export function verbProblem(raw: string | undefined): string | undefined {
  if (raw === undefined || raw === "") return "CNI_COMMAND is not set";
  if (!(CNI_VERBS as readonly string[]).includes(raw)) {
    return `CNI_COMMAND ${quote(raw)} is not one of ${CNI_VERBS.join(", ")}`;
  }
  return undefined;
}

/** Which variables each verb reads (and so checks when they are set). */
export const USED_ENV: Record<CniVerb, readonly CniEnvName[]> = {
  ADD: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"],
  DEL: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"],
  CHECK: ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"],
  GC: ["CNI_PATH"],
  STATUS: ["CNI_PATH"],
  VERSION: [],
};

/** The longest CNI_ARGS enim reads. */
export const MAX_CNI_ARGS = 64 * 1024;

/** Any CNI variable's value: no longer than the agent's API carries ({@linkcode MAX_CALL_ENV_VALUE}). */
const ANY_VALUE: NameRule = {
  problem: (s) =>
    s.length > MAX_CALL_ENV_VALUE ? `Expected at most ${MAX_CALL_ENV_VALUE} characters` : undefined,
};

/** How each variable's value is checked when it is set and not empty (CNI_PATH only for length). */
const ENV_RULES: Record<Exclude<CniEnvName, "CNI_COMMAND">, NameRule> = {
  CNI_CONTAINERID: CONTAINER_ID,
  CNI_NETNS: NETNS_PATH,
  CNI_IFNAME: IFNAME,
  CNI_ARGS: {
    problem: (s) =>
      s.length > MAX_CNI_ARGS ? `Expected at most ${MAX_CNI_ARGS} characters` : undefined,
  },
  CNI_PATH: ANY_VALUE,
};

/**
 * The code-4 message naming every variable `verb` requires that is unset or empty
 * (runtimes pass `CNI_NETNS=` for a namespace that is gone), every variable it
 * reads whose value is malformed, and every other CNI variable too long for the
 * agent's API to carry (reason first, the value clipped); undefined when there is none.
 */
export function envProblem(
  verb: CniVerb,
  env: Record<string, string | undefined>,
): string | undefined {
  const problems: string[] = [];
  for (const name of CNI_ENV_NAMES) {
    if (name === "CNI_COMMAND") continue;
    const raw = env[name];
    const used = USED_ENV[verb].includes(name);
    if (raw === undefined || raw === "") {
      if (used && REQUIRED_ENV[verb].includes(name)) problems.push(`${name} is not set`);
      continue;
    }
    const why = (used ? ENV_RULES[name] : ANY_VALUE).problem(raw);
    if (why !== undefined) problems.push(`${name} is invalid: ${why}; got ${quote(raw, 300)}`);
  }
  if (problems.length === 0) return undefined;
  return `Invalid CNI environment for ${verb}: ${problems.join("; ")}`;
}

/** The CNI_ARGS keys enim understands. */
export const KNOWN_ARGS = [
  "K8S_POD_NAMESPACE",
  "K8S_POD_NAME",
  "K8S_POD_INFRA_CONTAINER_ID",
  "K8S_POD_UID",
  "IP",
  "IgnoreUnknown",
  "ENIM_PROFILE",
  "ENIM_SECURITY_GROUP_IDS",
  "ENIM_STICKY",
] as const;
/** A CNI_ARGS key enim understands. */
export type KnownArg = typeof KNOWN_ARGS[number];

/** The verbs whose CNI_ARGS names the pod and is refused when malformed (DEL ignores a bad one). */
export const ARGS_VERBS: readonly CniVerb[] = ["ADD", "CHECK"];

/**
 * Splits `CNI_ARGS` (`K=V;K=V`) as the reference plugins do (`pkg/types` LoadArgs):
 * every pair has exactly one `=` and a key; empty segments are skipped; `IgnoreUnknown`
 * is a boolean (1, 0, true, false, any case); a key enim does not know is refused
 * unless `IgnoreUnknown` is true. Returns the known pairs, or the code-4 message.
 */
export function splitCniArgs(
  raw: string,
): { ok: true; pairs: [KnownArg, string][] } | { ok: false; msg: string } {
  const bad = (msg: string) => ({ ok: false as const, msg: `Invalid CNI_ARGS: ${msg}` });
  const pairs: [string, string][] = [];
  for (const segment of raw.split(";")) {
    if (segment === "") continue;
    const kv = segment.split("=");
    if (kv.length !== 2 || kv[0] === "") {
      return bad(`a part is not a KEY=VALUE pair: ${quote(segment, 200)}`);
    }
    pairs.push([kv[0], kv[1]]);
  }
  let ignoreUnknown = false;
  for (const [k, v] of pairs) {
    if (k !== "IgnoreUnknown") continue;
    const b = v.toLowerCase();
    if (b !== "1" && b !== "true" && b !== "0" && b !== "false") {
      return bad(`${k} is not a boolean (1, 0, true or false): got ${quote(v)}`);
    }
    ignoreUnknown ||= b === "1" || b === "true";
  }
  const known: [KnownArg, string][] = [];
  const unknown: string[] = [];
  for (const [k, v] of pairs) {
    const name = KNOWN_ARGS.find((n) => n === k);
    if (name) known.push([name, v]);
    else unknown.push(k);
  }
  if (unknown.length > 0 && !ignoreUnknown) {
    return bad(
      `unknown keys (set IgnoreUnknown=1 to ignore them): ${
        listOf(unknown.map((k) => quote(k, 100)))
      }`,
    );
  }
  return { ok: true, pairs: known };
}

/** The spec's key for GC's list, and the one some texts of 1.1.0 name: a runtime sends one. */
export const GC_LIST_KEYS = ["cni.dev/valid-attachments", "cni.dev/attachments"] as const;

/** The code-7 message for a GC whose config carries neither of {@linkcode GC_LIST_KEYS}. */
export const GC_LIST_MISSING =
  'Invalid network config: GC requires "cni.dev/valid-attachments" (or "cni.dev/attachments")';

/** The lowest spec version that defines each verb. */
export const MIN_VERSION: Partial<Record<CniVerb, SupportedVersion>> = {
  CHECK: "0.4.0",
  GC: "1.1.0",
  STATUS: "1.1.0",
};

const VERSION_RE = /^(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?$/;

/** Splits a version string into numbers, or `undefined` when it is not `major.minor[.patch]`. */
function parseVersion(v: string): [number, number, number] | undefined {
  const m = VERSION_RE.exec(v);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)] : undefined;
}

/**
 * The known version whose result format serves `requested`: itself, or the newest
 * known patch of its major.minor (0.3.7 → 0.3.1, 1.0.10 → 1.0.0); undefined when
 * enim does not speak it.
 */
export function versionFormat(requested: string): SupportedVersion | undefined {
  const v = parseVersion(requested);
  if (!v) return undefined;
  const exact = SUPPORTED_VERSIONS.find((s) => s === requested);
  if (exact) return exact;
  return SUPPORTED_VERSIONS.filter((s) => {
    const k = parseVersion(s)!;
    return k[0] === v[0] && k[1] === v[1];
  }).at(-1);
}

/** The code-1 message for a version enim does not speak. */
export function incompatibleVersion(requested: string): string {
  return `Incompatible CNI version ${quote(requested)}: enim supports ${
    SUPPORTED_VERSIONS.join(", ")
  } (and later patch releases of those)`;
}

/** Whether `format` is at least `min` (both known versions). */
export function versionAtLeast(format: SupportedVersion, min: SupportedVersion): boolean {
  return SUPPORTED_VERSIONS.indexOf(format) >= SUPPORTED_VERSIONS.indexOf(min);
}

/** The code-1 message for a verb its version does not define (CHECK before 0.4.0, …), or undefined. */
export function verbVersionProblem(
  verb: CniVerb,
  requested: string,
  format: SupportedVersion,
): string | undefined {
  const min = MIN_VERSION[verb];
  if (!min || versionAtLeast(format, min)) return undefined;
  return `Incompatible CNI version ${quote(requested)} for ${verb}: it needs ${min} or later`;
}

/** A network's name (the config's `name`): the spec gives it the container id's rule. */
export const NETWORK_NAME: NameRule = CONTAINER_ID;

/** How zod's English locale names a JSON value's type ("expected string, received number"). */
function received(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
}

/** A JSON value as a message shows it: a string quoted and clipped, `null` for nothing. */
function shown(v: unknown): string {
  if (typeof v === "string") return quote(v);
  if (v === undefined || v === null) return "null";
  if (typeof v === "object") return Array.isArray(v) ? "an array" : "an object";
  return String(v);
}

/** The code-7 message for a config whose `type` and `ipam.type` are not "enim". */
export function notEnimMessage(config: Record<string, unknown>): string {
  const ipam = config.ipam;
  return `Invalid network config: neither "type" nor "ipam.type" is "enim" (type ${
    shown(config.type)
  }, ipam.type ${shown(isPlainObject(ipam) ? ipam.type : undefined)})`;
}

/** The code-2 message for an `ipam` of another type under enim as the interface plugin. */
export function foreignIpamMessage(ipamType: string): string {
  return `Unsupported field "ipam.type": ${
    quote(ipamType)
  }: as the interface plugin enim takes the addresses from the ENI and delegates no IPAM`;
}

/** A call refused whatever the agent would say: its CNI code and message. */
export interface SpecProblem {
  code: CniCode;
  msg: string;
}

/**
 * What is wrong with a call whatever the agent says, in the order the agent
 * checks it, or undefined:
 *
 * | what                                                          | code |
 * | ------------------------------------------------------------- | ---- |
 * | CNI_COMMAND missing or unknown; a required variable unset; CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS or CNI_ARGS malformed | 4 |
 * | stdin over 4 MiB                                              | 7    |
 * | stdin that is not a JSON object                               | 6    |
 * | a `cniVersion` enim does not speak                            | 1    |
 * | CHECK before 0.4.0, GC or STATUS before 1.1.0                 | 1    |
 * | a `cniVersion` or `name` that is no string, a malformed `name` | 7   |
 * | neither `type` nor `ipam.type` is "enim"                      | 7    |
 * | an `ipam` of another type under enim as the interface plugin  | 2    |
 * | GC without `cni.dev/valid-attachments` (or `cni.dev/attachments`) | 7 |
 * | ADD or CHECK whose CNI_ARGS is not `K=V;…`, has an unknown key without `IgnoreUnknown=1`, or a non-boolean `IgnoreUnknown` | 4 |
 *
 * Any CNI variable longer than the agent's API carries (128 KiB; CNI_ARGS 64 KiB)
 * is a 4 whatever the verb. DEL ignores a malformed CNI_ARGS (it must not fail on
 * what ADD would have refused), so a DEL's CNI_ARGS is checked for length only.
 *
 * VERSION has none past its verb. The one table for both sides: the plugin
 * process answers these itself before it asks the agent (`cni/forward.ts`), so a
 * runtime gets the same code and message whether the agent is up or down; the
 * agent's dispatcher (`cni/dispatch.ts`) checks them first too, for the API's
 * other callers (messages clipped to {@linkcode MESSAGE_CHARS}, as every CNI error is).
 *
 * @example
 * ```ts
 * specProblem({ CNI_COMMAND: "GC", CNI_PATH: "/opt/cni/bin" }, decodeStdin('{"cniVersion":"1.0.0"}'));
 * // { code: 1, msg: 'Incompatible CNI version "1.0.0" for GC: it needs 1.1.0 or later' }
 * ```
 */
export function specProblem(
  env: Record<string, string | undefined>,
  decoded: Decoded,
): SpecProblem | undefined {
  const found = firstProblem(env, decoded);
  return found && { code: found.code, msg: clip(found.msg, MESSAGE_CHARS) };
}

/** {@linkcode specProblem} before its message is clipped. */
function firstProblem(
  env: Record<string, string | undefined>,
  decoded: Decoded,
): SpecProblem | undefined {
  const verb = CNI_VERBS.find((v) => v === env.CNI_COMMAND);
  if (verb === undefined) {
    return { code: CNI_CODES.INVALID_ENV, msg: verbProblem(env.CNI_COMMAND)! };
  }
  if (verb === "VERSION") return undefined;
  const badEnv = envProblem(verb, env);
  if (badEnv) return { code: CNI_CODES.INVALID_ENV, msg: badEnv };
  if (decoded.chars > MAX_CALL_STDIN) {
    return {
      code: CNI_CODES.INVALID_CONFIG,
      msg:
        `Invalid network config: stdin has ${decoded.chars} characters, more than the ${MAX_CALL_STDIN} enim reads`,
    };
  }
  const undecodable = decodeFailure(verb, decoded);
  if (undecodable !== undefined || !decoded.ok || !isPlainObject(decoded.value)) {
    return {
      code: CNI_CODES.DECODE_FAILED,
      msg: undecodable ?? "Cannot decode the network config",
    };
  }
  const config = decoded.value;
  const v = config.cniVersion;
  if (typeof v === "string") {
    const format = versionFormat(v);
    if (!format) return { code: CNI_CODES.INCOMPATIBLE_VERSION, msg: incompatibleVersion(v) };
    const early = verbVersionProblem(verb, v, format);
    if (early) return { code: CNI_CODES.INCOMPATIBLE_VERSION, msg: early };
  }
  // As the config's schema words them (cni/config.ts), several at once.
  const fields: string[] = [];
  if (typeof v !== "string") {
    fields.push(`cniVersion: Invalid input: expected string, received ${received(v)}`);
  }
  const name = config.name;
  const badName = typeof name === "string"
    ? NETWORK_NAME.problem(name)
    : `Invalid input: expected string, received ${received(name)}`;
  if (badName !== undefined) fields.push(`name: ${badName}`);
  if (fields.length > 0) {
    return { code: CNI_CODES.INVALID_CONFIG, msg: `Invalid network config: ${fields.join("; ")}` };
  }
  if (!enimSection(config)) return { code: CNI_CODES.INVALID_CONFIG, msg: notEnimMessage(config) };
  const ipam = config.ipam;
  if (
    config.type === "enim" && isPlainObject(ipam) && typeof ipam.type === "string" &&
    ipam.type !== "enim"
  ) {
    return { code: CNI_CODES.UNSUPPORTED_FIELD, msg: foreignIpamMessage(ipam.type) };
  }
  if (verb === "GC" && GC_LIST_KEYS.every((k) => config[k] === undefined)) {
    return { code: CNI_CODES.INVALID_CONFIG, msg: GC_LIST_MISSING };
  }
  if (ARGS_VERBS.includes(verb)) {
    const args = splitCniArgs(env.CNI_ARGS ?? "");
    if (!args.ok) return { code: CNI_CODES.INVALID_ENV, msg: args.msg };
  }
  return undefined;
}

/**
 * enim's section of a decoded config: the object whose `type` is "enim" (the
 * top level in interface mode, `ipam` in IPAM mode), or undefined.
 */
export function enimSection(raw: Record<string, unknown>): Record<string, unknown> | undefined {
  if (raw.type === "enim") return raw;
  if (isPlainObject(raw.ipam) && raw.ipam.type === "enim") return raw.ipam;
  return undefined;
}

/** The one log line written per invocation. */
export interface InvocationRecord {
  verb: string | null;
  cniVersion?: string;
  network?: string;
  mode?: string;
  containerId?: string;
  ifName?: string;
  netns?: string;
  /** The pod, `namespace/name` ({@linkcode podKeyOf} in providers/schema.ts). */
  pod?: string;
  /** The pod's profile, when not `default`. */
  profile?: string;
  /** The host link's pod end, when the pod gets one. */
  hostLink?: string;
  eniId?: string;
  code: number;
  msg?: string;
  warnings?: string[];
  durationMs: number;
  /**
   * The enim version of the plugin process that answered alone (the agent unreachable):
   * which plugin answered during a rollout, when two are installed one after the other.
   */
  pluginVersion?: string;
}

/**
 * Writes a call's answer to stdout, and finishes its record: a stdout that is gone
 * (the runtime died or closed the pipe: nobody can read an error either) makes the
 * call an I/O failure. Returns the exit code, `exit` or 1.
 */
export function answer(
  write: (s: string) => void,
  out: string | undefined,
  exit: number,
  record: InvocationRecord,
  started: number,
): number {
  if (out !== undefined) {
    try {
      write(out);
    } catch (err) {
      record.code = CNI_CODES.IO_FAILURE;
      record.msg = `Cannot write to stdout: ${err instanceof Error ? err.message : String(err)}`;
      exit = 1;
    }
  }
  record.durationMs = Math.round((performance.now() - started) * 100) / 100;
  return exit;
}

/**
 * Whether a netns path exists (for the DEL rule when the agent is down): true, false
 * when it does not, undefined when that cannot be told (no permission, another error).
 */
export function statNetns(path: string): boolean | undefined {
  try {
    Deno.statSync(path);
    return true;
  } catch (err) {
    return err instanceof Deno.errors.NotFound ? false : undefined;
  }
}
