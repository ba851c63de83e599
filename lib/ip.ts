/**
 * IP addresses and prefixes, the one place enim does IP math: parsing,
 * canonical text, families, prefixes and their host bits, membership, the n-th
 * address of a subnet, and ranges.
 *
 * Addresses are parsed strictly (dotted-quad IPv4 without leading zeros; IPv6
 * in any RFC 4291 form, an embedded IPv4 tail included; no zone ids) into
 * bigints, so every operation is exact for both families. Canonical text is
 * RFC 5952 (lower case, the longest run of zero groups compressed).
 *
 * @module
 */

/** An IP family. */
export type Family = 4 | 6;

/** A parsed address: its family and its value. */
export interface Ip {
  family: Family;
  value: bigint;
}

/** A parsed prefix (`10.0.0.0/8`): the address as written and the prefix length. */
export interface Cidr {
  ip: Ip;
  prefix: number;
}

const V4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;
const HEX = /^[0-9a-fA-F]{1,4}$/;

function parseV4(s: string): bigint | null {
  if (!V4.test(s)) return null;
  return s.split(".").reduce((acc, o) => (acc << 8n) | BigInt(Number(o)), 0n);
}

function parseV6(s: string): bigint | null {
  if (s.length > 45 || !s.includes(":")) return null;
  let tail: bigint | null = null;
  let text = s;
  const lastColon = s.lastIndexOf(":");
  if (s.slice(lastColon + 1).includes(".")) {
    tail = parseV4(s.slice(lastColon + 1));
    if (tail === null) return null;
    text = s.slice(0, lastColon + 1) + "0:0";
  }
  const halves = text.split("::");
  if (halves.length > 2) return null;
  const groups = (h: string) => (h === "" ? [] : h.split(":"));
  const head = groups(halves[0]);
  const rest = halves.length === 2 ? groups(halves[1]) : [];
  if ([...head, ...rest].some((g) => !HEX.test(g))) return null;
  const missing = 8 - head.length - rest.length;
  if (halves.length === 2 ? missing < 1 : missing !== 0) return null;
  const all = [...head, ...Array(halves.length === 2 ? missing : 0).fill("0"), ...rest];
  let v = all.reduce((acc, g) => (acc << 16n) | BigInt(parseInt(g, 16)), 0n);
  if (tail !== null) v = (v & ~0xffffffffn) | tail;
  return v;
}

/** Parses an address (no prefix); null when it is none. */
export function parseIp(s: string): Ip | null {
  const v4 = parseV4(s);
  if (v4 !== null) return { family: 4, value: v4 };
  const v6 = parseV6(s);
  return v6 === null ? null : { family: 6, value: v6 };
}

/** Whether `s` is an IPv4 or IPv6 address (no prefix). */
export function isIp(s: string): boolean {
  return parseIp(s) !== null;
}

/** The family of an address or prefix, or null when it is neither. */
export function familyOf(s: string): Family | null {
  const ip = parseIp(s.split("/")[0]);
  return ip ? ip.family : null;
}

const bits = (f: Family) => (f === 4 ? 32 : 128);

/** The canonical text of a parsed address (RFC 5952 for IPv6). */
export function formatIp(ip: Ip): string {
  if (ip.family === 4) {
    return [24n, 16n, 8n, 0n].map((sh) => String((ip.value >> sh) & 0xffn)).join(".");
  }
  const groups = Array.from(
    { length: 8 },
    (_, i) => Number((ip.value >> BigInt(112 - 16 * i)) & 0xffffn),
  );
  // The longest run of two or more zero groups (the first of equals) becomes "::".
  let best = -1, bestLen = 1;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) [best, bestLen] = [i, j - i];
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best < 0) return hex.join(":");
  return `${hex.slice(0, best).join(":")}::${hex.slice(best + bestLen).join(":")}`;
}

/**
 * An address as the kernel's `%pI6` and `%pI4` print it (`/proc/net/nf_conntrack`): IPv4
 * dotted, IPv6 in eight groups of four hex digits, none left out.
 */
export function expandedIp(ip: Ip): string {
  if (ip.family === 4) return formatIp(ip);
  return Array.from(
    { length: 8 },
    (_, i) => ((ip.value >> BigInt(112 - 16 * i)) & 0xffffn).toString(16).padStart(4, "0"),
  ).join(":");
}

/** The canonical text of an address; the input itself when it is no address. */
export function normalizeIp(s: string): string {
  const ip = parseIp(s);
  return ip ? formatIp(ip) : s;
}

/** Parses `addr/prefix` (prefix required); null when it is not one. */
export function parseCidr(s: string): Cidr | null {
  const [addr, len, ...rest] = s.split("/");
  if (rest.length > 0 || len === undefined || !/^\d{1,3}$/.test(len)) return null;
  const ip = parseIp(addr);
  if (!ip) return null;
  const prefix = Number(len);
  return prefix <= bits(ip.family) ? { ip, prefix } : null;
}

/** Whether `s` is `addr/prefix` with a prefix valid for its family. */
export function isCidr(s: string): boolean {
  return parseCidr(s) !== null;
}

/** Whether `s` is an address, optionally with a prefix length valid for its family. */
export function isIpMaybePrefix(s: string): boolean {
  return s.includes("/") ? isCidr(s) : isIp(s);
}

function mask(f: Family, prefix: number): bigint {
  const host = BigInt(bits(f) - prefix);
  return ((1n << BigInt(bits(f))) - 1n) ^ ((1n << host) - 1n);
}

/** The network address of a prefix (`10.1.2.3/24` → 10.1.2.0). */
export function networkOf(c: Cidr): Ip {
  return { family: c.ip.family, value: c.ip.value & mask(c.ip.family, c.prefix) };
}

/** Whether a prefix has bits set past its length (`10.0.0.5/24`). */
export function hasHostBits(c: Cidr): boolean {
  return networkOf(c).value !== c.ip.value;
}

/** The prefix in canonical text, its host bits cleared (`10.0.0.5/24` → `10.0.0.0/24`). */
export function canonicalCidr(c: Cidr): string {
  return `${formatIp(networkOf(c))}/${c.prefix}`;
}

/** Whether `ip` lies in the prefix `c`. */
export function contains(c: Cidr, ip: Ip): boolean {
  return ip.family === c.ip.family && (ip.value & mask(ip.family, c.prefix)) === networkOf(c).value;
}

/** Whether two prefixes share an address (one contains the other's network). */
export function overlaps(a: Cidr, b: Cidr): boolean {
  return a.ip.family === b.ip.family && (contains(a, networkOf(b)) || contains(b, networkOf(a)));
}

/**
 * The `n`-th address of a prefix (0 is the network address).
 *
 * @throws {RangeError} when the prefix has no such address
 */
export function nthAddress(c: Cidr, n: number | bigint): Ip {
  const size = 1n << BigInt(bits(c.ip.family) - c.prefix);
  const k = BigInt(n);
  if (k < 0n || k >= size) {
    throw new RangeError(`Prefix "${canonicalCidr(c)}" has no address number ${k}`);
  }
  return { family: c.ip.family, value: networkOf(c).value + k };
}

/** How many addresses a prefix holds (capped at 2^30: more never matters here). */
export function prefixSize(c: Cidr): number {
  return 2 ** Math.min(bits(c.ip.family) - c.prefix, 30);
}

/** Whether `ip` lies in `subnet` and, when given, between `start` and `end` (inclusive). */
export function inRange(
  ip: string,
  range: { subnet: string; rangeStart?: string; rangeEnd?: string },
): boolean {
  const a = parseIp(ip);
  const c = parseCidr(range.subnet);
  if (!a || !c || !contains(c, a)) return false;
  const start = range.rangeStart ? parseIp(range.rangeStart) : null;
  const end = range.rangeEnd ? parseIp(range.rangeEnd) : null;
  if (start && (start.family !== a.family || a.value < start.value)) return false;
  if (end && (end.family !== a.family || a.value > end.value)) return false;
  return true;
}
