/**
 * The `bce-auth-v1` request signer (reference §5), on node:crypto HMAC-SHA256.
 *
 * Pure functions: the caller says what it will send (method, path, query pairs,
 * headers) and gets the `Authorization` value back. Whatever is signed must be
 * sent byte for byte, so the API client signs only headers fetch really sends.
 *
 * @module
 */
import { createHmac } from "node:crypto";

/** Access credentials; `sessionToken` is set for STS (temporary) credentials. */
export interface Credentials {
  accessKeyId: string;
  secretAccessKey: string;
  sessionToken?: string;
}

/** One query parameter; a `null` or `""` value is a bare key (`?attach`). */
export type QueryPair = readonly [key: string, value: string | null];

/** The headers signed when the caller gives no explicit list (plus every `x-bce-*`). */
export const DEFAULT_HEADERS_TO_SIGN: readonly string[] = [
  "host",
  "content-length",
  "content-type",
  "content-md5",
];

/** The default expiration of a signature, in seconds. */
export const DEFAULT_EXPIRATION_SECONDS = 1800;

const encoder = new TextEncoder();
const UNRESERVED = /[A-Za-z0-9\-_.~]/;

/** UriEncode of the reference: RFC 3986 on the UTF-8 bytes, upper-case hex; `/` kept only when asked. */
export function uriEncode(input: string, keepSlash = false): string {
  let out = "";
  for (const byte of encoder.encode(input)) {
    const ch = String.fromCharCode(byte);
    if (byte < 0x80 && (UNRESERVED.test(ch) || (keepSlash && ch === "/"))) out += ch;
    else out += "%" + byte.toString(16).toUpperCase().padStart(2, "0");
  }
  return out;
}

/** The canonical URI: the path UriEncoded with `/` kept; an empty path is `/`. */
export function canonicalUri(path: string): string {
  if (path === "" || path === "/") return "/";
  const p = path.startsWith("/") ? path : "/" + path;
  return uriEncode(p, true);
}

/** The canonical query string: `key=value` pairs encoded, sorted as whole strings, `&`-joined. */
export function canonicalQuery(query: readonly QueryPair[]): string {
  return query
    .filter(([k]) => k.toLowerCase() !== "authorization")
    .map(([k, v]) => `${uriEncode(k)}=${uriEncode(v ?? "")}`)
    .sort(byteCompare)
    .join("&");
}

/** The query string as it goes on the wire: RFC 3986 encoding, bare keys for empty values. */
export function wireQuery(query: readonly QueryPair[]): string {
  return query
    .map(([k, v]) => (v === null || v === "" ? uriEncode(k) : `${uriEncode(k)}=${uriEncode(v)}`))
    .join("&");
}

/**
 * The canonical headers and the signed-headers list.
 *
 * `headersToSign` (lower case) selects the headers; without it the default set
 * plus every `x-bce-*` header is used. `authorization` is never signed, nor is a
 * header whose value is empty.
 */
export function canonicalHeaders(
  headers: Record<string, string>,
  headersToSign?: readonly string[],
): { canonical: string; signedHeaders: string } {
  const wanted = headersToSign ? new Set(headersToSign.map((h) => h.toLowerCase())) : null;
  const lines: string[] = [];
  const names: string[] = [];
  for (const [rawName, rawValue] of Object.entries(headers)) {
    const name = rawName.toLowerCase().trim();
    if (name === "authorization") continue;
    const selected = wanted
      ? wanted.has(name)
      : DEFAULT_HEADERS_TO_SIGN.includes(name) || name.startsWith("x-bce-");
    if (!selected) continue;
    const value = String(rawValue).trim();
    // A header whose value is empty (after trimming) is left out of the signature, as
    // the current bce-sdk-go does (auth/signer.go getCanonicalHeaders, since v0.9.259).
    if (value === "") continue;
    lines.push(`${uriEncode(name)}:${uriEncode(value)}`);
    names.push(uriEncode(name));
  }
  return {
    canonical: lines.sort(byteCompare).join("\n"),
    signedHeaders: names.sort(byteCompare).join(";"),
  };
}

/** Lower-case hex HMAC-SHA256. */
export function hmacHex(key: string, message: string): string {
  return createHmac("sha256", key).update(message, "utf8").digest("hex");
}

/** A `YYYY-MM-DDTHH:MM:SSZ` timestamp (seconds precision). */
export function bceTimestamp(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** What to sign. */
export interface SignInput {
  method: string;
  path: string;
  query: readonly QueryPair[];
  headers: Record<string, string>;
  accessKeyId: string;
  secretAccessKey: string;
  /** `YYYY-MM-DDTHH:MM:SSZ`. */
  timestamp: string;
  expirationSeconds?: number;
  headersToSign?: readonly string[];
}

/** The signature and its intermediate values (for tests and the fake server). */
export interface SignOutput {
  authorization: string;
  canonicalRequest: string;
  signingKey: string;
  signature: string;
  signedHeaders: string;
}

/**
 * Signs one request with `bce-auth-v1`.
 *
 * @example
 * ```ts
 * const { authorization } = sign({
 *   method: "GET", path: "/v1/eni", query: [["vpcId", "vpc-1"]],
 *   headers: { host: "bcc.bj.baidubce.com", "x-bce-date": "2024-05-20T08:30:00Z" },
 *   accessKeyId: "ak", secretAccessKey: "sk", timestamp: "2024-05-20T08:30:00Z",
 * });
 * ```
 */
export function sign(input: SignInput): SignOutput {
  const expiration = input.expirationSeconds ?? DEFAULT_EXPIRATION_SECONDS;
  const prefix = `bce-auth-v1/${input.accessKeyId}/${input.timestamp}/${expiration}`;
  const signingKey = hmacHex(input.secretAccessKey, prefix);
  const { canonical, signedHeaders } = canonicalHeaders(input.headers, input.headersToSign);
  const canonicalRequest = [
    input.method.toUpperCase(),
    canonicalUri(input.path),
    canonicalQuery(input.query),
    canonical,
  ].join("\n");
  const signature = hmacHex(signingKey, canonicalRequest);
  return {
    authorization: `${prefix}/${signedHeaders}/${signature}`,
    canonicalRequest,
    signingKey,
    signature,
    signedHeaders,
  };
}

/** The parts of a `bce-auth-v1` Authorization header. */
export interface ParsedAuthorization {
  accessKeyId: string;
  timestamp: string;
  expirationSeconds: number;
  signedHeaders: string[];
  signature: string;
}

/** Parses an Authorization header; `null` when it is not `bce-auth-v1`. */
export function parseAuthorization(value: string): ParsedAuthorization | null {
  const m = /^bce-auth-v1\/([^/]+)\/([^/]+)\/(\d+)\/([^/]*)\/([0-9a-f]{64})$/.exec(value.trim());
  if (!m) return null;
  return {
    accessKeyId: m[1],
    timestamp: m[2],
    expirationSeconds: Number(m[3]),
    signedHeaders: m[4] === "" ? [] : m[4].split(";"),
    signature: m[5],
  };
}

function byteCompare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
