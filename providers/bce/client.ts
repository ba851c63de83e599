/**
 * The BCE ENI API client for exclusive mode (reference §1, §4): list, get,
 * create, attach, detach, delete, status, quota and subnet detail, every
 * response parsed with zod, every request signed with `bce-auth-v1`.
 *
 * Retries: network errors, 500/502/503/504, 429 and throttling (`RateLimit`),
 * `RequestExpired`/`RequestTimeTooSkewed` (re-signed each attempt), with
 * exponential backoff and full jitter, bounded by attempts and total time.
 * Writes carry the caller's clientToken so a retry cannot act twice.
 *
 * @module
 */
import { z } from "zod";
import { ProviderError, type ProviderErrorReason } from "../contract.ts";
import type { Logger } from "../../lib/log.ts";
import { bceTimestamp, type Credentials, type QueryPair, sign, wireQuery } from "./signer.ts";

/** One private IP of an ENI. */
export const BcePrivateIpSchema = z.object({
  privateIpAddress: z.string(),
  primary: z.boolean().default(false),
  publicIpAddress: z.string().nullish(),
});

/** An ENI as the BCE API returns it (§2.1). */
export const BceEniSchema = z.object({
  eniId: z.string().min(1),
  name: z.string().default(""),
  description: z.string().nullish(),
  zoneName: z.string().nullish(),
  instanceId: z.string().nullish(),
  macAddress: z.string().default(""),
  vpcId: z.string().nullish(),
  subnetId: z.string().default(""),
  status: z.string(),
  privateIpSet: z.array(BcePrivateIpSchema).nullish().transform((v) => v ?? []),
  ipv6PrivateIpSet: z.array(BcePrivateIpSchema).nullish().transform((v) => v ?? []),
  securityGroupIds: z.array(z.string()).nullish(),
  enterpriseSecurityGroupIds: z.array(z.string()).nullish(),
  createdTime: z.string().nullish(),
  networkInterfaceTrafficMode: z.string().nullish(),
});
/** An ENI as the BCE API returns it. */
export type BceEni = z.infer<typeof BceEniSchema>;

const ListResultSchema = z.object({
  enis: z.array(BceEniSchema).nullish().transform((v) => v ?? []),
  marker: z.string().nullish(),
  isTruncated: z.boolean().default(false),
  nextMarker: z.string().nullish(),
  maxKeys: z.number().nullish(),
});
const CreateResultSchema = z.object({ eniId: z.string().min(1) });
const StatusResultSchema = z.object({ status: z.string() });
const QuotaResultSchema = z.object({
  totalQuantity: z.number().int(),
  availableQuantity: z.number().int(),
});
/** A subnet's detail (`GET /v1/subnet/{id}`; shape per the VPC API, UNVERIFIED against live BCE). */
export const BceSubnetSchema = z.object({
  subnetId: z.string(),
  cidr: z.string(),
  ipv6Cidr: z.string().nullish(),
  zoneName: z.string().nullish(),
  vpcId: z.string().nullish(),
});
/** A subnet's detail. */
export type BceSubnet = z.infer<typeof BceSubnetSchema>;
const SubnetResultSchema = z.object({ subnet: BceSubnetSchema });
const ErrorBodySchema = z.object({
  code: z.string().default(""),
  message: z.string().default(""),
  requestId: z.string().nullish(),
});

/** A failed BCE call: a {@linkcode ProviderError} plus the HTTP status and BCE code. */
export class BceApiError extends ProviderError {
  /** The HTTP status, 0 for a network failure or timeout. */
  readonly status: number;
  /** BCE's error code (`NoSuchObject`, …), `""` when none. */
  readonly code: string;
  constructor(
    reason: ProviderErrorReason,
    message: string,
    opts: { status: number; code: string; requestId?: string; cause?: unknown },
  ) {
    super(reason, message, { requestId: opts.requestId, cause: opts.cause });
    this.name = "BceApiError";
    this.status = opts.status;
    this.code = opts.code;
  }
}

/** Maps a BCE error (status and code) to a provider reason (§4.2; substring match as CCE does). */
export function reasonFor(status: number, code: string): ProviderErrorReason {
  const c = code.toLowerCase();
  if (c.includes("ratelimit") || status === 429) return "throttled";
  if (
    c.includes("accessdenied") || c.includes("invalidaccesskeyid") ||
    c.includes("signaturedoesnotmatch") || c.includes("requestexpired") ||
    c.includes("requesttimetooskewed") || c.includes("invalidhttpauthheader") ||
    status === 401 || status === 403
  ) return "auth_failed";
  if (
    c.includes("nosuchobject") || c.includes("eninotfoundexception") ||
    c.includes("eniidexception") || status === 404
  ) return "not_found";
  if (c.includes("subnethasnomoreip")) return "subnet_full";
  if (c.includes("privateipinuse")) return "requested_ip_unavailable";
  if (
    c.includes("limitexceeded") || c.includes("exceedlimit") ||
    c.includes("cannotattachmore")
  ) return "quota_exceeded";
  if (
    c.includes("status") || c.includes("state") || c.includes("conflict") || status === 409
  ) return "wrong_state";
  if (status >= 500 || status === 0) return "unavailable";
  return "other";
}

/** Retry and timeout settings. */
export interface RetryOptions {
  /** Attempts per call, the first included. */
  maxAttempts: number;
  /** First backoff, doubled per retry, with full jitter. */
  baseDelayMs: number;
  maxDelayMs: number;
  /** Total time a call may take, retries included. */
  totalTimeoutMs: number;
  /** Timeout of one HTTP request. */
  requestTimeoutMs: number;
}

/** The defaults: 5 attempts, 1 s doubling to 10 s, 60 s in total, 20 s per request. */
export const DEFAULT_RETRY: RetryOptions = {
  maxAttempts: 5,
  baseDelayMs: 1000,
  maxDelayMs: 10_000,
  totalTimeoutMs: 60_000,
  requestTimeoutMs: 20_000,
};

/** Options of {@linkcode BceClient}. */
export interface BceClientOptions {
  /** `https://bcc.<region>.baidubce.com` or an override (tests: `http://127.0.0.1:<port>`). */
  endpoint: string;
  /** Credentials, or a function that returns the current ones (rotation). */
  credentials: Credentials | (() => Credentials);
  retry?: Partial<RetryOptions>;
  log: Logger;
  /** The clock used for signatures (tests skew it). */
  now?: () => Date;
  expirationSeconds?: number;
}

/** Arguments of {@linkcode BceClient.createEni}. */
export interface CreateEniArgs {
  name: string;
  subnetId: string;
  securityGroupIds: string[];
  enterpriseSecurityGroupIds: string[];
  /** A fixed primary IPv4, or undefined for auto-assignment. */
  privateIpAddress?: string;
  description?: string;
}

/** Filters of {@linkcode BceClient.listEnis}. */
export interface ListEnisArgs {
  vpcId: string;
  instanceId?: string;
  /** Server-side `name` filter and client-side prefix match (the server may match fuzzily). */
  namePrefix?: string;
  privateIpAddresses?: string[];
  maxKeys?: number;
}

interface Call {
  method: "GET" | "POST" | "PUT" | "DELETE";
  path: string;
  query?: QueryPair[];
  body?: unknown;
  /** The operation name for logs and errors. */
  op: string;
}

/** The ENI API client. */
export class BceClient {
  readonly endpoint: URL;
  #creds: () => Credentials;
  #retry: RetryOptions;
  #log: Logger;
  #now: () => Date;
  #expiration: number;
  #closed = new AbortController();

  constructor(opts: BceClientOptions) {
    this.endpoint = new URL(opts.endpoint);
    const c = opts.credentials;
    this.#creds = typeof c === "function" ? c : () => c;
    this.#retry = { ...DEFAULT_RETRY, ...opts.retry };
    this.#log = opts.log;
    this.#now = opts.now ?? (() => new Date());
    this.#expiration = opts.expirationSeconds ?? 1800;
  }

  /** Aborts in-flight requests and backoff waits. */
  close(): void {
    this.#closed.abort(new Error("BCE client closed"));
  }

  /** Every standard ENI matching the filters, all pages read. */
  async listEnis(args: ListEnisArgs): Promise<BceEni[]> {
    const out: BceEni[] = [];
    let marker = "";
    for (let page = 0; page < 10_000; page++) {
      const query: QueryPair[] = [["vpcId", args.vpcId]];
      if (args.instanceId) query.push(["instanceId", args.instanceId]);
      if (args.namePrefix) query.push(["name", args.namePrefix]);
      if (args.privateIpAddresses?.length) {
        query.push(["privateIpAddress", args.privateIpAddresses.join(",")]);
      }
      if (marker) query.push(["marker", marker]);
      query.push(["maxKeys", String(args.maxKeys ?? 1000)]);
      const res = ListResultSchema.parse(
        await this.#call({ method: "GET", path: "/v1/eni", query, op: "ListEni" }),
      );
      for (const eni of res.enis) {
        const mode = eni.networkInterfaceTrafficMode ?? "standard";
        if (mode !== "standard") continue;
        if (args.namePrefix && !eni.name.startsWith(args.namePrefix)) continue;
        if (args.instanceId && eni.instanceId && eni.instanceId !== args.instanceId) continue;
        out.push(eni);
      }
      if (!res.isTruncated || !res.nextMarker) break;
      marker = res.nextMarker;
    }
    return out;
  }

  /** One ENI's detail. */
  async getEni(eniId: string): Promise<BceEni> {
    return BceEniSchema.parse(
      await this.#call({ method: "GET", path: `/v1/eni/${eniId}`, op: "GetEniDetail" }),
    );
  }

  /** One ENI's status (`available`, `attaching`, `inuse`, `detaching`). */
  async eniStatus(eniId: string): Promise<string> {
    return StatusResultSchema.parse(
      await this.#call({ method: "GET", path: `/v1/eni/${eniId}/status`, op: "GetEniStatus" }),
    ).status;
  }

  /** Creates an ENI; the same clientToken on every retry (and after a restart) makes it once. */
  async createEni(args: CreateEniArgs, clientToken: string): Promise<string> {
    const body = {
      name: args.name,
      subnetId: args.subnetId,
      securityGroupIds: args.securityGroupIds ?? [],
      enterpriseSecurityGroupIds: args.enterpriseSecurityGroupIds ?? [],
      privateIpSet: [{
        publicIpAddress: "",
        primary: true,
        privateIpAddress: args.privateIpAddress ?? "",
      }],
      description: args.description ?? "",
    };
    return CreateResultSchema.parse(
      await this.#call({
        method: "POST",
        path: "/v1/eni",
        query: [["clientToken", clientToken]],
        body,
        op: "CreateEni",
      }),
    ).eniId;
  }

  /** Attaches an ENI to an instance (`PUT /v1/eni/{id}?attach`). */
  async attachEni(eniId: string, instanceId: string, clientToken: string): Promise<void> {
    await this.#call({
      method: "PUT",
      path: `/v1/eni/${eniId}`,
      query: [["attach", null], ["clientToken", clientToken]],
      body: { instanceId },
      op: "AttachEni",
    });
  }

  /** Detaches an ENI from an instance (`PUT /v1/eni/{id}?detach`). */
  async detachEni(eniId: string, instanceId: string, clientToken: string): Promise<void> {
    await this.#call({
      method: "PUT",
      path: `/v1/eni/${eniId}`,
      query: [["detach", null], ["clientToken", clientToken]],
      body: { instanceId },
      op: "DetachEni",
    });
  }

  /** Deletes an available ENI. */
  async deleteEni(eniId: string, clientToken: string): Promise<void> {
    await this.#call({
      method: "DELETE",
      path: `/v1/eni/${eniId}`,
      query: [["clientToken", clientToken]],
      op: "DeleteEni",
    });
  }

  /** The ENI quota of an instance (`GET /v1/eni/quota`, SDK-only, UNVERIFIED). */
  async eniQuota(
    instanceId: string,
  ): Promise<{ totalQuantity: number; availableQuantity: number }> {
    return QuotaResultSchema.parse(
      await this.#call({
        method: "GET",
        path: "/v1/eni/quota",
        query: [["instanceId", instanceId]],
        op: "GetEniQuota",
      }),
    );
  }

  /** A subnet's detail (CIDR, for prefix length and gateway). */
  async getSubnet(subnetId: string): Promise<BceSubnet> {
    return SubnetResultSchema.parse(
      await this.#call({ method: "GET", path: `/v1/subnet/${subnetId}`, op: "GetSubnet" }),
    ).subnet;
  }

  /** One logical call: signs and sends, retrying what is retryable. */
  async #call(call: Call): Promise<unknown> {
    const r = this.#retry;
    const started = Date.now();
    const deadline = started + r.totalTimeoutMs;
    let attempt = 0;
    for (;;) {
      attempt++;
      let err: BceApiError;
      try {
        return await this.#once(call, Math.min(r.requestTimeoutMs, deadline - Date.now()));
      } catch (e) {
        if (!(e instanceof BceApiError)) throw e;
        err = e;
      }
      const retryable = isRetryable(err);
      const delay = Math.min(r.maxDelayMs, r.baseDelayMs * 2 ** (attempt - 1)) *
        (0.5 + Math.random() / 2);
      if (
        !retryable || attempt >= r.maxAttempts || Date.now() + delay >= deadline ||
        this.#closed.signal.aborted
      ) {
        if (retryable && attempt > 1) {
          this.#log.warn("BCE call failed after retries", {
            op: call.op,
            attempts: attempt,
            code: err.code,
            status: err.status,
            requestId: err.requestId,
          });
        }
        throw err;
      }
      this.#log.info("BCE call failed, retrying", {
        op: call.op,
        attempt,
        delayMs: Math.round(delay),
        code: err.code,
        status: err.status,
        requestId: err.requestId,
      });
      await sleep(delay, this.#closed.signal);
    }
  }

  async #once(call: Call, timeoutMs: number): Promise<unknown> {
    const creds = this.#creds();
    const query = call.query ?? [];
    const qs = wireQuery(query);
    const url = new URL(call.path + (qs ? "?" + qs : ""), this.endpoint);
    const timestamp = bceTimestamp(this.#now());
    const headers: Record<string, string> = {
      host: url.host,
      "x-bce-date": timestamp,
    };
    const body = call.body === undefined ? undefined : JSON.stringify(call.body);
    if (body !== undefined) headers["content-type"] = "application/json;charset=utf-8";
    if (creds.sessionToken) headers["x-bce-security-token"] = creds.sessionToken;
    const { authorization } = sign({
      method: call.method,
      path: call.path,
      query,
      headers,
      accessKeyId: creds.accessKeyId,
      secretAccessKey: creds.secretAccessKey,
      timestamp,
      expirationSeconds: this.#expiration,
      headersToSign: Object.keys(headers),
    });
    const sendHeaders = new Headers(headers);
    sendHeaders.delete("host");
    sendHeaders.set("authorization", authorization);

    const ac = new AbortController();
    const timer = setTimeout(
      () => ac.abort(new Error(`Timed out after ${timeoutMs} ms`)),
      Math.max(1, timeoutMs),
    );
    const onClose = () => ac.abort(this.#closed.signal.reason);
    this.#closed.signal.addEventListener("abort", onClose, { once: true });
    const where = `${call.op} ${call.method} ${call.path}`;
    try {
      let status: number;
      let text: string;
      let requestId: string | undefined;
      try {
        const res = await fetch(url, {
          method: call.method,
          headers: sendHeaders,
          body,
          signal: ac.signal,
        });
        status = res.status;
        requestId = res.headers.get("x-bce-request-id") ?? undefined;
        text = await res.text();
      } catch (e) {
        const why = ac.signal.aborted ? String(ac.signal.reason?.message ?? "aborted") : errText(e);
        throw new BceApiError("unavailable", `BCE ${where} failed: ${why}`, {
          status: 0,
          code: "",
          cause: e,
        });
      }
      if (status >= 200 && status < 300) {
        if (text.trim() === "") return {};
        try {
          return JSON.parse(text);
        } catch (e) {
          throw new BceApiError("other", `BCE ${where} returned malformed JSON`, {
            status,
            code: "MalformedJSON",
            requestId,
            cause: e,
          });
        }
      }
      let code = "";
      let message = "";
      try {
        const parsed = ErrorBodySchema.safeParse(JSON.parse(text));
        if (parsed.success) {
          code = parsed.data.code;
          message = parsed.data.message;
          requestId = parsed.data.requestId ?? requestId;
        }
      } catch {
        // Not JSON: guess the code from the status, as the Go SDK does.
      }
      if (!code) {
        code = status === 400
          ? "InvalidHTTPRequest"
          : status === 403
          ? "AccessDenied"
          : status === 500
          ? "InternalError"
          : `Http${status}`;
      }
      const reason = reasonFor(status, code);
      const authNote = reason === "auth_failed"
        ? ` (access key id "${creds.accessKeyId}"; check the credentials and the clock)`
        : "";
      const msg = `BCE ${where} failed: HTTP ${status} ${code}: ${
        scrub(message, creds)
      }${authNote} [requestId ${requestId ?? "none"}]`;
      throw new BceApiError(reason, msg, { status, code, requestId });
    } finally {
      clearTimeout(timer);
      this.#closed.signal.removeEventListener("abort", onClose);
    }
  }
}

/** Whether a failed attempt may be retried. */
export function isRetryable(err: BceApiError): boolean {
  if (err.status === 0) return true;
  if ([500, 502, 503, 504, 429].includes(err.status)) return true;
  const c = err.code.toLowerCase();
  return c.includes("ratelimit") || c === "requestexpired" || c === "requesttimetooskewed";
}

/** Removes secrets a server might echo back in a message. */
function scrub(message: string, creds: Credentials): string {
  let out = message;
  for (const s of [creds.secretAccessKey, creds.sessionToken]) {
    if (s) out = out.split(s).join("[redacted]");
  }
  return out.replace(/bce-auth-v1\/\S+/g, "[redacted]");
}

function errText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/** Waits `ms`, or less when `signal` aborts (then resolves, never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
