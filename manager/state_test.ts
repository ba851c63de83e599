import { openDatabase } from "../lib/sqlite.ts";
import { SCHEMA_VERSION, StateStore, toAttachment } from "./state.ts";
import { AttachmentSchema } from "../api/schema.ts";
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
        (db.prepare("SELECT count(*) AS n FROM enim_migrations WHERE component = 'state'")
          .get() as { n: number }).n,
        SCHEMA_VERSION,
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
      db.prepare("INSERT INTO enim_migrations VALUES ('state', ?, 0)").run(SCHEMA_VERSION + 1);
      const e = assertThrows(() => StateStore.open(db));
      assert(/schema version/.test(e.message), e.message);
    } finally {
      db.close();
    }
  }));

Deno.test("StateStore takes over a database of an agent before profiles, rows kept", () =>
  withDbFile((path) => {
    const db = openDatabase(path);
    try {
      // What agents before per-component versions left: enim_schema v1 and its table.
      db.exec(`CREATE TABLE enim_schema (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL);
        INSERT INTO enim_schema VALUES (1, 0);
        CREATE TABLE attachments (
          container_id TEXT NOT NULL, if_name TEXT NOT NULL, pod TEXT NOT NULL, pod_uid TEXT,
          network TEXT NOT NULL, netns TEXT NOT NULL, netns_dev INTEGER, netns_ino INTEGER,
          mode TEXT NOT NULL CHECK (mode IN ('interface', 'ipam')),
          state TEXT NOT NULL CHECK (state IN ('adding', 'ready', 'recycling', 'deleting')),
          eni_id TEXT, mac TEXT, node_name TEXT, ifindex INTEGER, result TEXT,
          recycle_since INTEGER, gc_failures INTEGER NOT NULL DEFAULT 0, last_error TEXT,
          created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
          PRIMARY KEY (container_id, if_name));
        INSERT INTO attachments (container_id, if_name, pod, network, netns, mode, state, eni_id,
          mac, result, created_at, updated_at)
          VALUES ('c1', 'eth0', 'default/web-0', 'enim', '/run/netns/p1', 'interface', 'ready',
          'eni-1', '02:00:00:00:00:01', '{}', 5, 5);`);
      const s = StateStore.open(db);
      assertEquals(s.version(), SCHEMA_VERSION);
      const row = s.get(A)!;
      assertEquals([row.state, row.eniId, row.profile, row.sticky, row.holdUntil], [
        "ready",
        "eni-1",
        "default",
        false,
        null,
      ]);
      s.markHeld(A, 99);
      assertEquals(s.get(A)?.state, "held", "the new state is allowed after the rebuild");
    } finally {
      db.close();
    }
  }));

Deno.test("StateStore takes a version-3 database of either line to version 4, rows kept", async (t) => {
  // Version 3 was main's park_until (zone-wide sticky) and, on the issue-27 branch, the
  // host link's host_link: version 4 adds whichever of the two the database lacks.
  for (const lacks of ["host_link", "park_until"]) {
    await t.step(`version 3 without ${lacks}`, () =>
      withDbFile((path) => {
        let db = openDatabase(path);
        StateStore.open(db).insertAdding(A);
        db.exec(`ALTER TABLE attachments DROP COLUMN ${lacks};
          DELETE FROM enim_migrations WHERE component = 'state' AND version = 4;`);
        db.close();
        db = openDatabase(path);
        try {
          const s = StateStore.open(db);
          assertEquals(s.version(), SCHEMA_VERSION);
          const columns = db.prepare("SELECT name FROM pragma_table_info('attachments')").all()
            .map((r) => r.name);
          assert(columns.includes("host_link") && columns.includes("park_until"), String(columns));
          const row = s.get(A)!;
          assertEquals([row.state, row.parkUntil, row.hostLink], ["adding", null, null]);
        } finally {
          db.close();
        }
      }));
  }
});

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
