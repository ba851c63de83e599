/**
 * The BCE ENI API client for exclusive mode (reference §1, §4): list, get,
 * create, attach, detach, delete, status, quota, subnet and instance detail,
 * replacing an ENI's security groups and setting its description,
 * every response parsed with zod, every request signed with `bce-auth-v1`.
 *
 * Retries (classification in `errors.ts`): network errors, 500/502/503/504 and
 * throttling (HTTP 429 and the rate-limit codes), with exponential backoff and
 * full jitter, bounded by attempts and total time. `RequestExpired` /
 * `RequestTimeTooSkewed` say this machine's clock is off: the client takes the
 * server's time from the answer's `Date` header, keeps the difference for every
 * later signature, and sends the call once more at once (the JS SDK corrects its
 * clock the same way: `@baiducloud/sdk` src/bce_base_client.js); a second such
 * answer fails the call. A throttled call waits
 * at least twice as long as a failed one, and at least what `Retry-After` asks.
 * Quota, auth and bad-request errors are never retried. Writes carry the
 * caller's clientToken, so a retry cannot act twice.
 *
 * The client counts the requests it sends, per operation ({@linkcode BceClient.calls}):
 * the provider's status shows them and the budget test reads them.
 *
 * Why one file: `BceClient` is one class whose operations (a few lines each) all go
 * through its one call machinery (sign, send, classify, retry, count); the wire
 * schemas are in `wire.ts`.
 *
 * @module
 */
import { sleep } from "../../lib/async.ts";
import type { Logger } from "../../lib/log.ts";
import { bceTimestamp, type Credentials, type QueryPair, sign, wireQuery } from "./signer.ts";
import {
  BceApiError,
  type BceOp,
  classifyError,
  codeForEmptyBody,
  normalizeErrorText,
  RESIGN_CODES,
} from "./errors.ts";
import {
  type BceEni,
  BceEniSchema,
  type BceInstance,
  type BceSubnet,
  type CreateEniArgs,
  CreateResultSchema,
  ErrorBodySchema,
  InstanceResultSchema,
  type ListEnisArgs,
  ListResultSchema,
  QuotaResultSchema,
  StatusResultSchema,
  SubnetResultSchema,
  type UpdateEniArgs,
} from "./wire.ts";

export * from "./wire.ts";

/** Retry and timeout settings. */
export interface RetryOptions {
  /** Attempts per call, the first included. */
  maxAttempts: number;
  /** First backoff, doubled per retry, with full jitter (twice that after throttling). */
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
  /** The jitter source, in [0, 1) (tests seed it). */
  random?: () => number;
}

interface Call {
  method: "GET" | "POST" | "PUT" | "DELETE";
  path: string;
  query?: QueryPair[];
  body?: unknown;
  op: BceOp;
}

/** The ENI API client. */
export class BceClient {
  readonly endpoint: URL;
  /** Requests sent so far (retries included), by operation. */
  readonly calls: Map<BceOp, number> = new Map();
  #creds: () => Credentials;
  #retry: RetryOptions;
  #log: Logger;
  #now: () => Date;
  #random: () => number;
  #expiration: number;
  #closed = new AbortController();
  /** How far the server's clock is ahead of `now` (ms), learnt from a `Date` header. */
  #clockOffsetMs = 0;

  constructor(opts: BceClientOptions) {
    this.endpoint = new URL(opts.endpoint);
    const c = opts.credentials;
    this.#creds = typeof c === "function" ? c : () => c;
    this.#retry = { ...DEFAULT_RETRY, ...opts.retry };
    this.#log = opts.log;
    this.#now = opts.now ?? (() => new Date());
    this.#random = opts.random ?? Math.random;
    this.#expiration = opts.expirationSeconds ?? 1800;
  }

  /** Aborts in-flight requests and backoff waits. */
  close(): void {
    this.#closed.abort(new Error("BCE client closed"));
  }

  /** How far the server's clock is ahead of this machine's, as last corrected (ms). */
  get clockOffsetMs(): number {
    return this.#clockOffsetMs;
  }

  /** Requests sent so far, by operation, as a plain object. */
  callCounts(): Record<string, number> {
    return Object.fromEntries([...this.calls].sort(([a], [b]) => (a < b ? -1 : 1)));
  }

  /** Every standard ENI matching the filters, all pages read. */
  async listEnis(args: ListEnisArgs): Promise<BceEni[]> {
    const out: BceEni[] = [];
    let marker = "";
    for (let page = 0; page < 10_000; page++) {
      const query: QueryPair[] = [["vpcId", args.vpcId]];
      if (args.instanceId) query.push(["instanceId", args.instanceId]);
      if (args.name) query.push(["name", args.name]);
      if (marker) query.push(["marker", marker]);
      query.push(["maxKeys", String(args.maxKeys ?? 1000)]);
      const res = ListResultSchema.parse(
        await this.#call({ method: "GET", path: "/v1/eni", query, op: "ListEni" }),
      );
      for (const raw of res.enis) {
        // Each entry alone: another tool's ENI that cannot be read is skipped and
        // logged, never the whole list failed for it.
        const parsed = BceEniSchema.safeParse(raw);
        if (!parsed.success) {
          this.#log.warn("Skipped an ENI of the list that cannot be read", {
            eniId: entryId(raw),
            problem: parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; "),
          });
          continue;
        }
        const eni = parsed.data;
        // Standard ENIs only, as Baidu's CNI keeps them: the traffic mode compared
        // case-insensitively to "standard", and an entry without one dropped
        // (cce-network-v2/pkg/bce/api/eni/client.go isEni, strings.EqualFold).
        const mode = eni.networkInterfaceTrafficMode ?? "";
        if (mode.toLowerCase() !== "standard") continue;
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
    const body: Record<string, unknown> = {
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
    // IPv6 entries are all secondary; "" asks for an automatic address (reference §1.2,
    // bce-sdk-go services/eni/model.go CreateEniArgs.Ipv6PrivateIpSet).
    if (args.ipv6) {
      body.ipv6PrivateIpSet = [{
        publicIpAddress: "",
        primary: false,
        privateIpAddress: typeof args.ipv6 === "string" ? args.ipv6 : "",
      }];
    }
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

  /**
   * Replaces the ENI's groups with these regular groups (`PUT /v1/eni/{id}?bindSg`,
   * body `securityGroupIds`): BCE removes every other group, regular or enterprise,
   * and keeps at least one (reference §1.2; BCE doc "弹性网卡更新普通安全组").
   */
  async bindSecurityGroups(
    eniId: string,
    securityGroupIds: string[],
    clientToken: string,
  ): Promise<void> {
    await this.#call({
      method: "PUT",
      path: `/v1/eni/${eniId}`,
      query: [["bindSg", null], ["clientToken", clientToken]],
      body: { securityGroupIds },
      op: "UpdateEniSecurityGroup",
    });
  }

  /**
   * Replaces the ENI's groups with these enterprise groups (`PUT /v1/eni/{id}?bindEsg`,
   * body `enterpriseSecurityGroupIds`): BCE removes every other group, regular or
   * enterprise (bce-sdk-go UpdateEniEnterpriseSecurityGroup; BCE doc "弹性网卡更新企业安全组").
   */
  async bindEnterpriseSecurityGroups(
    eniId: string,
    enterpriseSecurityGroupIds: string[],
    clientToken: string,
  ): Promise<void> {
    await this.#call({
      method: "PUT",
      path: `/v1/eni/${eniId}`,
      query: [["bindEsg", null], ["clientToken", clientToken]],
      body: { enterpriseSecurityGroupIds },
      op: "UpdateEniEnterpriseSecurityGroup",
    });
  }

  /**
   * Sets the ENI's description (`PUT /v1/eni/{id}?modifyAttribute`, body `name`,
   * `description`). BCE's doc marks both optional but not both empty; the name is
   * sent when known, unchanged, so the marker survives whatever BCE makes of an
   * absent one (bce-sdk-go UpdateEni always sends both).
   */
  async updateEni(eniId: string, args: UpdateEniArgs, clientToken: string): Promise<void> {
    await this.#call({
      method: "PUT",
      path: `/v1/eni/${eniId}`,
      query: [["modifyAttribute", null], ["clientToken", clientToken]],
      body: {
        ...(args.name !== undefined ? { name: args.name } : {}),
        description: args.description,
      },
      op: "UpdateEni",
    });
  }

  /** Deletes an ENI (BCE accepts it only when the ENI is `available`). */
  async deleteEni(eniId: string, clientToken: string): Promise<void> {
    await this.#call({
      method: "DELETE",
      path: `/v1/eni/${eniId}`,
      query: [["clientToken", clientToken]],
      op: "DeleteEni",
    });
  }

  /** The ENI quota of an instance (`GET /v1/eni/quota`, bce-sdk-go only, meaning UNVERIFIED). */
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

  /** An instance's detail (`GET /v2/instance/{id}?isDeploySet=false`). */
  async getInstance(instanceId: string): Promise<BceInstance> {
    return InstanceResultSchema.parse(
      await this.#call({
        method: "GET",
        path: `/v2/instance/${instanceId}`,
        query: [["isDeploySet", "false"]],
        op: "GetInstance",
      }),
    ).instance;
  }

  /** A subnet's detail (CIDRs, for prefix lengths and gateways). */
  async getSubnet(subnetId: string): Promise<BceSubnet> {
    return SubnetResultSchema.parse(
      await this.#call({ method: "GET", path: `/v1/subnet/${subnetId}`, op: "GetSubnet" }),
    ).subnet;
  }

  /** One logical call: signs and sends, retrying what is retryable. */
  async #call(call: Call): Promise<unknown> {
    const r = this.#retry;
    const deadline = Date.now() + r.totalTimeoutMs;
    let attempt = 0;
    let resigned = false;
    for (;;) {
      attempt++;
      let err: BceApiError;
      let retryAfterMs = 0;
      try {
        return await this.#once(call, Math.min(r.requestTimeoutMs, deadline - Date.now()));
      } catch (e) {
        if (!(e instanceof BceApiError)) throw e;
        err = e;
        retryAfterMs = RETRY_AFTER.get(e) ?? 0;
      }
      if (RESIGN_CODES.includes(normalizeErrorText(err.code)) && !resigned) {
        // The signature's time is off: correct the clock from the server's Date, once.
        resigned = true;
        const offset = SERVER_OFFSET.get(err);
        if (offset !== undefined) {
          this.#log.warn("BCE says the request time is off; correcting the clock by its Date", {
            op: call.op,
            code: err.code,
            offsetMs: Math.round(offset),
            previousOffsetMs: Math.round(this.#clockOffsetMs),
          });
          this.#clockOffsetMs = offset;
        }
        if (!this.#closed.signal.aborted && Date.now() < deadline) continue;
      }
      // Full jitter over an exponential ceiling; throttling doubles the base.
      const base = err.throttled ? 2 * r.baseDelayMs : r.baseDelayMs;
      const ceiling = Math.min(r.maxDelayMs, base * 2 ** (attempt - 1));
      const delay = Math.max(retryAfterMs, ceiling * (0.5 + this.#random() / 2));
      if (
        !err.retryable || attempt >= r.maxAttempts || Date.now() + delay >= deadline ||
        this.#closed.signal.aborted
      ) {
        if (err.retryable && attempt > 1) {
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
      this.#log.info(
        err.throttled ? "BCE call throttled, backing off" : "BCE call failed, retrying",
        {
          op: call.op,
          attempt,
          delayMs: Math.round(delay),
          code: err.code,
          status: err.status,
          requestId: err.requestId,
        },
      );
      await sleep(delay, this.#closed.signal);
    }
  }

  async #once(call: Call, timeoutMs: number): Promise<unknown> {
    const creds = this.#creds();
    const query = call.query ?? [];
    const qs = wireQuery(query);
    const url = new URL(call.path + (qs ? "?" + qs : ""), this.endpoint);
    const timestamp = bceTimestamp(new Date(this.#now().getTime() + this.#clockOffsetMs));
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
    this.calls.set(call.op, (this.calls.get(call.op) ?? 0) + 1);
    const fail = (
      message: string,
      o: { status: number; code: string; requestId?: string; cause?: unknown; text?: string },
    ) =>
      new BceApiError(message, {
        ...o,
        op: call.op,
        classification: classifyError({
          status: o.status,
          code: o.code,
          message: o.text ?? "",
          op: call.op,
        }),
      });
    try {
      let status: number;
      let statusText: string;
      let text: string;
      let requestId: string | undefined;
      let retryAfter: string | null;
      let serverDate: string | null;
      try {
        const res = await fetch(url, {
          method: call.method,
          headers: sendHeaders,
          body,
          signal: ac.signal,
        });
        status = res.status;
        statusText = res.statusText;
        requestId = res.headers.get("x-bce-request-id") ?? undefined;
        retryAfter = res.headers.get("retry-after");
        serverDate = res.headers.get("date");
        text = await res.text();
      } catch (e) {
        const why = ac.signal.aborted ? String(ac.signal.reason?.message ?? "aborted") : errText(e);
        throw fail(`BCE ${where} failed: ${why}`, { status: 0, code: "", cause: e });
      }
      if (status >= 200 && status < 300) {
        if (text.trim() === "") return {};
        try {
          return JSON.parse(text);
        } catch (e) {
          throw fail(`BCE ${where} returned malformed JSON`, {
            status,
            code: "MalformedJSON",
            requestId,
            cause: e,
          });
        }
      }
      let code = "";
      let message = "";
      if (text.trim() !== "") {
        try {
          const parsed = ErrorBodySchema.safeParse(JSON.parse(text));
          if (parsed.success) {
            code = parsed.data.code;
            message = parsed.data.message;
            requestId = parsed.data.requestId ?? requestId;
          } else {
            code = "MalformedJSON";
          }
        } catch {
          // Undecodable: bce-sdk-go calls it MalformedJSON (bce/response.go).
          code = "MalformedJSON";
        }
      }
      if (!code) code = codeForEmptyBody(status, statusText);
      const safeMessage = scrub(message, creds);
      const classification = classifyError({ status, code, message: safeMessage, op: call.op });
      const authNote = classification.reason === "auth_failed"
        ? ` (access key id "${creds.accessKeyId}"; check the credentials and the clock)`
        : "";
      const out = new BceApiError(
        `BCE ${where} failed: HTTP ${status} ${code}: ${safeMessage}${authNote} [requestId ${
          requestId ?? "none"
        }]`,
        { status, code, requestId, op: call.op, classification },
      );
      const serverMs = serverDate === null ? NaN : Date.parse(serverDate);
      if (Number.isFinite(serverMs)) SERVER_OFFSET.set(out, serverMs - this.#now().getTime());
      const seconds = retryAfter !== null ? Number(retryAfter) : NaN;
      if (Number.isFinite(seconds) && seconds > 0) {
        RETRY_AFTER.set(out, Math.min(seconds * 1000, this.#retry.maxDelayMs));
      }
      throw out;
    } finally {
      clearTimeout(timer);
      this.#closed.signal.removeEventListener("abort", onClose);
    }
  }
}

/** How far the server's `Date` was ahead of the local clock when it answered (ms). */
const SERVER_OFFSET = new WeakMap<BceApiError, number>();

/** `Retry-After` of a failed attempt (capped at maxDelayMs), kept beside the error. */
const RETRY_AFTER = new WeakMap<BceApiError, number>();

/** Removes secrets a server might echo back in a message. */
function scrub(message: string, creds: Credentials): string {
  let out = message;
  for (const s of [creds.secretAccessKey, creds.sessionToken]) {
    if (s) out = out.split(s).join("[redacted]");
  }
  return out.replace(/bce-auth-v1\/\S+/g, "[redacted]");
}

/** The `eniId` of a raw list entry, when it has a string one (for the log line). */
function entryId(raw: unknown): string | null {
  if (typeof raw !== "object" || raw === null || !("eniId" in raw)) return null;
  return typeof raw.eniId === "string" ? raw.eniId : null;
}

function errText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
