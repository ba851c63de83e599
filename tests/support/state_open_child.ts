/**
 * Opens an agent's state database as this tree's agent does (the state store's and both
 * providers' tables: `StateStore.open`, the mock's and BCE's migrations) and prints
 * `{"ok": true, "attachments": N}`; with `--kill-at K` it SIGKILLs itself right after the
 * K-th write of that (each `exec` and each statement `run`, COMMIT included), for the test
 * of a kill at each write of a migration (`tests/state_compat_test.ts`).
 *
 *     deno run -A --config tests/deno.json tests/support/state_open_child.ts DB [--kill-at K]
 *
 * @module
 */
import type { DatabaseSync, StatementSync } from "node:sqlite";
import { migrateComponent, openDatabase } from "../../lib/sqlite.ts";
import { StateStore } from "../../manager/state.ts";
import { MIGRATIONS as MOCK } from "../../providers/mock/store.ts";
import { MIGRATIONS as BCE } from "../../providers/bce/_tables.ts";

const [path, flag, k] = Deno.args;
const killAt = flag === "--kill-at" ? Number(k) : Infinity;
let writes = 0;
const wrote = () => {
  if (++writes === killAt) Deno.kill(Deno.pid, "SIGKILL");
};
const bound = <T extends object>(target: T, p: string | symbol) => {
  const v = Reflect.get(target, p);
  return typeof v === "function" ? v.bind(target) : v;
};
const real = openDatabase(path);
const db = new Proxy(real, {
  get(t, p) {
    if (p === "exec") {
      return (sql: string) => {
        t.exec(sql);
        wrote();
      };
    }
    if (p === "prepare") {
      return (sql: string) =>
        new Proxy(t.prepare(sql), {
          get(st: StatementSync, q) {
            if (q === "run") {
              return (...a: Parameters<StatementSync["run"]>) => {
                const r = st.run(...a);
                wrote();
                return r;
              };
            }
            return bound(st, q);
          },
        });
    }
    return bound(t, p);
  },
}) as DatabaseSync;
try {
  const store = StateStore.open(db);
  migrateComponent(db, "mock", MOCK);
  migrateComponent(db, "bce", BCE);
  console.log(JSON.stringify({ ok: true, attachments: store.all().length, writes }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err) }));
  Deno.exitCode = 1;
} finally {
  real.close();
}
