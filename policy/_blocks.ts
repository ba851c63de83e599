/**
 * An `ipBlock` as a list of disjoint prefixes: its CIDR with each `except` cut out. An
 * nftables interval set must not hold overlapping elements, and a set of prefixes is
 * also what a reader of `enim policy` can check an address against.
 *
 * @module
 */
import { canonicalCidr, type Cidr, contains, networkOf, parseCidr } from "../lib/ip.ts";

/** The prefixes of an ipBlock: family and canonical CIDRs, sorted; null when `cidr` is no CIDR. */
export interface BlockPrefixes {
  family: 4 | 6;
  prefixes: string[];
  /** Except entries that are no CIDR of the block's family (ignored). */
  invalid: string[];
}

/** Splits a prefix into its two halves. */
function halves(c: Cidr): [Cidr, Cidr] {
  const bits = c.ip.family === 4 ? 32 : 128;
  const net = networkOf(c);
  const prefix = c.prefix + 1;
  const step = 1n << BigInt(bits - prefix);
  return [
    { ip: net, prefix },
    { ip: { family: net.family, value: net.value + step }, prefix },
  ];
}

/** `p` minus `e`, as disjoint prefixes (`p` when they do not overlap). */
function subtract(p: Cidr, e: Cidr): Cidr[] {
  if (e.ip.family !== p.ip.family) return [p];
  if (e.prefix <= p.prefix) return contains(e, networkOf(p)) ? [] : [p];
  if (!contains(p, networkOf(e))) return [p];
  const [lo, hi] = halves(p);
  return contains(lo, networkOf(e)) ? [...subtract(lo, e), hi] : [lo, ...subtract(hi, e)];
}

/**
 * An except as the API server read it: an IPv4-mapped IPv6 CIDR (`::ffff:10.1.0.0/112`,
 * prefix 96 or longer) under an IPv4 block is the IPv4 CIDR it maps (`10.1.0.0/16`).
 * kube-apiserver before 1.33 accepts it (Go's `net.IPNet.Contains` reads the mapped
 * address as IPv4), and such objects survive upgrades; read as the other family it
 * would cut nothing, and the whole block would be admitted.
 */
function asBlockFamily(e: Cidr, family: 4 | 6): Cidr {
  if (family !== 4 || e.ip.family !== 6 || e.prefix < 96) return e;
  if (e.ip.value >> 32n !== 0xffffn) return e;
  return { ip: { family: 4, value: e.ip.value & 0xffffffffn }, prefix: e.prefix - 96 };
}

/**
 * The disjoint prefixes of `cidr` minus every `except` (an except outside the block cuts
 * nothing; host bits are cleared, as `ParseCIDRSloppy` does; an IPv4-mapped except under
 * an IPv4 block is its IPv4 CIDR); null when `cidr` is no CIDR.
 */
export function blockPrefixes(cidr: string, except: readonly string[] = []): BlockPrefixes | null {
  const block = parseCidr(cidr.trim());
  if (!block) return null;
  let parts: Cidr[] = [{ ip: networkOf(block), prefix: block.prefix }];
  const invalid: string[] = [];
  for (const text of except) {
    const parsed = parseCidr(text.trim());
    const e = parsed && asBlockFamily(parsed, block.ip.family);
    if (!e || e.ip.family !== block.ip.family) {
      invalid.push(text);
      continue;
    }
    parts = parts.flatMap((p) => subtract(p, e));
  }
  parts.sort((a, b) => (a.ip.value < b.ip.value ? -1 : a.ip.value > b.ip.value ? 1 : 0));
  return { family: block.ip.family, prefixes: parts.map(canonicalCidr), invalid };
}
