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

Deno.test("KeyedMutex.progress() moves when a key is taken or released, and counts what is held or waited for", async () => {
  let clock = 100;
  const m = new KeyedMutex(() => clock);
  assertEquals(m.progress(), { busy: 0, movedAt: 100 });
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  clock = 200;
  const first = m.run("a", () => held);
  await tick();
  assertEquals(m.progress(), { busy: 1, movedAt: 200 }, "taken");
  clock = 300;
  const second = m.run("a", () => Promise.resolve());
  await tick();
  assertEquals(m.progress(), { busy: 1, movedAt: 200 }, "a waiter alone moves nothing");
  clock = 400;
  release();
  await Promise.all([first, second]);
  assertEquals(m.progress(), { busy: 0, movedAt: 400 }, "released, taken by the waiter, released");
});
