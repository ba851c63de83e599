/**
 * The smallest DNS of the tests (RFC 1035): one question per message, class IN; queries
 * parsed (checked by a zod schema) and answered with the A records of a fixed table, and
 * queries built and their answers parsed, for a client that shows which resolver answers.
 *
 * A name of the table gets its A record (NOERROR, even for other types: no data); any other
 * name NXDOMAIN. Nothing else (no recursion, no TCP, no compression of written names).
 *
 * @module
 */
import { z } from "zod";

/** Record type A (RFC 1035) and AAAA (RFC 3596). */
export const TYPE_A = 1;
export const TYPE_AAAA = 28;
const CLASS_IN = 1;

/** A DNS message's header and its one question, as this module reads them. */
export const DnsMessageSchema = z.object({
  id: z.int().min(0).max(0xffff),
  /** Whether it is a response. */
  qr: z.boolean(),
  /** Only standard queries (0). */
  opcode: z.literal(0),
  rcode: z.int().min(0).max(15),
  qdcount: z.literal(1),
  ancount: z.int().min(0),
  /** The question's name, lower case, without the final dot. */
  name: z.string().max(253),
  qtype: z.int().min(0).max(0xffff),
  qclass: z.literal(CLASS_IN),
  /** The A records of the answer section (responses). */
  addresses: z.array(z.ipv4()),
});
/** A parsed DNS message. */
export type DnsMessage = z.infer<typeof DnsMessageSchema>;

/** Reads a name at `off` (labels; a compression pointer followed once); returns it and the offset after it. */
function readName(b: Uint8Array, off: number): [string, number] {
  const labels: string[] = [];
  let end = -1;
  for (let hops = 0; hops < 64; hops++) {
    if (off >= b.length) throw new Error("truncated name");
    const len = b[off];
    if (len === 0) return [labels.join("."), end >= 0 ? end : off + 1];
    if ((len & 0xc0) === 0xc0) {
      if (off + 1 >= b.length) throw new Error("truncated pointer");
      if (end < 0) end = off + 2;
      off = ((len & 0x3f) << 8) | b[off + 1];
      continue;
    }
    if (len > 63 || off + 1 + len > b.length) throw new Error("bad label");
    labels.push(new TextDecoder().decode(b.subarray(off + 1, off + 1 + len)).toLowerCase());
    off += 1 + len;
  }
  throw new Error("name too long");
}

/** Parses a message with one question (and, for a response, its A answers). */
export function parseDnsMessage(b: Uint8Array): DnsMessage {
  if (b.length < 12) throw new Error(`A DNS message of ${b.length} bytes`);
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const flags = v.getUint16(2);
  const [name, after] = readName(b, 12);
  if (after + 4 > b.length) throw new Error("truncated question");
  const ancount = v.getUint16(6);
  const addresses: string[] = [];
  let off = after + 4;
  for (let i = 0; i < ancount; i++) {
    const [, rrAfter] = readName(b, off);
    if (rrAfter + 10 > b.length) throw new Error("truncated record");
    const type = v.getUint16(rrAfter);
    const rdlen = v.getUint16(rrAfter + 8);
    const rdata = rrAfter + 10;
    if (rdata + rdlen > b.length) throw new Error("truncated rdata");
    if (type === TYPE_A && rdlen === 4) addresses.push([...b.subarray(rdata, rdata + 4)].join("."));
    off = rdata + rdlen;
  }
  return DnsMessageSchema.parse({
    id: v.getUint16(0),
    qr: (flags & 0x8000) !== 0,
    opcode: (flags >> 11) & 0xf,
    rcode: flags & 0xf,
    qdcount: v.getUint16(4),
    ancount,
    name,
    qtype: v.getUint16(after),
    qclass: v.getUint16(after + 2),
    addresses,
  });
}

function writeName(name: string): number[] {
  const out: number[] = [];
  for (const label of name.split(".").filter(Boolean)) {
    const bytes = new TextEncoder().encode(label);
    if (bytes.length > 63) throw new Error(`label "${label}" is longer than 63 bytes`);
    out.push(bytes.length, ...bytes);
  }
  out.push(0);
  return out;
}

const u16 = (n: number) => [(n >> 8) & 0xff, n & 0xff];

/** A standard query for `name` (recursion desired). */
export function buildQuery(id: number, name: string, qtype = TYPE_A): Uint8Array {
  return new Uint8Array([
    ...u16(id),
    ...u16(0x0100),
    ...u16(1),
    ...u16(0),
    ...u16(0),
    ...u16(0),
    ...writeName(name),
    ...u16(qtype),
    ...u16(CLASS_IN),
  ]);
}

/**
 * The answer to `query` from `table` (lower-case name → IPv4 address): its A record for
 * an A question of a known name, no data for another type of it, NXDOMAIN otherwise.
 */
export function answer(query: DnsMessage, table: Record<string, string>): Uint8Array {
  const address = table[query.name];
  const rcode = address === undefined ? 3 : 0;
  const records = address !== undefined && query.qtype === TYPE_A ? [address] : [];
  const qname = writeName(query.name);
  const out = [
    ...u16(query.id),
    // QR, opcode 0, AA, RD, RA.
    ...u16(0x8000 | 0x0400 | 0x0100 | 0x0080 | rcode),
    ...u16(1),
    ...u16(records.length),
    ...u16(0),
    ...u16(0),
    ...qname,
    ...u16(query.qtype),
    ...u16(CLASS_IN),
  ];
  for (const a of records) {
    // A pointer to the question's name (offset 12), type A, class IN, TTL 5 s.
    out.push(0xc0, 12, ...u16(TYPE_A), ...u16(CLASS_IN), 0, 0, 0, 5, ...u16(4));
    out.push(...z.ipv4().parse(a).split(".").map(Number));
  }
  return new Uint8Array(out);
}
