import { DatabaseSync } from "node:sqlite";
import { loadProvider, ProviderNameSchema, PROVIDERS } from "./registry.ts";
import { nullLogger } from "../lib/log.ts";
import { assert, assertEquals, assertRejects } from "../lib/assert.ts";
import * as z from "zod/mini";

Deno.test("the registry names every provider and the enum matches", () => {
  assertEquals(Object.keys(PROVIDERS).sort(), [...ProviderNameSchema.options].sort());
  assert(!ProviderNameSchema.safeParse("aws").success);
});

Deno.test("loadProvider() loads the mock, whose config schema applies defaults", async () => {
  const mod = await loadProvider("mock");
  const db = new DatabaseSync(":memory:");
  try {
    const p = await mod.create(z.parse(mod.configSchema, { enis: 2 }), { db, log: nullLogger });
    assertEquals(p.name, "mock");
    assertEquals((await p.list()).length, 2);
    await p.close();
  } finally {
    db.close();
  }
});

Deno.test("loadProvider() refuses an unknown name with the list of known ones", async () => {
  const e = await assertRejects(() => loadProvider("nope" as "mock"));
  assert(/Unknown provider "nope": expected one of mock, bce/.test(e.message), e.message);
});

Deno.test("loadProvider() loads the bce module", async () => {
  const mod = await loadProvider("bce");
  assert(typeof mod.create === "function" && mod.configSchema !== undefined);
});
