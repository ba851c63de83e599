import { DatabaseSync } from "node:sqlite";
import { assertEquals, assertStringIncludes, assertThrows } from "../../lib/assert.ts";
import { BceStore, MIGRATIONS } from "./_store.ts";

/** The tables as the first releases made them (before versioning, before lost ENIs). */
const FIRST_RELEASE_SCHEMA = `
CREATE TABLE bce_enis (
  eni_id TEXT PRIMARY KEY, mac TEXT NOT NULL, subnet_id TEXT, ipv4 TEXT, ipv6 TEXT,
  pod TEXT, container_id TEXT, if_name TEXT, updated_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX bce_enis_owner ON bce_enis(pod, container_id, if_name) WHERE pod IS NOT NULL;
CREATE TABLE bce_intents (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, client_token TEXT NOT NULL, name TEXT NOT NULL,
  eni_id TEXT, requested_ip TEXT, purpose TEXT NOT NULL, phase TEXT NOT NULL DEFAULT 'active',
  created_ms INTEGER NOT NULL
);
CREATE TABLE bce_quarantine (
  eni_id TEXT PRIMARY KEY, status TEXT NOT NULL, reason TEXT NOT NULL, since_ms INTEGER NOT NULL,
  last_try_ms INTEGER NOT NULL, tries INTEGER NOT NULL DEFAULT 1
);`;

const ADDR = JSON.stringify({ address: "10.0.1.5", prefixLength: 24, gateway: "10.0.1.1" });

function preProfilesDb(withLostColumns: boolean): DatabaseSync {
  const db = new DatabaseSync(":memory:");
  db.exec(FIRST_RELEASE_SCHEMA);
  if (withLostColumns) {
    db.exec("ALTER TABLE bce_enis ADD COLUMN lost_reason TEXT");
    db.exec("ALTER TABLE bce_enis ADD COLUMN lost_ms INTEGER");
  }
  db.prepare(
    "INSERT INTO bce_enis (eni_id, mac, subnet_id, ipv4, ipv6, pod, container_id, if_name, updated_ms) VALUES (?, ?, ?, ?, NULL, ?, ?, ?, 1)",
  ).run("eni-owned00001", "fa:f6:00:00:00:01", "sbn-a", ADDR, "default/web", "c1", "eth0");
  db.prepare(
    "INSERT INTO bce_enis (eni_id, mac, subnet_id, ipv4, ipv6, pod, container_id, if_name, updated_ms) VALUES (?, ?, ?, NULL, NULL, NULL, NULL, NULL, 2)",
  ).run("eni-free000001", "fa:f6:00:00:00:02", "sbn-a");
  db.prepare(
    "INSERT INTO bce_intents (id, kind, client_token, name, eni_id, requested_ip, purpose, phase, created_ms) VALUES ('t1', 'create', 't1', 'enim/i-1/abc123', NULL, '10.0.1.9', 'owner', 'active', 3)",
  ).run();
  return db;
}

Deno.test("a database from before profiles migrates in place and keeps its rows as profile default", async (t) => {
  for (const withLost of [false, true]) {
    await t.step(withLost ? "with the lost-ENI columns" : "from the first releases", () => {
      const db = preProfilesDb(withLost);
      try {
        const store = new BceStore(db);
        const rows = store.rows();
        assertEquals(rows.map((r) => [r.eni_id, r.profile, r.pod, r.lost_reason]), [
          ["eni-free000001", "default", null, null],
          ["eni-owned00001", "default", "default/web", null],
        ]);
        assertEquals(
          rows.map((r) => [r.name, r.security_groups, r.enterprise_security_groups, r.description]),
          [[null, null, null, null], [null, null, null, null]],
          "groups NULL: the profile's own, as created",
        );
        assertEquals(rows[1].ipv4, ADDR);
        const [intent] = store.intents();
        assertEquals(
          [
            intent.id,
            intent.profile,
            intent.requested_ip,
            intent.requested_ip6,
            intent.after_release,
          ],
          ["t1", "default", "10.0.1.9", null, null],
        );
        assertEquals(store.intentSlots(), 1);
        const versions = db.prepare(
          "SELECT version FROM enim_migrations WHERE component = 'bce' ORDER BY version",
        ).all().map((r) => r.version);
        assertEquals(versions, [1, 2, 3]);
        // Opening it again changes nothing; the new columns work.
        const again = new BceStore(db);
        again.setGroups("eni-free000001", {
          securityGroupIds: ["g-x"],
          enterpriseSecurityGroupIds: [],
        }, 5);
        assertEquals(again.row("eni-free000001")?.security_groups, ["g-x"]);
        assertEquals(again.freeRows("default").map((r) => r.eni_id), ["eni-free000001"]);
        assertEquals(again.freeRows("other"), []);
      } finally {
        db.close();
      }
    });
  }
});

Deno.test("a fresh database gets the newest schema; a newer one is refused", () => {
  const db = new DatabaseSync(":memory:");
  try {
    new BceStore(db);
    const v = db.prepare("SELECT max(version) AS v FROM enim_migrations WHERE component = 'bce'")
      .get();
    assertEquals(v?.v, MIGRATIONS.length);
    db.prepare("INSERT INTO enim_migrations (component, version, applied_at) VALUES ('bce', 99, 0)")
      .run();
    assertStringIncludes(assertThrows(() => new BceStore(db)).message, "schema version 99");
  } finally {
    db.close();
  }
});

Deno.test("a create that displaces an ENI shares its slot until the release is done", () => {
  const db = new DatabaseSync(":memory:");
  try {
    const store = new BceStore(db);
    const base = {
      client_token: "x",
      name: "",
      eni_id: null,
      requested_ip: null,
      purpose: "owner" as const,
      phase: "active" as const,
      created_ms: 1,
    };
    store.insertIntent({ ...base, id: "r1", kind: "release", eni_id: "eni-old000001" });
    store.insertIntent({ ...base, id: "c1", kind: "create", after_release: "r1" });
    assertEquals([store.intentCount(), store.intentSlots()], [2, 1]);
    store.deleteIntent("r1");
    assertEquals([store.intentCount(), store.intentSlots()], [1, 1]);
  } finally {
    db.close();
  }
});
