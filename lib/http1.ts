/**
 * HTTP/1.1 over a unix socket, framed by bytes: one request per connection
 * (`Connection: close`), the whole response read before it is parsed.
 *
 * The one place enim frames HTTP by hand. The agent's API client and the
 * plugin process both use it; it imports nothing, so the plugin process stays
 * at Deno's start-up floor (`fetch` with a unix-socket client costs several
 * milliseconds to set up). Bodies are bytes: a chunked or length-delimited body
 * is cut by byte counts, never by string length, so a multi-byte body survives.
 *
 * @module
 */

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
const decoder = new TextDecoder();

/** Encodes one request (`Host: enim`, `Connection: close`, a JSON or empty body). */
export function encodeRequest(
  method: string,
  path: string,
  body?: Uint8Array,
  contentType = "application/json",
): Uint8Array {
  const head = `${method} ${path} HTTP/1.1\r\nHost: enim\r\nConnection: close\r\n` +
    (body === undefined ? "" : `Content-Type: ${contentType}\r\n`) +
    `Content-Length: ${body?.length ?? 0}\r\n\r\n`;
  const headBytes = encoder.encode(head);
  const out = new Uint8Array(headBytes.length + (body?.length ?? 0));
  out.set(headBytes);
  if (body) out.set(body, headBytes.length);
  return out;
}

/** The index of the first `\r\n\r\n` in `bytes` at or after `from`, or -1. */
function headerEnd(bytes: Uint8Array, from = 0): number {
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
  const lines = decoder.decode(bytes.subarray(0, end)).split("\r\n");
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
    const sizeText = decoder.decode(bytes.subarray(at, nl)).split(";")[0].trim();
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
  return decoder.decode(res.body);
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

/** A request as read off the wire. */
export interface HttpRequestHead {
  method: string;
  /** The request target (path and query). */
  target: string;
  headers: Map<string, string>;
}

/** Why a request could not be read: the status to answer with. */
export class HttpRequestError extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.name = "HttpRequestError";
    this.status = status;
  }
}

/**
 * Parses a request's head (everything before the blank line).
 *
 * @throws {HttpRequestError} 400 when it is malformed
 */
export function parseRequestHead(bytes: Uint8Array): HttpRequestHead {
  const lines = decoder.decode(bytes).split("\r\n");
  const m = /^([A-Z]{1,16}) (\/[^\s]*) HTTP\/1\.[01]$/.exec(lines[0]);
  if (!m) {
    throw new HttpRequestError(
      400,
      `Malformed request line ${JSON.stringify(lines[0].slice(0, 100))}`,
    );
  }
  const headers = new Map<string, string>();
  for (const l of lines.slice(1)) {
    if (l === "") continue;
    const i = l.indexOf(":");
    if (i <= 0) {
      throw new HttpRequestError(400, `Malformed header ${JSON.stringify(l.slice(0, 100))}`);
    }
    headers.set(l.slice(0, i).trim().toLowerCase(), l.slice(i + 1).trim());
  }
  return { method: m[1], target: m[2], headers };
}

/** Options for {@linkcode serveHttp1}. */
export interface Http1ServerOptions {
  /** The most connections served at once; one more is answered 503 and closed. */
  maxConnections: number;
  /** How long a client has to send a whole request (head and body); then 408 and close. */
  requestTimeoutMs: number;
  /** The largest request head, bytes (431 beyond). */
  maxHeadBytes?: number;
  /** The largest request body, bytes (413 beyond). */
  maxBodyBytes: number;
  /** Told about failures of single connections (never fatal). */
  onError?: (err: unknown) => void;
}

/** A running {@linkcode serveHttp1} server. */
export interface Http1Server {
  /** Connections open now. */
  readonly connections: number;
  /** Stops accepting, waits for the requests being handled, closes idle connections. */
  shutdown(): Promise<void>;
  /** Settles when the server stopped (shutdown, or the listener failed). */
  readonly finished: Promise<void>;
}

const STATUS_TEXT: Record<number, string> = {
  200: "OK",
  400: "Bad Request",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  409: "Conflict",
  411: "Length Required",
  412: "Precondition Failed",
  413: "Content Too Large",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
  507: "Insufficient Storage",
};

/** Encodes a response: status line, its headers, `Content-Length`, `Connection: close`. */
export function encodeResponse(status: number, headers: Headers, body: Uint8Array): Uint8Array {
  let head = `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? "Status"}\r\n`;
  headers.forEach((v, k) => {
    if (k !== "content-length" && k !== "connection" && k !== "transfer-encoding") {
      head += `${k}: ${v}\r\n`;
    }
  });
  head += `content-length: ${body.length}\r\nconnection: close\r\n\r\n`;
  const h = encoder.encode(head);
  const out = new Uint8Array(h.length + body.length);
  out.set(h);
  out.set(body, h.length);
  return out;
}

/** A JSON error body in the API's shape. */
function errorBytes(status: number, code: string, message: string): Uint8Array {
  return encodeResponse(
    status,
    new Headers({ "content-type": "application/json" }),
    encoder.encode(JSON.stringify({ error: { code, message } })),
  );
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let off = 0;
  while (off < bytes.length) off += await conn.write(bytes.subarray(off));
}

/**
 * Answers a request that was not (wholly) read and closes gently: the answer,
 * then the write side shut, then what the client still sends read and dropped
 * for up to `lingerMs`. Closing a socket with unread input resets the
 * connection, and the client would lose the answer.
 */
async function answerAndLinger(conn: Deno.Conn, bytes: Uint8Array, lingerMs = 1000) {
  try {
    await writeAll(conn, bytes);
    await conn.closeWrite();
    const timer = setTimeout(() => {
      try {
        conn.close();
      } catch { /* closed */ }
    }, lingerMs);
    try {
      const sink = new Uint8Array(16 * 1024);
      while ((await conn.read(sink)) !== null) { /* dropped */ }
    } finally {
      clearTimeout(timer);
    }
  } catch { /* the client went away */ }
}

/**
 * Serves `handler` on `listener`, one request per connection (`Connection:
 * close`, as every enim client sends), framed by bytes. Each connection must
 * deliver its whole request within `requestTimeoutMs` (else 408 and it is
 * closed), the head within `maxHeadBytes` (431) and the body within
 * `maxBodyBytes` (413); beyond `maxConnections` open at once a new one is
 * answered 503 at once. So a slow or idle client can hold neither a handler
 * nor more than its own file descriptor, and only for a bounded time.
 */
export function serveHttp1(
  listener: Deno.Listener,
  handler: (req: Request) => Promise<Response>,
  opts: Http1ServerOptions,
): Http1Server {
  const maxHead = opts.maxHeadBytes ?? 16 * 1024;
  const open = new Set<Deno.Conn>();
  /** Connections still reading their request: closed at once on shutdown. */
  const reading = new Set<Deno.Conn>();
  const handling = new Set<Promise<void>>();
  let stopping = false;

  const serveConn = async (conn: Deno.Conn) => {
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      // Ends a pending read; the request is answered 408 below.
      try {
        conn.close();
      } catch { /* closed */ }
    }, opts.requestTimeoutMs);
    let closed = false;
    reading.add(conn);
    try {
      let buf = new Uint8Array(0);
      let head: HttpRequestHead | undefined;
      let bodyStart = 0;
      let need = 0;
      const chunk = new Uint8Array(16 * 1024);
      for (;;) {
        if (head && buf.length - bodyStart >= need) break;
        const n = await conn.read(chunk);
        if (n === null) throw new HttpRequestError(400, "The connection ended before the request");
        const next = new Uint8Array(buf.length + n);
        next.set(buf);
        next.set(chunk.subarray(0, n), buf.length);
        buf = next;
        if (!head) {
          const end = headerEnd(buf, Math.max(0, buf.length - n - 3));
          if (end < 0) {
            if (buf.length > maxHead) {
              throw new HttpRequestError(431, `The request head exceeds ${maxHead} bytes`);
            }
            continue;
          }
          head = parseRequestHead(buf.subarray(0, end));
          bodyStart = end + 4;
          if (head.headers.has("transfer-encoding")) {
            throw new HttpRequestError(
              411,
              "Chunked request bodies are not accepted: send Content-Length",
            );
          }
          const len = Number(head.headers.get("content-length") ?? "0");
          if (!Number.isSafeInteger(len) || len < 0) {
            throw new HttpRequestError(400, "Malformed Content-Length");
          }
          if (len > opts.maxBodyBytes) {
            throw new HttpRequestError(
              413,
              `Request body of ${len} bytes exceeds ${opts.maxBodyBytes}`,
            );
          }
          need = len;
        }
      }
      clearTimeout(timer);
      reading.delete(conn);
      const body = buf.subarray(bodyStart, bodyStart + need);
      const req = new Request(`http://enim${head.target}`, {
        method: head.method,
        headers: [...head.headers].filter(([k]) => k !== "host" && k !== "connection"),
        body: head.method === "GET" || head.method === "HEAD" ? undefined : body,
      });
      const res = await handler(req);
      const out = new Uint8Array(await res.arrayBuffer());
      await writeAll(conn, encodeResponse(res.status, res.headers, out));
    } catch (err) {
      clearTimeout(timer);
      if (timedOut) {
        // The timer closed it: the client sent too little in time.
        closed = true;
      } else if (err instanceof HttpRequestError) {
        await answerAndLinger(conn, errorBytes(err.status, "bad_request", err.message));
      } else if (!stopping) {
        opts.onError?.(err);
      }
    } finally {
      clearTimeout(timer);
      reading.delete(conn);
      open.delete(conn);
      if (!closed) {
        try {
          conn.close();
        } catch { /* closed */ }
      }
    }
  };

  const finished = (async () => {
    for (;;) {
      let conn: Deno.Conn;
      try {
        conn = await listener.accept();
      } catch (err) {
        if (!stopping) opts.onError?.(err);
        return;
      }
      if (stopping) {
        conn.close();
        continue;
      }
      if (open.size >= opts.maxConnections) {
        answerAndLinger(
          conn,
          errorBytes(503, "busy", `Too many connections (${opts.maxConnections}); try again`),
        ).finally(() => {
          try {
            conn.close();
          } catch { /* closed */ }
        });
        continue;
      }
      open.add(conn);
      const p = serveConn(conn);
      handling.add(p);
      p.finally(() => handling.delete(p));
    }
  })();

  let stopped: Promise<void> | undefined;
  return {
    get connections() {
      return open.size;
    },
    shutdown() {
      stopped ??= (async () => {
        stopping = true;
        try {
          listener.close();
        } catch { /* closed */ }
        for (const conn of reading) {
          try {
            conn.close();
          } catch { /* closed */ }
        }
        await finished;
        await Promise.allSettled([...handling]);
      })();
      return stopped;
    },
    finished,
  };
}
