/**
 * HTTP/1.1 over a unix socket, framed by bytes: one request per connection
 * (`Connection: close`), the whole response read before it is parsed.
 *
 * The one place enim frames HTTP by hand, in two files: this one, the client
 * (the agent's API client and the plugin process use it), and `http1_server.ts`,
 * the agent's server. This one imports only `utf8.ts`, which imports nothing, so
 * the plugin process stays at Deno's start-up floor (`fetch` with a unix-socket
 * client costs several milliseconds to set up). Bodies are bytes: a chunked or
 * length-delimited body is cut by byte counts, never by string length, so a
 * multi-byte body survives.
 *
 * @module
 */
import { decodeUtf8 } from "./utf8.ts";

/** A parsed response: status, lower-cased headers and the raw body. */
export interface HttpResponse {
  status: number;
  headers: Map<string, string>;
  body: Uint8Array;
}

/** Why a round trip failed: before the connection existed, during the exchange, or out of time. */
export type UnixHttpPhase = "connect" | "exchange" | "timeout";

/** A round trip that did not produce a complete response. */
export class UnixHttpError extends Error {
  readonly phase: UnixHttpPhase;
  readonly socketPath: string;
  constructor(
    phase: UnixHttpPhase,
    socketPath: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "UnixHttpError";
    this.phase = phase;
    this.socketPath = socketPath;
  }
}

const encoder = new TextEncoder();

/**
 * Encodes one request (`Host: enim`, `Connection: close`, a JSON or empty body, and
 * `headers`: the caller's own names and values, never CR or LF).
 */
export function encodeRequest(
  method: string,
  path: string,
  body?: Uint8Array,
  headers: Record<string, string> = {},
): Uint8Array {
  const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
  const head = `${method} ${path} HTTP/1.1\r\nHost: enim\r\nConnection: close\r\n` +
    (body === undefined ? "" : `Content-Type: application/json\r\n`) + extra +
    `Content-Length: ${body?.length ?? 0}\r\n\r\n`;
  const headBytes = encoder.encode(head);
  const out = new Uint8Array(headBytes.length + (body?.length ?? 0));
  out.set(headBytes);
  if (body) out.set(body, headBytes.length);
  return out;
}

/** The index of the first `\r\n\r\n` in `bytes` at or after `from`, or -1. */
export function headerEnd(bytes: Uint8Array, from = 0): number {
  for (let i = from; i + 3 < bytes.length; i++) {
    if (bytes[i] === 13 && bytes[i + 1] === 10 && bytes[i + 2] === 13 && bytes[i + 3] === 10) {
      return i;
    }
  }
  return -1;
}

/** The index of the first `\r\n` in `bytes` at or after `from`, or -1. */
function lineEnd(bytes: Uint8Array, from: number): number {
  for (let i = from; i + 1 < bytes.length; i++) {
    if (bytes[i] === 13 && bytes[i + 1] === 10) return i;
  }
  return -1;
}

/**
 * Parses a complete HTTP/1.x response: a `Content-Length` body, a chunked body,
 * or (neither) everything up to the end of the connection.
 *
 * @throws {Error} when the response is malformed or cut short
 */
export function parseResponse(bytes: Uint8Array): HttpResponse {
  const end = headerEnd(bytes);
  if (end < 0) throw new Error("Malformed HTTP response: no end of headers");
  const lines = decodeUtf8(bytes.subarray(0, end)).split("\r\n");
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]);
  if (!m) throw new Error(`Malformed HTTP status line: ${JSON.stringify(lines[0].slice(0, 100))}`);
  const headers = new Map<string, string>();
  for (const l of lines.slice(1)) {
    const i = l.indexOf(":");
    if (i > 0) headers.set(l.slice(0, i).trim().toLowerCase(), l.slice(i + 1).trim());
  }
  const rest = bytes.subarray(end + 4);
  let body: Uint8Array;
  if (headers.get("transfer-encoding")?.toLowerCase().includes("chunked")) {
    body = dechunk(rest);
  } else if (headers.has("content-length")) {
    const n = Number(headers.get("content-length"));
    if (!Number.isSafeInteger(n) || n < 0) throw new Error("Malformed HTTP Content-Length");
    if (rest.length < n) {
      throw new Error(`HTTP response cut short: ${rest.length} of ${n} body bytes`);
    }
    body = rest.subarray(0, n);
  } else {
    body = rest;
  }
  return { status: Number(m[1]), headers, body };
}

/** Decodes a chunked body (byte counts), ignoring chunk extensions and trailers. */
function dechunk(bytes: Uint8Array): Uint8Array {
  const parts: Uint8Array[] = [];
  let total = 0;
  let at = 0;
  for (;;) {
    const nl = lineEnd(bytes, at);
    if (nl < 0) throw new Error("HTTP chunked body cut short: no chunk size line");
    const sizeText = decodeUtf8(bytes.subarray(at, nl)).split(";")[0].trim();
    if (!/^[0-9a-fA-F]+$/.test(sizeText)) {
      throw new Error(`Malformed HTTP chunk size ${JSON.stringify(sizeText.slice(0, 20))}`);
    }
    const size = parseInt(sizeText, 16);
    if (size === 0) break;
    const start = nl + 2;
    if (start + size > bytes.length) throw new Error("HTTP chunked body cut short");
    parts.push(bytes.subarray(start, start + size));
    total += size;
    at = start + size + 2;
  }
  const out = new Uint8Array(total);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/** Decodes a body as UTF-8. */
export function bodyText(res: HttpResponse): string {
  return decodeUtf8(res.body);
}

/**
 * Sends one request over the unix socket at `socketPath` and reads the whole
 * response. Fails with {@linkcode UnixHttpError}: `connect` when nobody can be
 * reached (the cause says why), `exchange` when the connection broke or the
 * answer is malformed, `timeout` after `timeoutMs`.
 */
export async function unixRoundTrip(
  socketPath: string,
  request: Uint8Array,
  timeoutMs: number,
): Promise<HttpResponse> {
  let conn: Deno.UnixConn;
  try {
    conn = await Deno.connect({ transport: "unix", path: socketPath });
  } catch (err) {
    throw new UnixHttpError(
      "connect",
      socketPath,
      `Cannot connect to "${socketPath}": ${err instanceof Error ? err.message : String(err)}`,
      { cause: err },
    );
  }
  // AbortSignal.timeout, not setTimeout: in a fresh Deno process the first
  // setTimeout loads the web timers and costs the plugin process ~4 MB of RSS.
  const deadline = AbortSignal.timeout(timeoutMs);
  let timedOut = false;
  const onTimeout = () => {
    timedOut = true;
    try {
      conn.close();
    } catch { /* already closed */ }
  };
  deadline.addEventListener("abort", onTimeout, { once: true });
  try {
    let off = 0;
    while (off < request.length) off += await conn.write(request.subarray(off));
    const chunks: Uint8Array[] = [];
    let total = 0;
    for (;;) {
      const buf = new Uint8Array(total < 65536 ? 16384 : 262144);
      const n = await conn.read(buf);
      if (n === null) break;
      chunks.push(buf.subarray(0, n));
      total += n;
    }
    if (timedOut) throw new Error("closed by the deadline");
    const all = new Uint8Array(total);
    let at = 0;
    for (const c of chunks) {
      all.set(c, at);
      at += c.length;
    }
    return parseResponse(all);
  } catch (err) {
    if (timedOut) {
      throw new UnixHttpError(
        "timeout",
        socketPath,
        `No answer on "${socketPath}" within ${timeoutMs / 1000} s`,
        { cause: err },
      );
    }
    throw new UnixHttpError(
      "exchange",
      socketPath,
      `The exchange on "${socketPath}" failed: ${err instanceof Error ? err.message : String(err)}`,
      { cause: err },
    );
  } finally {
    deadline.removeEventListener("abort", onTimeout);
    try {
      conn.close();
    } catch { /* closed by the timer */ }
  }
}

// ---------------------------------------------------------------- the server side
