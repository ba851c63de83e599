import { openDatabase } from "../lib/sqlite.ts";
import { SCHEMA_VERSION, StateStore, toAttachment } from "./state.ts";
import { AttachmentSchema } from "./api_schema.ts";
import { assert, assertEquals, assertThrows } from "../lib/assert.ts";

async function withDbFile(fn: (path: string) => Promise<void> | void) {
  const dir = await Deno.makeTempDir({ prefix: "enim-state-" });
  try {
    await fn(`${dir}/enim.db`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const A = {
  containerId: "c1",
  ifName: "eth0",
  pod: "default/web-0",
  podUid: "u1",
  network: "enim",
  netns: "/run/netns/p1",
  mode: "interface" as const,
};

Deno.test("StateStore migrates a database file once and reopens it idempotently", () =>
  withDbFile((path) => {
    let db = openDatabase(path);
    const s = StateStore.open(db);
    assertEquals(s.version(), SCHEMA_VERSION);
    assertEquals(
      (db.prepare("PRAGMA journal_mode").get() as { journal_mode: string }).journal_mode,
      "wal",
    );
    assertEquals(
      (db.prepare("PRAGMA foreign_keys").get() as { foreign_keys: number }).foreign_keys,
      1,
    );
    s.insertAdding(A);
    db.close();
    for (let i = 0; i < 2; i++) {
      db = openDatabase(path);
      const again = StateStore.open(db);
      assertEquals(again.version(), SCHEMA_VERSION);
      assertEquals(
        (db.prepare("SELECT count(*) AS n FROM enim_schema").get() as { n: number }).n,
        1,
      );
      assertEquals(again.get(A)?.state, "adding");
      db.close();
    }
  }));

Deno.test("StateStore refuses a database from a newer enim", () =>
  withDbFile((path) => {
    const db = openDatabase(path);
    try {
      StateStore.open(db);
      db.prepare("INSERT INTO enim_schema VALUES (?, 0)").run(SCHEMA_VERSION + 1);
      const e = assertThrows(() => StateStore.open(db));
      assert(/schema version/.test(e.message), e.message);
    } finally {
      db.close();
    }
  }));

Deno.test("StateStore records intent, outcome and recycling in transactions", () =>
  withDbFile((path) => {
    let t = 1000;
    const db = openDatabase(path);
    try {
      const s = StateStore.open(db, () => t);
      s.insertAdding(A);
      assertThrows(() => s.insertAdding(A), "a second intent for the key is refused");
      // ready needs an ENI and a result
      assertThrows(() => s.update(A, { state: "ready" }));
      s.update(A, { eniId: "eni-1", mac: "02:00:00:00:00:01" });
      t = 2000;
      assertEquals(s.markReady(A, A.pod, { result: "{}", nodeName: "eth1", ifindex: 5 }), []);
      const B = { ...A, containerId: "c2" };
      s.insertAdding(B);
      s.update(B, { eniId: "eni-2" });
      // The same ENI recorded twice is refused by the unique index.
      assertThrows(() => s.update({ ...A, containerId: "c2" }, { eniId: "eni-1" }));
      t = 3000;
      assertEquals(s.markReady(B, B.pod, { result: "{}" }), [{
        containerId: "c1",
        ifName: "eth0",
      }]);
      const a = s.get(A)!;
      assertEquals([a.state, a.recycleSince, a.updatedAt, a.createdAt], [
        "recycling",
        3000,
        3000,
        1000,
      ]);
      assertEquals(s.byEni("eni-2")?.containerId, "c2");
      assertEquals(s.byPod(A.pod).length, 2);
      assertEquals(s.inState("recycling").map((r) => r.containerId), ["c1"]);
      s.recordFailure(A, "boom");
      s.recordFailure(A, "boom again");
      assertEquals([s.get(A)!.gcFailures, s.get(A)!.lastError], [2, "boom again"]);
      AttachmentSchema.parse(toAttachment(s.get(A)!));
      const before = s.dump();
      s.delete({ containerId: "nope", ifName: "eth0" });
      assertEquals(s.dump(), before);
      s.delete(A);
      assertEquals(s.get(A), null);
      assertEquals(s.all().length, 1);
    } finally {
      db.close();
    }
  }));

Deno.test("StateStore sees another connection's committed writes (one file, two handles)", () =>
  withDbFile((path) => {
    const db1 = openDatabase(path);
    const db2 = openDatabase(path);
    try {
      const s1 = StateStore.open(db1);
      const s2 = StateStore.open(db2);
      s1.insertAdding(A);
      assertEquals(s2.get(A)?.pod, A.pod);
    } finally {
      db1.close();
      db2.close();
    }
  }));
