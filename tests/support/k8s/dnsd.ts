/**
 * A small authoritative DNS server (UDP, A records) for cluster DNS on the real node
 * (tests/k8s_real_node_lifecycle_test.ts): Debian's busybox-static has no `dnsd`, and
 * CoreDNS is not built here. It runs in a pod of enim's own image, by the image's deno
 * (`/usr/local/lib/enim/deno run`), from a ConfigMap: so it imports nothing but Node's
 * built-ins (no npm in the pod).
 *
 * ```sh
 * deno run --allow-net --allow-env dnsd.ts web.default.svc.cluster.local=10.96.0.80 …
 * ```
 *
 * Each argument is `name=a.b.c.d`. A question for a listed name is answered with its
 * address (type A) or with no record (other types: NOERROR, NODATA); any other name with
 * NXDOMAIN; a message that is not one well-formed question is dropped. Each question is
 * logged as a JSON line (`{"from", "name", "type", "rcode"}`) on stdout. Port 53, or
 * `DNS_PORT`.
 *
 * @module
 */
import dgram from "node:dgram";

const TYPE_A = 1;
const CLASS_IN = 1;
const TTL_SECONDS = 5;

/** The records of `name=a.b.c.d` arguments (names lower case, without a final dot). */
export function parseRecords(args: string[]): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const a of args) {
    const m = /^([a-z0-9][a-z0-9.-]*?)\.?=(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/i.exec(a);
    const ip = m?.slice(2).map(Number);
    if (!m || !ip || ip.some((n) => n > 255)) throw new Error(`"${a}" is not name=a.b.c.d`);
    out.set(m[1].toLowerCase(), ip);
  }
  return out;
}

/** A query's one question: its name (lower case), type, and where it ends in the message. */
export interface Question {
  name: string;
  type: number;
  end: number;
}

/** The question of `msg`, or null when it is not a query of exactly one question. */
export function parseQuery(msg: Uint8Array): Question | null {
  if (msg.length < 12) return null;
  const isResponse = (msg[2] & 0x80) !== 0;
  const opcode = (msg[2] >> 3) & 0x0f;
  const questions = (msg[4] << 8) | msg[5];
  if (isResponse || opcode !== 0 || questions !== 1) return null;
  const labels: string[] = [];
  let i = 12;
  for (;;) {
    if (i >= msg.length) return null;
    const len = msg[i];
    if (len === 0) break;
    // No compression in a question of one name; 63 is a label's limit.
    if (len > 63 || i + 1 + len > msg.length) return null;
    labels.push(new TextDecoder().decode(msg.subarray(i + 1, i + 1 + len)));
    i += 1 + len;
  }
  if (i + 5 > msg.length) return null;
  return { name: labels.join(".").toLowerCase(), type: (msg[i + 1] << 8) | msg[i + 2], end: i + 5 };
}

/** The response to `msg` (see the module doc), or null to drop it. */
export function respond(msg: Uint8Array, records: Map<string, number[]>): Uint8Array | null {
  const q = parseQuery(msg);
  if (!q) return null;
  const ip = records.get(q.name);
  const answers = ip && q.type === TYPE_A ? 1 : 0;
  const out = new Uint8Array(q.end + answers * 16);
  // The header and the question as asked; no additional records (an EDNS OPT is dropped).
  out.set(msg.subarray(0, q.end));
  out[2] = 0x84 | (msg[2] & 0x01); // a response, authoritative, RD as asked
  out[3] = ip ? 0 : 3; // NOERROR or NXDOMAIN
  out.set([0, 1, 0, answers, 0, 0, 0, 0], 4);
  if (ip && answers) {
    // The name as a pointer to the question's (offset 12).
    out.set([0xc0, 12, 0, TYPE_A, 0, CLASS_IN, 0, 0, 0, TTL_SECONDS, 0, 4, ...ip], q.end);
  }
  return out;
}

if (import.meta.main) {
  const port = Number(Deno.env.get("DNS_PORT") ?? "53");
  const records = parseRecords(Deno.args);
  const socket = dgram.createSocket("udp4");
  socket.on("message", (msg: Uint8Array, from: { address: string; port: number }) => {
    const q = parseQuery(msg);
    const res = respond(msg, records);
    console.log(JSON.stringify({
      from: from.address,
      name: q?.name ?? null,
      type: q?.type ?? null,
      rcode: res ? res[3] & 0x0f : null,
    }));
    if (res) socket.send(res, from.port, from.address);
  });
  socket.bind(port, "0.0.0.0", () => {
    console.log(JSON.stringify({ msg: "listening", port, names: [...records.keys()] }));
  });
}
