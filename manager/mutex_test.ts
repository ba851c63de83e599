import { KeyedMutex } from "./mutex.ts";
import { assertEquals } from "../lib/assert.ts";

const tick = () => new Promise((r) => setTimeout(r, 1));

Deno.test("KeyedMutex serializes one key and runs different keys in parallel", async () => {
  const m = new KeyedMutex();
  const log: string[] = [];
  const job = (key: string, name: string) =>
    m.run(key, async () => {
      log.push(`${name}+`);
      await tick();
      log.push(`${name}-`);
    });
  await Promise.all([job("a", "a1"), job("a", "a2"), job("b", "b1")]);
  const at = (x: string) => log.indexOf(x);
  assertEquals(at("a2+") > at("a1-"), true, "a2 waited for a1");
  assertEquals(at("b1+") < at("a1-"), true, "b1 ran while a1 held its key");
  assertEquals(m.size, 0);
});

Deno.test("KeyedMutex releases a key when the holder throws", async () => {
  const m = new KeyedMutex();
  await m.run("a", () => Promise.reject(new Error("x"))).catch(() => {});
  assertEquals(await m.run("a", () => Promise.resolve(1)), 1);
  assertEquals(m.busy("a"), false);
});

Deno.test("KeyedMutex.runAll() takes several keys without deadlock", async () => {
  const m = new KeyedMutex();
  let n = 0;
  await Promise.all([
    m.runAll(["x", "y"], async () => (await tick(), n++)),
    m.runAll(["y", "x"], async () => (await tick(), n++)),
  ]);
  assertEquals(n, 2);
});
