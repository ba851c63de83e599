import { assertEquals, assertThrows } from "../../../lib/assert.ts";
import { parseQuery, parseRecords, respond } from "./dnsd.ts";

/** A query of one question, as a stub resolver sends it (RD set). */
function query(id: number, name: string, type: number): Uint8Array {
  const labels = name.split(".").flatMap((l) => [l.length, ...new TextEncoder().encode(l)]);
  return new Uint8Array([
    id >> 8,
    id & 0xff,
    0x01,
    0,
    0,
    1,
    0,
    0,
    0,
    0,
    0,
    0,
    ...labels,
    0,
    0,
    type,
    0,
    1,
  ]);
}

Deno.test("dnsd answers A for its names, NODATA for other types, NXDOMAIN for the rest", () => {
  const records = parseRecords(["Web.default.svc.cluster.local.=10.96.0.80"]);
  const a = respond(query(0x1234, "web.default.svc.CLUSTER.local", 1), records)!;
  assertEquals([...a.subarray(0, 12)], [0x12, 0x34, 0x85, 0, 0, 1, 0, 1, 0, 0, 0, 0]);
  assertEquals([...a.subarray(a.length - 16)], [
    0xc0,
    12,
    0,
    1,
    0,
    1,
    0,
    0,
    0,
    5,
    0,
    4,
    10,
    96,
    0,
    80,
  ]);
  const aaaa = respond(query(7, "web.default.svc.cluster.local", 28), records)!;
  assertEquals([aaaa[3], aaaa[7]], [0, 0]);
  const nx = respond(query(8, "db.default.svc.cluster.local", 1), records)!;
  assertEquals([nx[3] & 0x0f, nx[7]], [3, 0]);
  assertEquals(parseQuery(new Uint8Array([1, 2, 0x81, 0, 0, 1])), null);
  const response = query(9, "web", 1);
  response[2] |= 0x80;
  assertEquals(respond(response, records), null);
  assertThrows(() => parseRecords(["web=10.96.0.300"]));
  assertThrows(() => parseRecords(["web"]));
});
