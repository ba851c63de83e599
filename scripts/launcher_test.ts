import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { enimArgv, runEnim } from "../tests/support/enim.ts";
import { currentDenoDir, launcherScript, shQuote, writeLauncher } from "./launcher.ts";
import { bundleArgv, pluginEntry } from "./build.ts";

/** The bundle's plugin entry in place of `main.js`, with the plugin's own permission set. */
function pluginArgv(): string[] {
  return bundleArgv(pluginEntry(enimArgv().at(-1)!));
}
import { type CommandOutput, runCommand } from "../tests/support/command.ts";

/** Runs `path args…` with exactly `env`, feeding `stdin`. */
function runScript(
  path: string,
  args: string[],
  env: Record<string, string>,
  stdin = "",
): Promise<CommandOutput> {
  return runCommand([path, ...args], env, stdin);
}

Deno.test("shQuote() leaves plain words alone and single-quotes the rest", async (t) => {
  for (
    const [word, quoted] of [
      ["/usr/bin/deno", "/usr/bin/deno"],
      ["--permission-set=enim", "--permission-set=enim"],
      ["/a dir/x", "'/a dir/x'"],
      ["it's", `'it'\\''s'`],
      ["$HOME", "'$HOME'"],
    ]
  ) {
    await t.step(word, () => assertEquals(shQuote(word), quoted));
  }
});

Deno.test("the launcher execs exactly enimArgv() followed by the caller's arguments, with the plugin entry for a CNI call", () => {
  const text = launcherScript({ denoDir: "/var/cache/deno" });
  assert(text.startsWith("#!/bin/sh\n"));
  const exec = text.split("\n").find((l) => l.startsWith("exec "));
  assertEquals(exec, `exec ${enimArgv().map(shQuote).join(" ")} "$@"`);
  const plugin = text.split("\n").find((l) => l.startsWith("  exec "));
  assertEquals(plugin, `  exec ${pluginArgv().map(shQuote).join(" ")} "$@"`);
  assertMatch(text, /^DENO_DIR="\$\{DENO_DIR:-\/var\/cache\/deno\}"$/m);
});

Deno.test("the launcher runs a CNI call with the plugin's narrow set and the agent with the enim set", () => {
  const text = launcherScript({ denoDir: "/var/cache/deno" });
  const plugin = text.split("\n").find((l) => l.startsWith("  exec "))!;
  const agent = text.split("\n").find((l) => l.startsWith("exec "))!;
  // The plugin reaches its agent's socket and no address; the agent any address and port.
  assertMatch(plugin, / --allow-net=unix:\/run\/enim\/enim\.sock /);
  assert(!/ --allow-run/.test(plugin), plugin);
  assertMatch(agent, / --allow-net /);
  assertMatch(agent, / --allow-run=\/usr\/sbin\/ip,/);
});

Deno.test("the launcher rejects a relative deno path", () => {
  let err: unknown;
  try {
    launcherScript({ deno: "deno" });
  } catch (e) {
    err = e;
  }
  assertMatch(String(err), /absolute deno path/);
});

Deno.test("the launcher passes arguments, stdin and the environment through unchanged", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-launcher-" });
  try {
    // A stand-in for deno that reports what it was given.
    const fake = `${dir}/fake deno`;
    await Deno.writeTextFile(
      fake,
      '#!/bin/sh\nfor a in "$@"; do printf "arg:%s\\n" "$a"; done\n' +
        'printf "stdin:%s\\n" "$(cat)"\nprintf "env:%s %s\\n" "$CNI_COMMAND" "$DENO_DIR"\n',
    );
    await Deno.chmod(fake, 0o755);
    const launcher = `${dir}/enim`;
    await writeLauncher(launcher, { deno: fake, denoDir: "/pinned/cache" });
    const res = await runScript(launcher, ["ADD", "two words", "'q'"], {
      CNI_COMMAND: "ADD",
    }, '{"cniVersion":"1.1.0"}');
    assertEquals(res.code, 0, res.stderr);
    const lines = res.stdout.trimEnd().split("\n");
    assertEquals(
      lines.filter((l) => l.startsWith("arg:")).map((l) => l.slice(4)),
      [...pluginArgv().slice(1), "ADD", "two words", "'q'"],
    );
    assertEquals(lines.find((l) => l.startsWith("stdin:")), 'stdin:{"cniVersion":"1.1.0"}');
    assertEquals(lines.find((l) => l.startsWith("env:")), "env:ADD /pinned/cache");

    // The caller's DENO_DIR wins over the pinned one; without CNI_COMMAND, main.js.
    const own = await runScript(launcher, [], { DENO_DIR: "/mine" });
    assertMatch(own.stdout, /^env: \/mine$/m);
    assertEquals(
      own.stdout.split("\n").filter((l) => l.startsWith("arg:")).map((l) => l.slice(4)),
      enimArgv().slice(1),
    );
    // CNI_COMMAND set but empty is still a CNI call (as main.ts decides).
    const empty = await runScript(launcher, [], { CNI_COMMAND: "" });
    assertEquals(
      empty.stdout.split("\n").filter((l) => l.startsWith("arg:")).map((l) => l.slice(4)),
      pluginArgv().slice(1),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the generated launcher runs `enim version` with an empty environment", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-launcher-" });
  try {
    const launcher = `${dir}/enim`;
    await writeLauncher(launcher);
    const res = await runScript(launcher, ["version", "--json"], {});
    assertEquals(res.code, 0, res.stderr);
    assertEquals(JSON.parse(res.stdout).deno, Deno.version.deno);
    assertEquals(res.stderr, "");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a CNI VERSION call through the launcher answers as the entry point does", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-launcher-" });
  try {
    const launcher = `${dir}/enim`;
    await writeLauncher(launcher, { denoDir: await currentDenoDir() });
    const env = { CNI_COMMAND: "VERSION", PATH: "/usr/sbin:/usr/bin:/sbin:/bin", NO_COLOR: "1" };
    const stdin = '{"cniVersion":"1.1.0"}';
    const viaLauncher = await runScript(launcher, [], env, stdin);
    const direct = await runEnim([], { env, stdin });
    assertEquals(viaLauncher.code, direct.code);
    assertEquals(viaLauncher.stdout, direct.stdout);
    if (direct.code === 0) {
      // Once the CNI layer answers: the result came from the stdin we fed through the launcher.
      assert(Array.isArray(JSON.parse(viaLauncher.stdout).supportedVersions));
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
