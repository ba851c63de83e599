/**
 * Addresses as the compiler handles them by the ten thousand: canonical text (what
 * lib/ip.ts's `normalizeIp` gives: dotted quad, RFC 5952 for IPv6) and a sort key (IPv4
 * before IPv6, then by value), without lib/ip.ts's BigInt arithmetic, which made
 * indexing 30,000 dual-stack pods and sorting their sets cost most of a full compile.
 * `_addr_test` holds it equal to lib/ip.ts.
 *
 * @module
 */

/** A parsed address: family, canonical text, and a key that sorts by family then value. */
export interface Addr {
  family: 4 | 6;
  text: string;
  key: string;
}

const hex = (n: number, width: number) => n.toString(16).padStart(width, "0");

/** The value of a hex digit's char code, or -1. */
function hexDigit(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

/** Dotted quad from `from` to the end (no leading zeros): its 32-bit value, or -1. */
function v4Value(s: string, from: number): number {
  let value = 0, octets = 0, i = from;
  while (octets < 4) {
    let v = 0, d = 0;
    const start = i;
    while (i < s.length && d < 4) {
      const c = s.charCodeAt(i);
      if (c < 48 || c > 57) break;
      v = v * 10 + (c - 48);
      d++;
      i++;
    }
    if (d === 0 || d > 3 || v > 255 || (d > 1 && s.charCodeAt(start) === 48)) return -1;
    value = value * 256 + v;
    octets++;
    if (octets < 4) {
      if (s.charCodeAt(i) !== 46) return -1;
      i++;
    }
  }
  return i === s.length ? value : -1;
}

/** The 8 groups of an IPv6 address (an IPv4 tail allowed), or null. */
function v6Groups(s: string): number[] | null {
  const n = s.length;
  if (n < 2 || n > 45) return null;
  const g: number[] = [];
  let gap = -1, i = 0;
  if (s.charCodeAt(0) === 58) {
    if (s.charCodeAt(1) !== 58) return null;
    gap = 0;
    i = 2;
  }
  while (i < n) {
    let v = 0, d = 0, j = i;
    for (; j < n; j++) {
      const h = hexDigit(s.charCodeAt(j));
      if (h < 0) break;
      v = v * 16 + h;
      d++;
    }
    if (j < n && s.charCodeAt(j) === 46) {
      const v4 = v4Value(s, i);
      if (v4 < 0 || g.length > 6) return null;
      g.push(v4 >>> 16, v4 & 0xffff);
      i = n;
      break;
    }
    if (d === 0 || d > 4) return null;
    g.push(v);
    i = j;
    if (i === n) break;
    if (s.charCodeAt(i) !== 58) return null;
    i++;
    if (s.charCodeAt(i) === 58) {
      if (gap >= 0) return null;
      gap = g.length;
      i++;
    } else if (i === n) return null;
  }
  if (gap < 0) return g.length === 8 ? g : null;
  if (g.length > 7) return null;
  return [...g.slice(0, gap), ...Array<number>(8 - g.length).fill(0), ...g.slice(gap)];
}

function formatV6(g: number[]): string {
  // The longest run of two or more zero groups (the first of equals) becomes "::".
  let best = -1, bestLen = 1;
  for (let i = 0; i < 8;) {
    if (g[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && g[j] === 0) j++;
    if (j - i > bestLen) [best, bestLen] = [i, j - i];
    i = j;
  }
  const h = g.map((x) => x.toString(16));
  if (best < 0) return h.join(":");
  return `${h.slice(0, best).join(":")}::${h.slice(best + bestLen).join(":")}`;
}

/** Parses an address (no prefix, no zone); null when it is none. */
export function parseAddr(s: string): Addr | null {
  const v4 = s.includes(":") ? -1 : v4Value(s, 0);
  if (v4 >= 0) return { family: 4, text: s, key: `4${hex(v4, 8)}` };
  const g = s.includes(":") ? v6Groups(s) : null;
  if (!g) return null;
  return { family: 6, text: formatV6(g), key: `6${g.map((x) => hex(x, 4)).join("")}` };
}

/** The sort key of a canonical address (or of any text: itself, after every address). */
export function addrKey(s: string): string {
  return parseAddr(s)?.key ?? `9${s}`;
}

/** Canonical addresses sorted by family then value (each key computed once). */
export function sortAddrs(list: Iterable<string>): string[] {
  return [...list].map((a) => [addrKey(a), a]).sort((
    x,
    y,
  ) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0))
    .map(([, a]) => a);
}

/** Address-and-port pairs sorted by address, then port. */
export function sortAddrPorts<T extends { addr: string; port: number }>(list: Iterable<T>): T[] {
  return [...list].map((e) => [`${addrKey(e.addr)}:${hex(e.port, 4)}`, e] as const)
    .sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0)).map(([, e]) => e);
}
