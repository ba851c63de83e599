/**
 * The README's commands on a fresh machine, without removing a package from this one (other
 * work runs on it): `deno task demo` and `deno task test` run in a view of this machine
 * where every package of scripts/_deps.ts that is not part of every Debian system is missing
 * and apt-get is a stand-in that puts a package back when asked for it
 * (tests/support/fresh_view.ts). Issue 12: the demo failed without ping. Issue 41: the
 * tests ran /usr/bin/socat (policy/nft_test.ts) before any test had installed socat; the
 * demo must install what it uses and nothing only the tests use.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { APT_PACKAGES, aptNeedsOf, type AptPackage, ensureApt, isRoot } from "./_deps.ts";
import { ROOT } from "./_paths.ts";
import { inFreshView } from "../tests/support/fresh_view.ts";

const PACKAGES: Readonly<Record<string, AptPackage>> = APT_PACKAGES;

/** The packages `user` installs that a fresh machine may lack. */
function nonBase(user: "demo" | "test"): string[] {
  return Object.entries(PACKAGES).filter(([, p]) => !p.base && p.users.includes(user))
    .map(([n]) => n).sort();
}

Deno.test({
  name:
    "deno task demo passes on a machine without its packages, installing them and nothing only the tests use",
  ignore: !isRoot(),
  async fn() {
    // The demo really runs, so what it uses must be on this machine to be hidden.
    assertEquals(await ensureApt(aptNeedsOf("demo")), []);
    const dir = await Deno.makeTempDir({ prefix: "enim-fresh-" });
    try {
      const run = await inFreshView(dir, [Deno.execPath(), "task", "demo"]);
      assertEquals(run.code, 0, `${run.stdout}\n${run.stderr}`);
      assertMatch(run.stdout, /demo passed in [\d.]+ s/);
      assertMatch(run.stdout, /web → its gateway 10\.99\.0\.1/);
      assert(run.hidden.has("iputils-ping") && run.hidden.has("iproute2"), "hidden");
      assertStringIncludes(run.stderr, "installing through apt: ");
      assertEquals([...run.installed].sort(), nonBase("demo"), run.aptCalls.join("\n"));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "deno task test installs every package the tests use before the first test starts",
  ignore: !isRoot(),
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "enim-fresh-" });
    try {
      // The first test: every file the view hides (the tests' files this machine has) must
      // be back by then.
      const hidden = nonBase("test").flatMap((p) => PACKAGES[p].files).filter(exists);
      const probe = `${dir}/first_test.ts`;
      await Deno.writeTextFile(
        probe,
        [
          `const files: string[] = ${JSON.stringify(hidden)};`,
          'Deno.test("every package of the tests is installed before the first test", () => {',
          "  const missing = files.filter((f) => {",
          "    try {",
          "      Deno.lstatSync(f);",
          "      return false;",
          "    } catch {",
          "      return true;",
          "    }",
          "  });",
          '  if (missing.length) throw new Error(`Missing at the first test: ${missing.join(" ")}`);',
          "});",
          "",
        ].join("\n"),
      );
      const run = await inFreshView(dir, [Deno.execPath(), "task", "test", probe]);
      assertEquals(run.code, 0, `${run.stdout}\n${run.stderr}`);
      assertStringIncludes(run.stdout, "1 passed, 0 failed");
      assert(run.hidden.size > 0, "nothing to hide: the view shows nothing");
      // One install of the whole list, before deno test (the probe saw the hidden files).
      assertEquals(
        run.aptCalls.filter((c) => c[0] === "install").length,
        1,
        run.aptCalls.join("\n"),
      );
      assertEquals([...run.installed].sort(), nonBase("test"));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

function exists(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

// Issue 33 item 15: the README's first command on a fresh machine (an empty DENO_DIR) printed a
// yellow "Ignored build scripts for packages: npm:protobufjs" box while npm packages downloaded.
Deno.test({
  name: "the demo's modules load into an empty DENO_DIR without a warning about build scripts",
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "enim-dd-" });
    try {
      for (const config of ["deno.json", "tests/deno.json"]) {
        const out = await new Deno.Command(Deno.execPath(), {
          args: ["cache", "--config", config, "scripts/demo.ts", "main.ts"],
          cwd: ROOT,
          env: { DENO_DIR: `${dir}/${config.replace("/", "_")}`, NO_COLOR: "1" },
          stdin: "null",
          stdout: "piped",
          stderr: "piped",
        }).output();
        const stderr = new TextDecoder().decode(out.stderr);
        assertEquals(out.code, 0, stderr);
        assertMatch(stderr, /Download/, "the cache really was empty");
        assert(!/Warning|build scripts/i.test(stderr), `${config}:\n${stderr}`);
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
