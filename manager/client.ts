/**
 * The agent API client: HTTP/1.1 over the agent's unix socket.
 *
 * It is on the CNI plugin's hot path, so it is a minimal client over
 * `Deno.connect` (one connection per request, `Connection: close`) rather than
 * `fetch` with a custom HTTP client, which costs several milliseconds to set up.
 * It imports nothing but the API schemas.
 *
 * @module
 */
import { z } from "zod";
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
  type Status,
  StatusSchema,
} from "./api_schema.ts";
import { EniSchema } from "../providers/schema.ts";
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
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A raw HTTP response. */
interface RawResponse {
  status: number;
  body: string;
}

/** Sends one HTTP/1.1 request over a unix socket and reads the whole response. */
export async function unixRequest(
  socketPath: string,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 30_000,
): Promise<RawResponse> {
  let conn: Deno.UnixConn;
  try {
    conn = await Deno.connect({ transport: "unix", path: socketPath });
  } catch (err) {
    throw new AgentUnreachableError(socketPath, { cause: err });
  }
  const timer = setTimeout(() => {
    try {
      conn.close();
    } catch { /* already closed */ }
  }, timeoutMs);
  try {
    const payload = body === undefined ? new Uint8Array() : encoder.encode(JSON.stringify(body));
    const head = `${method} ${path} HTTP/1.1\r\nHost: enim\r\nConnection: close\r\n` +
      (body === undefined ? "" : "Content-Type: application/json\r\n") +
      `Content-Length: ${payload.length}\r\n\r\n`;
    const req = new Uint8Array(head.length + payload.length);
    req.set(encoder.encode(head));
    req.set(payload, head.length);
    let off = 0;
    while (off < req.length) off += await conn.write(req.subarray(off));
    const chunks: Uint8Array[] = [];
    const buf = new Uint8Array(16 * 1024);
    let total = 0;
    for (;;) {
      const n = await conn.read(buf);
      if (n === null) break;
      chunks.push(buf.slice(0, n));
      total += n;
    }
    const all = new Uint8Array(total);
    let at = 0;
    for (const c of chunks) {
      all.set(c, at);
      at += c.length;
    }
    return parseHttpResponse(all);
  } catch (err) {
    if (err instanceof AgentUnreachableError) throw err;
    throw new AgentUnreachableError(socketPath, { cause: err });
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch { /* closed by the timer */ }
  }
}

/** Parses a complete HTTP/1.1 response (content-length, chunked or read-to-close body). */
export function parseHttpResponse(bytes: Uint8Array): RawResponse {
  const text = decoder.decode(bytes);
  const end = text.indexOf("\r\n\r\n");
  if (end < 0) throw new Error("Malformed HTTP response from the agent: no header end");
  const lines = text.slice(0, end).split("\r\n");
  const m = lines[0].match(/^HTTP\/1\.[01] (\d{3})/);
  if (!m) throw new Error(`Malformed HTTP status line from the agent: "${lines[0]}"`);
  const headers = new Map<string, string>();
  for (const l of lines.slice(1)) {
    const i = l.indexOf(":");
    if (i > 0) headers.set(l.slice(0, i).trim().toLowerCase(), l.slice(i + 1).trim());
  }
  let body = text.slice(end + 4);
  if (headers.get("transfer-encoding")?.toLowerCase().includes("chunked")) {
    let out = "";
    let rest = body;
    for (;;) {
      const nl = rest.indexOf("\r\n");
      if (nl < 0) break;
      const size = parseInt(rest.slice(0, nl), 16);
      if (!size) break;
      out += rest.slice(nl + 2, nl + 2 + size);
      rest = rest.slice(nl + 2 + size + 2);
    }
    body = out;
  }
  return { status: Number(m[1]), body };
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

  async #call<T>(method: string, path: string, schema: z.ZodType<T>, body?: unknown): Promise<T> {
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
    const parsed = schema.safeParse(json);
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
  async metrics(): Promise<string> {
    const res = await unixRequest(this.socketPath, "GET", "/metrics", undefined, this.timeoutMs);
    if (res.status >= 400) {
      throw new ApiError("internal", `The agent answered ${res.status} to GET /metrics`);
    }
    return res.body;
  }
}
