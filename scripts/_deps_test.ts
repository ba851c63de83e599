import { assert, assertEquals, assertMatch, assertThrows } from "../lib/assert.ts";
import { ROOT } from "./_paths.ts";
import {
  APT_PACKAGES,
  aptNeeds,
  aptNeedsOf,
  type AptPackage,
  type AptUser,
  ensureApt,
  isRoot,
  lazyTool,
  packageOf,
} from "./_deps.ts";
import { runFromRoot } from "../tests/support/command.ts";

Deno.test("lazyTool() looks nothing up until first use and finds a program installed after it was made", () => {
  const seen: string[] = [];
  let installed = false;
  const tool = lazyTool("/usr/bin/socat", (p) => {
    seen.push(p);
    return installed;
  });
  assertEquals(seen, [], "nothing looked up when made (as a module does at load)");
  assertThrows(() => tool());
  installed = true; // the apt step ran
  assertEquals(tool(), "/usr/bin/socat");
  // The path is kept once found.
  installed = false;
  assertEquals(tool(), "/usr/bin/socat");
  assertEquals(seen, ["/usr/bin/socat", "/usr/bin/socat"]);
});

Deno.test("lazyTool() names the path and its package while the program is missing, and retries", () => {
  let calls = 0;
  const tool = lazyTool("/usr/sbin/iptables-restore", () => ++calls > 2);
  const err = assertThrows(() => tool());
  assertEquals(
    err.message,
    'Cannot find iptables-restore: "/usr/sbin/iptables-restore" does not exist (Debian package "iptables")',
  );
  assertMatch(assertThrows(() => tool()).message, /^Cannot find iptables-restore/);
  assertEquals(tool(), "/usr/sbin/iptables-restore");
});

Deno.test("aptNeeds() and aptNeedsOf() take every file of a package from the one list", () => {
  assertEquals(aptNeeds("socat", "procps"), [
    { pkg: "socat", file: "/usr/bin/socat" },
    { pkg: "procps", file: "/usr/sbin/sysctl" },
  ]);
  const packages: Readonly<Record<string, AptPackage>> = APT_PACKAGES;
  const pkgs = (user: AptUser) => [...new Set(aptNeedsOf(user).map((n) => n.pkg))];
  for (const [pkg, p] of Object.entries(packages)) {
    for (const user of ["demo", "test", "bench", "bench-cri"] as const) {
      assertEquals(pkgs(user).includes(pkg), p.users.includes(user));
    }
  }
  assertEquals(pkgs("demo").filter((p) => !packages[p].base), [
    "iproute2",
    "nftables",
    "iputils-ping",
  ], "the demo installs no test-only package");
  assert(pkgs("test").includes("socat"));
  assertEquals(packageOf("/usr/bin/socat"), "socat");
  assertEquals(packageOf("/opt/frob/bin/frob"), null);
});

Deno.test("ensureApt() asks nothing when every file is there, and names each missing package once", async () => {
  assertEquals(await ensureApt(aptNeeds("coreutils")), []);
  if (isRoot()) return; // as root it would install
  const frob = [
    { pkg: "frobnicator", file: "/nonexistent/frob" },
    { pkg: "frobnicator", file: "/nonexistent/frob2" },
  ];
  assertEquals(await ensureApt(frob), ["frobnicator"]);
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
