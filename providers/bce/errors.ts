/**
 * BCE error codes and what the provider does with them: retry (throttling,
 * server errors, an expired signature), give up (quota, auth, bad requests), or
 * learn that something is gone (and *what* is gone).
 *
 * Matching follows CCE: a case-insensitive substring match on the error text
 * (code and message together; CCE matches on the Go SDK's error string, which
 * also carries the request id, a UUID that can never contain these words). The
 * text is compared with spaces, `_`, `.` and `-` removed, so "Rate Limit",
 * "RATE_LIMIT" and "RateLimit" match alike.
 *
 * Every code below names the public source it comes from. Where no public
 * source gives a code (throttling on the ENI API, an ENI in the wrong state,
 * the ENI quota of an instance), the comment says so; the provider then never
 * relies on the code alone and re-reads the ENI to decide.
 *
 * Sources, by short name:
 * - CCE-v2: github.com/baidubce/baiducloud-cce-cni-driver, `cce-network-v2/pkg/bce/api/cloud/error.go`
 *   (ReasonForError) and its `error_test.go`, at f4fb339c (2025-03-31);
 * - CCE-v1: the same repository, branch `cce-network-v1`, `pkg/bce/cloud/error.go`;
 * - CCE-sync: the same repository, `cce-network-v2/pkg/bce/bcesync/eni.go` (eniStateMachine);
 * - SDK-go: github.com/baidubce/bce-sdk-go at 69163104 (2026-08-04), `bce/error.go`,
 *   `bce/response.go` (ParseResponse), `bce/retry.go`;
 * - SDK-java: github.com/baidubce/bce-sdk-java at 85e7b103, `src/main/java/com/baidubce/ErrorCode.java`
 *   and `src/test/java/com/baidubce/services/bcc/BccClientTest.java` (getInstanceNotExist);
 * - SDK-js: npm `@baiducloud/sdk@1.0.7`, `src/bce_base_client.js`;
 * - DOC-common: BCE's common error codes, https://cloud.baidu.com/doc/Reference/s/Bjz3uz3qj-en
 *   and https://cloud.baidu.com/doc/BCC/s/Ojwvyo6nc-en (code, message, HTTP status);
 * - CCE-v2.11: the same repository, branch `v2.11`, `cce-network-v2/pkg/bce/vpceni/node_bcc.go`
 *   (BCE's answer to an operation on an ENI in the wrong state: HTTP 400 `EniStatusException`,
 *   "The eni status is not allowed to operate");
 * - TF: github.com/baidubce/terraform-provider-baiducloud, `baiducloud/error.go` (the codes
 *   its NotFoundError treats as "the instance does not exist");
 * - DOC-ai: Baidu's AI search error codes, https://ai.baidu.com/ai-doc/AppBuilder/4m8sgh88y
 *   (HTTP 429 `RATE_LIMIT_TOTAL_QPS`; another Baidu product, the only Baidu page
 *   found that names a rate-limit code with its status).
 *
 * @module
 */
import { ProviderError, type ProviderErrorReason } from "../contract.ts";

/** The BCE operations the client calls (the names of bce-sdk-go's functions). */
export type BceOp =
  | "ListEni"
  | "GetEniDetail"
  | "GetEniStatus"
  | "CreateEni"
  | "AttachEni"
  | "DetachEni"
  | "DeleteEni"
  | "GetEniQuota"
  | "GetSubnet"
  | "GetInstance"
  | "UpdateEniSecurityGroup"
  | "UpdateEniEnterpriseSecurityGroup"
  | "UpdateEni";

/** What a not-found error says is missing. */
export type MissingTarget = "eni" | "instance" | "subnet" | "ambiguous";

/** How the provider treats one failed call. */
export interface Classification {
  reason: ProviderErrorReason;
  /** What is missing, for a not-found error; null when the error does not say something is. */
  missing: MissingTarget | null;
  /** Whether the same call may be sent again after a backoff. */
  retryable: boolean;
  /** A rate limit (retried with a longer backoff). */
  throttled: boolean;
}

/**
 * Substrings (normalized: lower case, no spaces, `_`, `.`, `-`) that mark a rate limit.
 * They are checked before the quota rule, which would otherwise take every `…LimitExceeded`.
 */
export const THROTTLE_MARKERS: readonly string[] = [
  // CCE-v1 and CCE-v2 ReasonForError: `RateLimit` → ErrorReasonRateLimit (the only
  // throttling marker CCE knows). DOC-ai's `RATE_LIMIT_TOTAL_QPS` normalizes to it too.
  "ratelimit",
  // SDK-go ParseResponse: an error response with an empty body gets the status text
  // without spaces as its code, so an HTTP 429 becomes `TooManyRequests`.
  "toomanyrequests",
  // No BCE source names these; they are the usual names of request-rate limits
  // elsewhere (e.g. Alibaba's `QpsLimitExceeded` with HTTP 429) and must never be
  // taken for a resource quota.
  "requestlimitexceeded",
  "qpslimit",
  "throttl",
];

/** Markers of a resource quota (not retried: waiting does not raise a quota). */
export const QUOTA_MARKERS: readonly string[] = [
  // CCE-v2 ReasonForError: `QuotaLimitExceeded`, or any `LimitExceeded` → ErrorReasonQuotaLimitExceeded.
  // No public source gives the exact code for "this instance cannot take more ENIs".
  "quotalimitexceeded",
  "limitexceeded",
  // CCE-v1/v2: `ExceedLimitException` → ErrorReasonBBCENIPrivateIPExceedLimit.
  "exceedlimitexception",
  // CCE-v1/v2: `VmMemoryCanNotAttachMoreIpException`.
  "vmmemorycannotattachmoreipexception",
];

/** CCE-v1/v2: `SubnetHasNoMoreIpException` → ErrorReasonSubnetHasNoMoreIP. */
export const SUBNET_FULL_MARKER = "subnethasnomoreipexception";
/** CCE-v1/v2: `PrivateIpInUseException` → ErrorReasonPrivateIPInUse. */
export const IP_IN_USE_MARKER = "privateipinuseexception";

/**
 * Codes that say the ENI does not exist, whatever the operation.
 * - `EniNotFoundException`: CCE-sync quotes BCE's answer to a detail call as
 *   `[Code: EniNotFoundException; Message: eni:eni-… resource not exist; …]` (no HTTP status given).
 * - `EniIdException`: CCE-v1/v2 map it to ErrorReasonENINotFound; CCE-v2's error_test.go shows
 *   it with HTTP 400 and the message "The param eniId is invalid".
 */
export const ENI_MISSING_MARKERS: readonly string[] = ["eninotfoundexception", "eniidexception"];

/**
 * `NoSuchObject` (DOC-common: 404 "The specified object is not found or resource do
 * not exist"; SDK-java: a detail call on an unknown instance answers 404 NoSuchObject;
 * CCE-sync treats NoSuchObject on the ENI detail and delete calls as "the ENI is gone").
 * It names no resource, so what is missing depends on what the call addressed.
 */
export const NO_SUCH_OBJECT = "nosuchobject";

/**
 * Codes that say an *instance* does not exist, whatever the call (TF `baiducloud/error.go`
 * NotFoundError: `InstanceNotExist`, `InstanceNotFound`, `InvalidInstanceId.NotFound`,
 * `Forbidden.InstanceNotFound`). Matched before the auth rule: `Forbidden.InstanceNotFound`
 * may come with HTTP 403, and it says the instance is gone, not that the key is wrong.
 */
export const INSTANCE_MISSING_CODES: readonly string[] = [
  "instancenotexist",
  "instancenotfound",
  "invalidinstanceidnotfound",
  "forbiddeninstancenotfound",
];

/**
 * The ENI is in a state that does not allow the operation: HTTP 400 `EniStatusException`
 * "The eni status is not allowed to operate" (CCE-v2.11). Not retried by the client: the
 * caller decides from the ENI's status (a new ENI not ready to attach yet is attached again,
 * `_lifecycle.ts`).
 */
export const ENI_STATUS_MARKER = "enistatusexception";

/**
 * Codes of a malformed request, never "gone" (DOC-common, SDK-go bce/error.go, SDK-java ErrorCode):
 * `InvalidURI` (400 "Could not parse the specified URI") and `InvalidVersion` (404 "The API
 * version specified was invalid").
 */
export const BAD_REQUEST_CODES: readonly string[] = ["invaliduri", "invalidversion"];

/** Authentication failures (DOC-common, SDK-go bce/error.go; SDK-js resends on `RequestTimeTooSkewed`). */
export const AUTH_CODES: readonly string[] = [
  "accessdenied",
  "invalidaccesskeyid",
  "signaturedoesnotmatch",
  "invalidhttpauthheader",
  "requestexpired",
  "requesttimetooskewed",
];

/**
 * Auth codes that a signature with a corrected time can cure (SDK-go retry.go retries
 * RequestExpired; SDK-js corrects its clock from the answer's `Date` on RequestTimeTooSkewed
 * and resends). The client resends once, with the clock corrected.
 */
export const RESIGN_CODES: readonly string[] = ["requestexpired", "requesttimetooskewed"];

/** Server errors worth a retry: SDK-go retry.go retries 500, 502, 503; 504 is a gateway timeout. */
export const RETRY_STATUSES: readonly number[] = [500, 502, 503, 504];

/** Lower case with spaces, `_`, `.`, `-` removed. */
export function normalizeErrorText(s: string): string {
  return s.toLowerCase().replace(/[\s_.\-]+/g, "");
}

/** What an ENI-addressed `NoSuchObject` means for each operation. */
function noSuchObjectTarget(op: BceOp): MissingTarget {
  switch (op) {
    case "GetEniDetail":
    case "GetEniStatus":
    case "DeleteEni":
      return "eni";
    case "GetInstance":
    case "GetEniQuota":
      return "instance";
    case "GetSubnet":
      return "subnet";
    default:
      // Attach and detach name the ENI and the instance; create names the subnet and
      // the security groups, and so do the group replacements. The caller re-reads the
      // ENI to tell.
      return "ambiguous";
  }
}

/**
 * Classifies one failed call. `status` 0 is a network failure or a timeout.
 *
 * @example
 * ```ts
 * classifyError({ status: 429, code: "TooManyRequests", message: "", op: "ListEni" }).throttled; // true
 * classifyError({ status: 404, code: "InvalidVersion", message: "", op: "DeleteEni" }).missing; // null
 * ```
 */
export function classifyError(
  e: { status: number; code: string; message: string; op: BceOp },
): Classification {
  const code = normalizeErrorText(e.code);
  const text = normalizeErrorText(`${e.code} ${e.message}`);
  const out = (
    reason: ProviderErrorReason,
    extra: Partial<Classification> = {},
  ): Classification => ({ reason, missing: null, retryable: false, throttled: false, ...extra });

  if (e.status === 0) return out("unavailable", { retryable: true });
  // HTTP 429 is "Too Many Requests" (RFC 6585), whatever the body says.
  if (e.status === 429 || THROTTLE_MARKERS.some((m) => text.includes(m))) {
    return out("throttled", { retryable: true, throttled: true });
  }
  if (INSTANCE_MISSING_CODES.includes(code)) return out("not_found", { missing: "instance" });
  if (AUTH_CODES.includes(code) || e.status === 401 || e.status === 403) {
    // RESIGN_CODES are not retried as such: the client corrects its clock and resends once.
    return out("auth_failed");
  }
  if (BAD_REQUEST_CODES.includes(code)) return out("other");
  if (ENI_MISSING_MARKERS.some((m) => text.includes(m))) {
    return out("not_found", { missing: "eni" });
  }
  if (code === NO_SUCH_OBJECT) return out("not_found", { missing: noSuchObjectTarget(e.op) });
  if (code === ENI_STATUS_MARKER) return out("wrong_state");
  if (text.includes(SUBNET_FULL_MARKER)) return out("subnet_full");
  if (text.includes(IP_IN_USE_MARKER)) return out("requested_ip_unavailable");
  if (QUOTA_MARKERS.some((m) => text.includes(m))) return out("quota_exceeded");
  if (RETRY_STATUSES.includes(e.status)) return out("unavailable", { retryable: true });
  if (e.status >= 500) return out("unavailable");
  // BCE says a wrong state with 400 EniStatusException (above); 409 Conflict is the
  // HTTP way to say it. Any other 4xx on attach, detach or delete makes the provider
  // re-read the ENI and decide from its status.
  if (e.status === 409) return out("wrong_state");
  return out("other");
}

/**
 * The code bce-sdk-go gives an error response whose body is empty (SDK-go
 * ParseResponse): 400 InvalidHTTPRequest, 403 AccessDenied, 412 PreconditionFailed,
 * 500 InternalError, else the status text without spaces (429 → `TooManyRequests`).
 */
export function codeForEmptyBody(status: number, statusText: string): string {
  switch (status) {
    case 400:
      return "InvalidHTTPRequest";
    case 403:
      return "AccessDenied";
    case 412:
      return "PreconditionFailed";
    case 500:
      return "InternalError";
  }
  const text = statusText.trim() || STATUS_TEXT[status] || "";
  const words = text.split(/\s+/).filter((w) => w !== "" && !/^\d+$/.test(w));
  return words.length ? words.join("") : `Http${status}`;
}

/** Status texts for the statuses fetch may report without one (HTTP/2 has none). */
const STATUS_TEXT: Record<number, string> = {
  401: "Unauthorized",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  429: "Too Many Requests",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
};

/** A failed BCE call: a {@linkcode ProviderError} plus the HTTP status, BCE code and classification. */
export class BceApiError extends ProviderError {
  /** The HTTP status, 0 for a network failure or timeout. */
  readonly status: number;
  /** BCE's error code (`NoSuchObject`, …), `""` when none. */
  readonly code: string;
  /** The operation that failed. */
  readonly op: BceOp;
  /** What is missing, for a not-found error. */
  readonly missing: MissingTarget | null;
  readonly retryable: boolean;
  readonly throttled: boolean;
  constructor(
    message: string,
    opts: {
      status: number;
      code: string;
      op: BceOp;
      classification: Classification;
      requestId?: string;
      cause?: unknown;
    },
  ) {
    super(opts.classification.reason, message, { requestId: opts.requestId, cause: opts.cause });
    this.name = "BceApiError";
    this.status = opts.status;
    this.code = opts.code;
    this.op = opts.op;
    this.missing = opts.classification.missing;
    this.retryable = opts.classification.retryable;
    this.throttled = opts.classification.throttled;
  }
}

/** Whether an error says the ENI itself no longer exists (and only that). */
export function isEniGone(err: unknown): boolean {
  return err instanceof BceApiError && err.missing === "eni";
}
