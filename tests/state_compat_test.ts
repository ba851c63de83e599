/**
 * State both versions read (issue 51 item 3): what this release writes, the previous
 * release opens, and the reverse — checked with the previous release's own modules (its
 * sources from its commit, `tests/support/releases.ts`), not with this tree's idea of them.
 * And a kill -9 at each write of this release's migration of a database (a fresh one, and
 * one the previous release made, with a row) leaves a database both releases open.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { join } from "node:path";
import { previousRelease } from "../scripts/_releases.ts";
import { releaseSource } from "./support/releases.ts";
import { SCHEMA_VERSION } from "../manager/state.ts";
import { MIGRATIONS as MOCK } from "../providers/mock/store.ts";
import { MIGRATIONS as BCE } from "../providers/bce/_tables.ts";
import { ROOT } from "../scripts/_paths.ts";

const PREVIOUS = previousRelease();

/** What the previous release runs to open a database (written into its source tree). */
const OLD_OPENER = `
import { migrateComponent, openDatabase } from "./lib/sqlite.ts";
import { StateStore } from "./manager/state.ts";
import { MIGRATIONS as MOCK } from "./providers/mock/store.ts";
import { MIGRATIONS as BCE } from "./providers/bce/_tables.ts";
const [path, seed] = Deno.args;
const db = openDatabase(path);
try {
  const store = StateStore.open(db);
  migrateComponent(db, "mock", MOCK);
  migrateComponent(db, "bce", BCE);
  if (seed === "--seed") {
    db.prepare(\`INSERT INTO attachments (container_id, if_name, pod, network, netns, mode, state,
      eni_id, mac, result, created_at, updated_at) VALUES ('c1', 'eth0', 'default/a', 'net', '/run/netns/a',
      'interface', 'ready', 'eni-1', '02:00:00:00:00:01', '{}', 1, 1)\`).run();
  }
  console.log(JSON.stringify({ ok: true, attachments: store.all().length }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err) }));
  Deno.exitCode = 1;
} finally {
  db.close();
}
`;

interface Opened {
  code: number;
  signal: Deno.Signal | null;
  out: { ok: boolean; attachments?: number; writes?: number; error?: string } | null;
  stderr: string;
}

async function run(cwd: string, args: string[]): Promise<Opened> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--no-check",
      "--no-lock",
      "--quiet",
      "--config",
      "tests/deno.json",
      ...args,
    ],
    cwd,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  return {
    code: out.code,
    signal: out.signal,
    out: text ? JSON.parse(text.split("\n").at(-1)!) : null,
    stderr: new TextDecoder().decode(out.stderr),
  };
}

let oldTree: string | undefined;
/** The previous release opens `db` with its own code. */
async function oldOpens(db: string, seed = false): Promise<Opened> {
  if (!oldTree) {
    oldTree = await releaseSource(PREVIOUS.version);
    await Deno.writeTextFile(join(oldTree, "enim_open_state.ts"), OLD_OPENER);
  }
  return await run(oldTree, ["enim_open_state.ts", db, ...(seed ? ["--seed"] : [])]);
}
/** This release opens `db` (killed after write `killAt` when given). */
function newOpens(db: string, killAt?: number): Promise<Opened> {
  return run(ROOT, [
    "tests/support/state_open_child.ts",
    db,
    ...(killAt ? ["--kill-at", String(killAt)] : []),
  ]);
}

Deno.test("this release writes no schema version the previous release refuses", () => {
  // The previous release refuses a component's version above its list (lib/sqlite.ts).
  assertEquals(
    { state: SCHEMA_VERSION, mock: MOCK.length, bce: BCE.length },
    { state: PREVIOUS.schemas.state, mock: PREVIOUS.schemas.mock, bce: PREVIOUS.schemas.bce },
  );
});

Deno.test(`the state round trip: ${PREVIOUS.version} opens what this release wrote and the reverse, rows kept`, async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-state-compat-" });
  try {
    const db = join(dir, "enim.db");
    const made = await oldOpens(db, true);
    assertEquals(made.out, { ok: true, attachments: 1 }, made.stderr);
    const up = await newOpens(db);
    assertEquals([up.out?.ok, up.out?.attachments], [true, 1], up.stderr + up.out?.error);
    const down = await oldOpens(db);
    assertEquals(down.out, { ok: true, attachments: 1 }, down.stderr + down.out?.error);
    const again = await newOpens(db);
    assertEquals([again.out?.ok, again.out?.attachments], [true, 1], again.stderr);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a kill -9 at each write of this release's migration leaves a database both releases open", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "enim-state-kill-" });
  try {
    const previous = join(dir, "previous.db");
    assert((await oldOpens(previous, true)).out?.ok);
    const starts: [string, string | null][] = [["a fresh database", null], [
      `${PREVIOUS.version}'s`,
      previous,
    ]];
    for (const [name, start] of starts) {
      await t.step(name, async () => {
        let kills = 0;
        for (let k = 1;; k++) {
          const db = join(dir, `k${k}.db`);
          for (const sfx of ["", "-wal", "-shm"]) {
            if (start) await Deno.copyFile(start + sfx, db + sfx).catch(() => {});
          }
          const killed = await newOpens(db, k);
          if (killed.signal === null) {
            assertEquals(killed.out?.ok, true, killed.stderr);
            break;
          }
          assertEquals(killed.signal, "SIGKILL");
          kills++;
          const rows = start ? 1 : 0;
          // Both open what the kill left: the previous release first (it must not need
          // this release to finish anything), then this one.
          const old = await oldOpens(db);
          assertEquals(
            old.out,
            { ok: true, attachments: rows },
            `kill at write ${k}: ${old.stderr}`,
          );
          const now = await newOpens(db);
          assertEquals([now.out?.ok, now.out?.attachments], [true, rows], `kill at write ${k}`);
          for (const sfx of ["", "-wal", "-shm"]) await Deno.remove(db + sfx).catch(() => {});
        }
        console.error(`${name}: killed at each of its ${kills} writes`);
        assert(kills > 3, `${kills} writes`);
      });
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
