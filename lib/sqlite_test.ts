import { assertEquals, assertStringIncludes, assertThrows } from "./assert.ts";
import { type Addition, migrateComponent, openDatabase } from "./sqlite.ts";

const names = (db: ReturnType<typeof openDatabase>) =>
  db.prepare("SELECT name FROM enim_additions WHERE component = 'c' ORDER BY name").all()
    .map((r) => String(r.name));

Deno.test("migrateComponent() makes each addition once, without raising the schema version", () => {
  const db = openDatabase(":memory:");
  const adds: Addition[] = [{ name: "t2", up: "CREATE TABLE t2 (x INTEGER)" }];
  migrateComponent(db, "c", ["CREATE TABLE t1 (x INTEGER)"], Date.now, adds);
  migrateComponent(db, "c", ["CREATE TABLE t1 (x INTEGER)"], Date.now, adds);
  assertEquals(names(db), ["t2"]);
  const v = db.prepare("SELECT max(version) AS v FROM enim_migrations WHERE component = 'c'").get();
  assertEquals(v?.v, 1);
  db.close();
});

Deno.test("migrateComponent() leaves alone an addition of a newer release, and refuses a newer version", () => {
  const db = openDatabase(":memory:");
  const newer: Addition[] = [
    { name: "t2", up: "CREATE TABLE t2 (x INTEGER)" },
    { name: "t3", up: "CREATE TABLE t3 (x INTEGER)" },
  ];
  migrateComponent(db, "c", ["CREATE TABLE t1 (x INTEGER)"], Date.now, newer);
  // The older code knows t2 only: it opens the database and changes nothing.
  migrateComponent(db, "c", ["CREATE TABLE t1 (x INTEGER)"], Date.now, newer.slice(0, 1));
  assertEquals(names(db), ["t2", "t3"]);
  migrateComponent(db, "c", ["CREATE TABLE t1 (x INTEGER)", "CREATE TABLE t4 (x INTEGER)"]);
  const err = assertThrows(() => migrateComponent(db, "c", ["CREATE TABLE t1 (x INTEGER)"]));
  assertStringIncludes(err.message, "this enim knows up to 1");
  db.close();
});
