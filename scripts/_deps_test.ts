import { assertEquals, assertMatch, assertThrows } from "../lib/assert.ts";
import { ROOT } from "./_paths.ts";
import { lazyTool } from "./_deps.ts";
import { runFromRoot } from "../tests/support/command.ts";

Deno.test("lazyTool() looks nothing up until first use and finds a program installed after it was made", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-deps-" });
  try {
    const tool = lazyTool("frob", [`${dir}/a/frob`, `${dir}/b/frob`], "frobnicator");
    // Made before the program exists (as a module does at load, before the apt step).
    await Deno.mkdir(`${dir}/b`);
    await Deno.writeTextFile(`${dir}/b/frob`, "#!/bin/sh\n", { mode: 0o755 });
    assertEquals(tool(), `${dir}/b/frob`);
    // The path is kept once found.
    await Deno.mkdir(`${dir}/a`);
    await Deno.writeTextFile(`${dir}/a/frob`, "#!/bin/sh\n", { mode: 0o755 });
    assertEquals(tool(), `${dir}/b/frob`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("lazyTool() names the candidates and the package while none exists, and retries", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-deps-" });
  try {
    const tool = lazyTool("frob", [`${dir}/frob`], "frobnicator");
    const err = assertThrows(() => tool());
    assertEquals(
      err.message,
      `Cannot find frob: none of "${dir}/frob" exists (Debian package "frobnicator")`,
    );
    // A directory of that name is not the program.
    await Deno.mkdir(`${dir}/frob`);
    assertMatch(assertThrows(() => tool()).message, /^Cannot find frob/);
    await Deno.remove(`${dir}/frob`);
    await Deno.writeTextFile(`${dir}/frob`, "#!/bin/sh\n", { mode: 0o755 });
    assertEquals(tool(), `${dir}/frob`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * Every module the demo, the tests and the bench load before their apt step: importing
 * them must stat no program. A child process records every stat/lstat/exists call made
 * while the modules load (dynamic imports after the recorder is in place), then uses the
 * simulated VPC's ping once to show the recorder sees the lookup when it does happen.
 */
Deno.test("importing the fixtures looks no program up; ping is looked up on first use", async () => {
  const script = `
    const seen = [];
    for (const name of ["statSync", "lstatSync", "stat", "lstat"]) {
      const orig = Deno[name].bind(Deno);
      Deno[name] = (p, ...rest) => { seen.push(String(p)); return orig(p, ...rest); };
    }
    await import(${JSON.stringify(`${ROOT}/tests/support/node.ts`)});
    await import(${JSON.stringify(`${ROOT}/tests/support/clients.ts`)});
    const vpc = await import(${JSON.stringify(`${ROOT}/tests/support/vpc.ts`)});
    const atLoad = [...seen];
    let used = null;
    try { used = vpc.pingPath(); } catch (err) { used = String(err.message); }
    console.log(JSON.stringify({ atLoad, afterUse: seen.slice(atLoad.length), used }));
  `;
  const out = await runFromRoot([
    Deno.execPath(),
    "eval",
    "--config",
    `${ROOT}/deno.json`,
    "--no-prompt",
    script,
  ]);
  assertEquals(out.code, 0, out.stderr);
  const res = JSON.parse(out.stdout);
  assertEquals(res.atLoad, [], "no path is looked up while the modules load");
  assertMatch(res.afterUse.join(" "), /\/ping\b/);
  assertMatch(String(res.used), /ping/);
});
