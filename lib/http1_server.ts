/**
 * The agent's side of HTTP/1.1 over its unix socket: one request per connection,
 * a deadline for the whole request and a cap on connections, errors answered as
 * JSON. The client side is `http1.ts`.
 *
 * @module
 */
import { headerEnd } from "./http1.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

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

/** A header name: an RFC 9110 token. */
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/**
 * A header value: visible ASCII, obs-text, spaces and tabs; no control character. The head is
 * read as UTF-8, so a character past U+00FF (which no Request header can hold) is refused too.
 */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

/**
 * Parses a request's head (everything before the blank line).
 *
 * @throws {HttpRequestError} 400 when it is malformed
 */
export function parseRequestHead(bytes: Uint8Array): HttpRequestHead {
  const lines = decoder.decode(bytes).split("\r\n");
  // A method is any token (RFC 9110 §9.1): the server answers the ones it does not serve.
  const m = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32}) (\/[^\s]*) HTTP\/1\.[01]$/.exec(lines[0]);
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
    const name = i <= 0 ? "" : l.slice(0, i);
    const value = l.slice(i + 1).trim();
    // RFC 9110 §5.1, §5.5: a name is a token; a value is visible characters, obs-text, spaces
    // and tabs. A control character (NUL among them) is the client's error, not a method or
    // target the server cannot serve.
    if (!TOKEN.test(name) || !FIELD_VALUE.test(value)) {
      throw new HttpRequestError(400, `Malformed header ${JSON.stringify(l.slice(0, 100))}`);
    }
    headers.set(name.toLowerCase(), value);
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
  /**
   * Looks at a request's method and target before its body is read; a response it returns
   * is sent instead of calling the handler (an unknown path, a method the path does not
   * serve, a method the server does not know: also those `Request` cannot carry, such as
   * TRACE and CONNECT).
   */
  precheck?: (method: string, target: string) => Response | null;
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
  501: "Not Implemented",
  502: "Bad Gateway",
  503: "Service Unavailable",
  507: "Insufficient Storage",
};

/**
 * Encodes a response: status line, its headers, `Content-Length`, `Connection: close`.
 * For a HEAD request (`headOnly`) the body is left out and `Content-Length` still says
 * how long it would be (RFC 9110 §9.3.2: a response to HEAD carries no content).
 */
export function encodeResponse(
  status: number,
  headers: Headers,
  body: Uint8Array,
  headOnly = false,
): Uint8Array {
  let head = `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? "Status"}\r\n`;
  headers.forEach((v, k) => {
    if (k !== "content-length" && k !== "connection" && k !== "transfer-encoding") {
      head += `${k}: ${v}\r\n`;
    }
  });
  head += `content-length: ${body.length}\r\nconnection: close\r\n\r\n`;
  const h = encoder.encode(head);
  const sent = headOnly ? body.subarray(0, 0) : body;
  const out = new Uint8Array(h.length + sent.length);
  out.set(h);
  out.set(sent, h.length);
  return out;
}

/** A JSON error body in the API's shape. */
function errorBytes(status: number, code: string, message: string, headOnly = false): Uint8Array {
  return encodeResponse(
    status,
    new Headers({ "content-type": "application/json" }),
    encoder.encode(JSON.stringify({ error: { code, message } })),
    headOnly,
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
    /** A HEAD request: whatever is answered goes without its body. */
    let headOnly = false;
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
          headOnly = head.method === "HEAD";
          bodyStart = end + 4;
          const early = opts.precheck?.(head.method, head.target);
          if (early) {
            clearTimeout(timer);
            reading.delete(conn);
            const out = new Uint8Array(await early.arrayBuffer());
            await answerAndLinger(
              conn,
              encodeResponse(early.status, early.headers, out, headOnly),
            );
            return;
          }
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
      let req: Request;
      try {
        req = new Request(`http://enim${head.target}`, {
          method: head.method,
          headers: [...head.headers].filter(([k]) => k !== "host" && k !== "connection"),
          body: head.method === "GET" || head.method === "HEAD" ? undefined : body,
        });
      } catch (err) {
        // A method fetch's Request refuses (CONNECT, TRACE, TRACK) or a target it cannot parse.
        throw new HttpRequestError(
          501,
          `Cannot serve ${head.method} ${JSON.stringify(head.target.slice(0, 100))}: ${
            err instanceof Error ? err.message : String(err)
          }`,
        );
      }
      const res = await handler(req);
      const out = new Uint8Array(await res.arrayBuffer());
      await writeAll(conn, encodeResponse(res.status, res.headers, out, headOnly));
    } catch (err) {
      clearTimeout(timer);
      if (timedOut) {
        // The timer closed it: the client sent too little in time.
        closed = true;
      } else if (err instanceof HttpRequestError) {
        await answerAndLinger(conn, errorBytes(err.status, "bad_request", err.message, headOnly));
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
