/**
 * Would this packet be allowed? The meaning of a compiled policy as a pure function —
 * what the rendered nftables rules do to the first packet of a connection (replies of
 * an allowed connection always pass). The tests judge the compiler with it; `enim
 * policy` can answer "may A reach B on port P" with it.
 *
 * @module
 */
import { contains, formatIp, parseCidr, parseIp } from "../lib/ip.ts";
import type { CompiledPolicy, Entry, PeerSet } from "./types.ts";

/** The first packet of a connection, seen from the local pod. */
export interface Probe {
  /** Ingress: `peer` is the source; egress: the destination. */
  direction: "ingress" | "egress";
  /** The other end's address. */
  peer: string;
  /** `TCP`, `UDP`, `SCTP`, or another protocol (`ICMP`): no port matcher admits it. */
  protocol: string;
  /** The destination port (TCP, UDP, SCTP). */
  port?: number;
}

function inSet(set: PeerSet, addr: string, p: Probe): boolean {
  const ip = parseIp(addr)!;
  const list = ip.family === 4 ? set.ipv4 : set.ipv6;
  if (set.kind === "namedPort") {
    return p.protocol === set.protocol &&
      (list as { addr: string; port: number }[]).some((e) => e.addr === addr && e.port === p.port);
  }
  if (set.kind === "pods") return (list as string[]).includes(addr);
  return (list as string[]).some((c) => contains(parseCidr(c)!, ip));
}

function entryAdmits(e: Entry, c: CompiledPolicy, addr: string, p: Probe): boolean {
  if (e.peer !== null) {
    const set = c.sets.find((s) => s.key === e.peer);
    if (!set || !inSet(set, addr, p)) return false;
    if (set.kind === "namedPort") return true;
  }
  if (e.ports === null) return true;
  return e.ports.some((m) =>
    m.protocol === p.protocol && m.name === undefined &&
    (m.port === undefined ||
      (p.port !== undefined && p.port >= m.port && p.port <= (m.endPort ?? m.port)))
  );
}

/** Whether the local pod's policy admits `p` (its node and itself always; replies aside). */
export function admits(c: CompiledPolicy, p: Probe): boolean {
  const ip = parseIp(p.peer);
  if (!ip) throw new TypeError(`Invalid peer address "${p.peer}"`);
  const addr = formatIp(ip);
  const fam = ip.family === 4 ? "ipv4" : "ipv6";
  if (c.node[fam].includes(addr) || c.pod[fam].includes(addr)) return true;
  const d = c[p.direction];
  return !d.isolated || d.entries.some((e) => entryAdmits(e, c, addr, p));
}

/** One end of a connection: its address and, for a local pod, its compiled policy. */
export interface End {
  /** Its address. */
  addr: string;
  /** Its compiled policy, when it is a local pod (absent: it admits everything). */
  policy?: CompiledPolicy;
}

/**
 * Whether a connection from `src` to `dst` is allowed: the source's egress and the
 * destination's ingress must both admit it (an end without a policy admits everything).
 */
export function connectionAllowed(
  src: End,
  dst: End,
  protocol: string,
  port?: number,
): boolean {
  const out = !src.policy ||
    admits(src.policy, { direction: "egress", peer: dst.addr, protocol, port });
  const inn = !dst.policy ||
    admits(dst.policy, { direction: "ingress", peer: src.addr, protocol, port });
  return out && inn;
}
