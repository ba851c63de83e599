import { assertEquals, assertThrows } from "../lib/assert.ts";
import { Store } from "./store.ts";

interface O {
  key: string;
  ips: string[];
  rv: number;
}
const o = (key: string, rv: number, ...ips: string[]): O => ({ key, ips, rv });
const names = (xs: O[]) => xs.map((x) => x.key).sort();

Deno.test("the store finds objects by key and by index, and forgets what it removes", () => {
  const s = new Store<O>((x) => x.key, { ip: (x) => x.ips });
  s.upsert(o("a", 1, "10.0.0.1"));
  s.upsert(o("b", 1, "10.0.0.2", "fd00::2"));
  s.upsert(o("host", 1, "10.0.0.2")); // a host-network pod shares an IP
  assertEquals(names(s.byIndex("ip", "10.0.0.2")), ["b", "host"]);
  assertEquals(names(s.byIndex("ip", "fd00::2")), ["b"]);
  const old = s.upsert(o("b", 2, "10.0.0.3"));
  assertEquals(old?.rv, 1);
  assertEquals(names(s.byIndex("ip", "10.0.0.2")), ["host"]);
  assertEquals(s.byIndex("ip", "fd00::2"), []);
  s.remove("host");
  assertEquals(s.byIndex("ip", "10.0.0.2"), []);
  assertEquals(s.indexValues("ip").sort(), ["10.0.0.1", "10.0.0.3"]);
  assertEquals([s.size, s.get("a")?.rv, s.remove("nope")], [2, 1, undefined]);
  assertThrows(() => s.byIndex("node", "x"));
});

Deno.test("replace() makes the store the list and returns adds, changed updates and deletes", () => {
  const s = new Store<O>((x) => x.key, { ip: (x) => x.ips });
  s.upsert(o("same", 1, "10.0.0.1"));
  s.upsert(o("changed", 1, "10.0.0.2"));
  s.upsert(o("gone", 1, "10.0.0.3"));
  const changes = s.replace(
    [o("same", 1, "10.0.0.1"), o("changed", 2, "10.0.0.4"), o("new", 1, "10.0.0.5")],
    (a, b) => a.rv !== b.rv,
  );
  assertEquals(
    changes.map(([a, b]) => `${a?.key ?? "-"}@${a?.rv ?? ""} ${b?.key ?? "-"}@${b?.rv ?? ""}`),
    ["changed@1 changed@2", "-@ new@1", "gone@1 -@"],
  );
  assertEquals(names([...s.values()]), ["changed", "new", "same"]);
  assertEquals(s.byIndex("ip", "10.0.0.3"), []);
  assertEquals(names(s.byIndex("ip", "10.0.0.4")), ["changed"]);
});
