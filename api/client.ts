/**
 * The agent API client: HTTP/1.1 over the agent's unix socket.
 *
 * One connection per request (`Connection: close`), framed by `lib/http1.ts`,
 * rather than `fetch` with a custom HTTP client, which costs several
 * milliseconds to set up. It imports nothing but the API schemas.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import {
  type AddRequest,
  type AddResponse,
  AddResponseSchema,
  ApiError,
  ApiErrorBodySchema,
  type Attachment,
  AttachmentSchema,
  type CheckRequest,
  type DelRequest,
  type GcReport,
  GcReportSchema,
  type GcRequest,
  type PodPolicyView,
  PodPolicyViewSchema,
  type Status,
  StatusSchema,
} from "./schema.ts";
import { EniSchema } from "../providers/schema.ts";
import { bodyText, encodeRequest, UnixHttpError, unixRoundTrip } from "../lib/http1.ts";
import type { Eni } from "../providers/schema.ts";

/** The agent did not answer: no socket, nobody listening, or the connection broke. */
export class AgentUnreachableError extends Error {
  readonly socketPath: string;
  constructor(socketPath: string, options?: { cause?: unknown }) {
    const why = options?.cause instanceof Error ? `: ${options.cause.message}` : "";
    super(`Cannot reach the enim agent at "${socketPath}"${why}`, options);
    this.name = "AgentUnreachableError";
    this.socketPath = socketPath;
  }
}

/** What the CNI side and the operator commands need from the agent. */
export interface AgentClient {
  add(req: AddRequest): Promise<AddResponse>;
  del(req: DelRequest): Promise<void>;
  check(req: CheckRequest): Promise<void>;
  gc(req: GcRequest): Promise<GcReport>;
  status(): Promise<Status>;
  attachments(): Promise<Attachment[]>;
  enis(): Promise<Eni[]>;
  /** Raw text of `GET /metrics`. */
  metrics(): Promise<string>;
  /** A local pod's effective NetworkPolicy (`GET /v1/policy`); the operator commands' only. */
  policy?(pod: string): Promise<PodPolicyView>;
}

const encoder = new TextEncoder();

/** A raw HTTP response with its body as text. */
export interface RawResponse {
  status: number;
  body: string;
}

/**
 * Sends one HTTP/1.1 request over a unix socket (`lib/http1.ts`) and reads the
 * whole response; a body other than a string is sent as JSON.
 *
 * @throws {AgentUnreachableError} when the agent cannot be reached or does not answer in time
 */
export async function unixRequest(
  socketPath: string,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 30_000,
): Promise<RawResponse> {
  const payload = body === undefined
    ? undefined
    : encoder.encode(typeof body === "string" ? body : JSON.stringify(body));
  try {
    const res = await unixRoundTrip(socketPath, encodeRequest(method, path, payload), timeoutMs);
    return { status: res.status, body: bodyText(res) };
  } catch (err) {
    throw new AgentUnreachableError(socketPath, {
      cause: err instanceof UnixHttpError && err.phase === "connect" ? err.cause : err,
    });
  }
}

const AnyObject = z.looseObject({});
const AttachmentList = z.object({ attachments: z.array(AttachmentSchema) });
const EniList = z.object({ enis: z.array(EniSchema) });

/** The {@linkcode AgentClient} over the agent's unix socket. */
export class SocketAgentClient implements AgentClient {
  readonly socketPath: string;
  readonly timeoutMs: number;

  constructor(socketPath: string, timeoutMs = 30_000) {
    this.socketPath = socketPath;
    this.timeoutMs = timeoutMs;
  }

  async #call<T>(
    method: string,
    path: string,
    schema: z.core.$ZodType<T>,
    body?: unknown,
  ): Promise<T> {
    const res = await unixRequest(this.socketPath, method, path, body, this.timeoutMs);
    let json: unknown;
    try {
      json = res.body === "" ? {} : JSON.parse(res.body);
    } catch (err) {
      throw new ApiError(
        "internal",
        `The agent answered ${res.status} with a body that is not JSON`,
        undefined,
        {
          cause: err,
        },
      );
    }
    if (res.status >= 400) {
      const parsed = ApiErrorBodySchema.safeParse(json);
      if (parsed.success) {
        const e = parsed.data.error;
        throw new ApiError(e.code, e.message, e.details);
      }
      throw new ApiError("internal", `The agent answered ${res.status}: ${res.body.slice(0, 200)}`);
    }
    const parsed = z.safeParse(schema, json);
    if (!parsed.success) {
      throw new ApiError(
        "internal",
        `The agent's answer to ${method} ${path} does not match its schema`,
        parsed.error.message,
      );
    }
    return parsed.data;
  }

  add(req: AddRequest): Promise<AddResponse> {
    return this.#call("POST", "/v1/add", AddResponseSchema, req);
  }
  async del(req: DelRequest): Promise<void> {
    await this.#call("POST", "/v1/del", AnyObject, req);
  }
  async check(req: CheckRequest): Promise<void> {
    await this.#call("POST", "/v1/check", AnyObject, req);
  }
  gc(req: GcRequest): Promise<GcReport> {
    return this.#call("POST", "/v1/gc", GcReportSchema, req);
  }
  status(): Promise<Status> {
    return this.#call("GET", "/v1/status", StatusSchema);
  }
  async attachments(): Promise<Attachment[]> {
    return (await this.#call("GET", "/v1/attachments", AttachmentList)).attachments;
  }
  async enis(): Promise<Eni[]> {
    return (await this.#call("GET", "/v1/enis", EniList)).enis;
  }
  policy(pod: string): Promise<PodPolicyView> {
    return this.#call("GET", `/v1/policy?pod=${encodeURIComponent(pod)}`, PodPolicyViewSchema);
  }
  async metrics(): Promise<string> {
    const res = await unixRequest(this.socketPath, "GET", "/metrics", undefined, this.timeoutMs);
    if (res.status >= 400) {
      throw new ApiError("internal", `The agent answered ${res.status} to GET /metrics`);
    }
    return res.body;
  }
}
