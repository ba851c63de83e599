/**
 * Every CNI error code the plugin can return, and the one function that maps
 * any thrown value to a CNI error object.
 *
 * Codes 1–99 are the spec's (SPEC.md, "Error"); enim's own start at 100.
 * Anything that is neither a {@linkcode CniError}, a zod error, an agent error
 * nor a Deno I/O error is a bug or an unforeseen failure and gets
 * {@linkcode CNI_CODES.INTERNAL} (110), never the Go libraries' 999.
 *
 * @module
 */
import { DEFAULT_SOCKET } from "../api/wire.ts";
import * as z from "zod/mini";
// By name: a run-time `z.core.$ZodError` would keep all of zod's core in the bundle.
import { $ZodError } from "zod/v4/core";
import "../lib/zod_locale.ts";
import { ApiError, type ApiErrorCode } from "../api/schema.ts";
import { AgentUnreachableError } from "../api/client.ts";
import { CNI_CODES, type CniCode, errorObject } from "./spec.ts";
import { userMessage } from "../lib/message.ts";
import { clip, listOf, MESSAGE_CHARS } from "../lib/clip.ts";

export { CNI_CODES, type CniCode };

/** The CNI error result printed on stdout (SPEC.md "Error"). */
export const CniErrorObjectSchema = z.strictObject({
  cniVersion: z.string(),
  code: z.number().check(z.int(), z.minimum(1)),
  msg: z.string().check(z.minLength(1)),
  details: z.optional(z.string()),
});
/** The CNI error result printed on stdout. */
export type CniErrorObject = z.infer<typeof CniErrorObjectSchema>;

/**
 * A failure with a known CNI code; thrown by the parsers and the dispatcher.
 *
 * @example
 * ```ts
 * throw new CniError(CNI_CODES.INVALID_ENV, 'CNI_IFNAME "a/b" contains \'/\'');
 * ```
 */
export class CniError extends Error {
  readonly code: number;
  readonly details?: string;
  constructor(code: number, msg: string, details?: string, options?: { cause?: unknown }) {
    super(msg, options);
    this.name = "CniError";
    this.code = code;
    this.details = details;
  }
}

/** How each agent API error code becomes a CNI error: code and the message's lead. */
const API_TO_CNI: Record<ApiErrorCode, { code: number; lead: string }> = {
  no_eni_available: {
    code: CNI_CODES.NO_ENI_AVAILABLE,
    lead: "No ENI available: the node's ENI pool is empty and no more ENIs can be attached",
  },
  requested_ip_unavailable: {
    code: CNI_CODES.REQUESTED_IP_UNAVAILABLE,
    lead: "No ENI carries the requested IP",
  },
  ifname_exists: {
    code: CNI_CODES.IFNAME_EXISTS,
    lead: "The interface name already exists in the pod",
  },
  netns_invalid: { code: CNI_CODES.INVALID_NETNS, lead: "Invalid network namespace" },
  check_failed: { code: CNI_CODES.CHECK_FAILED, lead: "CHECK failed" },
  not_allowed: {
    code: CNI_CODES.INVALID_CONFIG,
    lead: "The pod's ENI choice is not allowed on this node",
  },
  provider_error: { code: CNI_CODES.PROVIDER_ERROR, lead: "The cloud provider failed" },
  sticky_conflict: {
    code: CNI_CODES.STICKY_ELSEWHERE,
    lead: "The sticky pod's ENI is held elsewhere",
  },
  wrong_zone: { code: CNI_CODES.WRONG_ZONE, lead: "The sticky pod's ENI is in another zone" },
  device_error: { code: CNI_CODES.DEVICE_ERROR, lead: "Configuring the device failed" },
  busy: { code: CNI_CODES.TRY_AGAIN_LATER, lead: "The enim agent is busy; try again later" },
  // Its messages name NetworkPolicy and what the runtime does (retry) themselves.
  policy_unavailable: { code: CNI_CODES.TRY_AGAIN_LATER, lead: "" },
  policy_unenforceable: { code: CNI_CODES.POLICY_UNENFORCEABLE, lead: "" },
  state_unavailable: { code: CNI_CODES.IO_FAILURE, lead: "I/O failure" },
  not_found: { code: CNI_CODES.UNKNOWN_CONTAINER, lead: "Unknown container" },
  bad_request: { code: CNI_CODES.INVALID_CONFIG, lead: "The enim agent rejected the request" },
  internal: { code: CNI_CODES.INTERNAL, lead: "The enim agent failed" },
};

/** Formats zod issues as `path: message; path: message` (the first few, then how many more). */
export function formatZodIssues(error: $ZodError, prefix: (string | number)[] = []): string {
  return listOf(
    error.issues.map((i) => {
      const path = [...prefix, ...i.path.map((p) => String(p))].join(".");
      return path ? `${path}: ${i.message}` : i.message;
    }),
    5,
    "; ",
  );
}

/** Context for {@linkcode toCniError}: the verb decides what an unreachable agent means. */
export interface ErrorContext {
  /** The CNI verb being served (`STATUS` turns an unreachable agent into 50, others into 11). */
  verb?: string;
}

/** Deno's I/O error classes: a failure of one of them is a spec "I/O failure" (5). */
function isIoError(err: unknown): boolean {
  const e = Deno.errors;
  return [
    e.NotFound,
    e.PermissionDenied,
    e.NotCapable,
    e.BrokenPipe,
    e.UnexpectedEof,
    e.Interrupted,
    e.WriteZero,
    e.TimedOut,
    e.ConnectionReset,
    e.ConnectionRefused,
    e.Busy,
  ].some((cls) => err instanceof cls);
}

/**
 * Maps anything thrown while serving a CNI request to the CNI error object.
 *
 * @example
 * ```ts
 * const obj = toCniError(new AgentUnreachableError("/run/enim/enim.sock"), "1.1.0", { verb: "ADD" });
 * // obj.code === 11, obj.msg names the socket
 * ```
 */
export function toCniError(
  err: unknown,
  cniVersion: string,
  ctx: ErrorContext = {},
): CniErrorObject {
  // The last guard: whatever a message echoes, a runtime gets its reason and a bounded size.
  const make = (code: number, msg: string, details?: string): CniErrorObject =>
    errorObject(
      cniVersion,
      code,
      clip(msg, MESSAGE_CHARS),
      details === undefined ? undefined : clip(details, MESSAGE_CHARS),
    );
  if (err instanceof CniError) return make(err.code, err.message, err.details);
  if (err instanceof AgentUnreachableError) {
    if (ctx.verb === "STATUS") {
      return make(
        CNI_CODES.NOT_AVAILABLE,
        `The enim agent is not reachable at "${err.socketPath}": the plugin cannot serve ADD`,
        err.message,
      );
    }
    if (err.cause instanceof Deno.errors.NotCapable) {
      return make(
        CNI_CODES.TRY_AGAIN_LATER,
        `The enim agent is not reachable at "${err.socketPath}": the plugin's permissions do not allow that socket (only the default ${DEFAULT_SOCKET} is allowed)`,
        err.message,
      );
    }
    return make(
      CNI_CODES.TRY_AGAIN_LATER,
      `The enim agent is not reachable at "${err.socketPath}"; try again later`,
      err.message,
    );
  }
  if (err instanceof ApiError) {
    if (ctx.verb === "STATUS") {
      return make(
        CNI_CODES.NOT_AVAILABLE,
        `The enim agent cannot report its status: ${err.message}`,
        err.details,
      );
    }
    const m = API_TO_CNI[err.code] ?? API_TO_CNI.internal;
    return make(m.code, m.lead ? `${m.lead}: ${err.message}` : err.message, err.details);
  }
  // Any zod v4 error, zod/mini's or classic zod's (the BCE provider's).
  if (err instanceof $ZodError) {
    return make(CNI_CODES.INVALID_CONFIG, `Invalid network config: ${formatZodIssues(err)}`);
  }
  if (err instanceof SyntaxError) {
    return make(CNI_CODES.DECODE_FAILED, `Cannot decode the network config: ${err.message}`);
  }
  if (isIoError(err)) {
    return make(CNI_CODES.IO_FAILURE, `I/O failure: ${userMessage(err)}`);
  }
  const msg = userMessage(err);
  const details = err instanceof Error && err.stack ? err.stack : undefined;
  return make(CNI_CODES.INTERNAL, `Internal error in the enim plugin: ${msg}`, details);
}
