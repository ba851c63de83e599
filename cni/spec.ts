/**
 * The parts of the CNI protocol that the plugin process itself needs: the
 * verbs and variable names, the spec versions, the error codes, decoding
 * stdin, the VERSION answer and the error object's shape.
 *
 * This module imports only the wire constants (`api/wire.ts`), on purpose: the
 * plugin process (`cni/forward.ts`) loads only these, `lib/http1.ts` and itself, so that every
 * CNI call costs little more than Deno's own start-up. Everything that needs a
 * schema (the network config, CNI_ARGS, results, the agent's API) runs in the
 * agent, where the schemas are already compiled; `cni/dispatch.ts` builds on
 * this module, so both sides answer with the same codes and messages.
 *
 * @module
 */
import type { CniEnvName } from "../api/wire.ts";

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

/** The stdin document, decoded once. */
export type Decoded = { ok: true; value: unknown } | { ok: false; empty: boolean; error: string };

/** Decodes stdin as JSON, remembering whether it was empty. */
export function decodeStdin(stdin: string): Decoded {
  if (stdin.trim() === "") return { ok: false, empty: true, error: "stdin is empty" };
  try {
    return { ok: true, value: JSON.parse(stdin) };
  } catch (err) {
    return { ok: false, empty: false, error: err instanceof Error ? err.message : String(err) };
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
    return `CNI_COMMAND "${raw}" is not one of ${CNI_VERBS.join(", ")}`;
  }
  return undefined;
}

/**
 * The code-4 message naming the variables `verb` requires that are unset or
 * empty (runtimes pass `CNI_NETNS=` for a namespace that is gone), or undefined.
 */
export function missingEnv(
  verb: string | undefined,
  env: Record<string, string | undefined>,
): string | undefined {
  const required = REQUIRED_ENV[verb as CniVerb] ?? [];
  const missing = required.filter((n) => env[n] === undefined || env[n] === "");
  if (missing.length === 0) return undefined;
  return `Invalid CNI environment for ${verb}: ${missing.map((n) => `${n} is not set`).join("; ")}`;
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
