import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { join, ROOT } from "./_paths.ts";
import {
  conflistProblem,
  install,
  LAUNCHER_DROPIN,
  PREVIOUS_CONFLISTS,
  rootProblem,
} from "./install.ts";
import { type CommandOutput, runFromRoot } from "../tests/support/command.ts";

const dec = new TextDecoder();

/** Runs `deno task install …` from the repository, as a user would. */
function task(...args: string[]): Promise<CommandOutput> {
  return runFromRoot([Deno.execPath(), "task", "-q", "install", ...args]);
}

/** Every path under `dir` (relative, sorted) with its permission bits and type. */
function tree(dir: string, rel = ""): string[] {
  const out: string[] = [];
  for (const e of [...Deno.readDirSync(join(dir, rel))].sort((a, b) => a.name < b.name ? -1 : 1)) {
    const p = `${rel}/${e.name}`;
    const mode = (Deno.statSync(join(dir, p)).mode! & 0o7777).toString(8).padStart(4, "0");
    out.push(`${e.isDirectory ? "d" : "f"} ${mode} ${p}`);
    if (e.isDirectory) out.push(...tree(dir, p));
  }
  return out;
}

function mtimes(dir: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of tree(dir)) {
    const p = line.split(" ")[2];
    out[p] = Deno.statSync(join(dir, p)).mtime!.getTime();
  }
  return out;
}

const hasCompiled = (() => {
  try {
    return Deno.statSync(join(ROOT, "dist", "enim")).isFile;
  } catch {
    return false;
  }
})();

Deno.test("deno task install --prefix produces the expected tree with the expected modes", async () => {
  const prefix = await Deno.makeTempDir({ prefix: "enim-install-" });
  try {
    const res = await task("--prefix", prefix, "--launcher");
    assertEquals(res.code, 0, res.stderr);
    const files = tree(prefix).filter((l) =>
      l.startsWith("f ") || / \/var\/(lib|log)\/enim$/.test(l)
    )
      .concat(tree(prefix).filter((l) => l.endsWith(" /etc/enim")));
    assertEquals(
      files.sort(),
      [
        "d 0700 /var/lib/enim",
        "d 0750 /var/log/enim",
        "d 0755 /etc/enim",
        "f 0600 /etc/enim/agent.jsonc",
        "f 0644 /etc/cni/net.d/10-enim.conflist",
        "f 0644 /etc/systemd/system/enim-agent.service",
        "f 0644 /etc/systemd/system/enim-agent.service.d/10-launcher.conf",
        "f 0755 /opt/cni/bin/enim",
      ].sort(),
    );
    const same = async (installed: string, source: string) =>
      assertEquals(
        await Deno.readTextFile(join(prefix, installed)),
        await Deno.readTextFile(join(ROOT, "deploy", source)),
      );
    await same("/etc/cni/net.d/10-enim.conflist", "10-enim.conflist");
    await same("/etc/enim/agent.jsonc", "agent.jsonc");
    await same("/etc/systemd/system/enim-agent.service", "enim-agent.service");
    assertMatch(res.stdout, /^installed +\/opt\/cni\/bin\/enim \(launcher\)$/m);

    // The installed plugin is runnable.
    const v = await new Deno.Command(join(prefix, "/opt/cni/bin/enim"), {
      args: ["version"],
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assertEquals(v.code, 0, dec.decode(v.stderr));
    assertMatch(dec.decode(v.stdout), /^enim \d+\.\d+\.\d+/);
  } finally {
    await Deno.remove(prefix, { recursive: true });
  }
});

Deno.test("a second deno task install changes nothing", async () => {
  const prefix = await Deno.makeTempDir({ prefix: "enim-install-" });
  try {
    assertEquals((await task("--prefix", prefix, "--launcher")).code, 0);
    const before = { tree: tree(prefix), mtimes: mtimes(prefix) };
    await new Promise((r) => setTimeout(r, 20));
    const again = await task("--prefix", prefix, "--launcher");
    assertEquals(again.code, 0, again.stderr);
    assertEquals(tree(prefix), before.tree);
    assertEquals(mtimes(prefix), before.mtimes);
    const outcomes = again.stdout.split("\n").flatMap((l) => l.match(/^(\w+) +\//)?.[1] ?? []);
    assertEquals([...new Set(outcomes)].sort(), ["kept", "unchanged"]);
  } finally {
    await Deno.remove(prefix, { recursive: true });
  }
});

Deno.test("deno task install keeps an existing conflist and agent config", async () => {
  const prefix = await Deno.makeTempDir({ prefix: "enim-install-" });
  try {
    await Deno.mkdir(join(prefix, "etc/cni/net.d"), { recursive: true });
    await Deno.mkdir(join(prefix, "etc/enim"), { recursive: true });
    await Deno.writeTextFile(join(prefix, "etc/cni/net.d/10-enim.conflist"), "mine\n");
    await Deno.writeTextFile(join(prefix, "etc/enim/agent.jsonc"), "{} // mine\n", { mode: 0o640 });
    const res = await task("--prefix", prefix);
    assertEquals(res.code, 0, res.stderr);
    assertEquals(await Deno.readTextFile(join(prefix, "etc/cni/net.d/10-enim.conflist")), "mine\n");
    assertEquals(await Deno.readTextFile(join(prefix, "etc/enim/agent.jsonc")), "{} // mine\n");
    assertMatch(
      res.stdout,
      /^kept +\/etc\/cni\/net\.d\/10-enim\.conflist \(exists; not overwritten\)$/m,
    );
    assertMatch(res.stdout, /^kept +\/etc\/enim\/agent\.jsonc \(exists; not overwritten\)$/m);
    assert(Deno.statSync(join(prefix, "opt/cni/bin/enim")).isFile);
    if (!hasCompiled) assertStringIncludes(res.stdout, "installing the launcher");
  } finally {
    await Deno.remove(prefix, { recursive: true });
  }
});

Deno.test("deno task install replaces enim's previous default conflist (cniVersion 1.1.0 only)", async () => {
  const prefix = await Deno.makeTempDir({ prefix: "enim-install-" });
  try {
    const dest = join(prefix, "etc/cni/net.d/10-enim.conflist");
    await Deno.mkdir(join(prefix, "etc/cni/net.d"), { recursive: true });
    await Deno.writeTextFile(dest, PREVIOUS_CONFLISTS[0], { mode: 0o600 });
    const res = await task("--prefix", prefix, "--launcher");
    assertEquals(res.code, 0, res.stderr);
    assertMatch(
      res.stdout,
      /^updated +\/etc\/cni\/net\.d\/10-enim\.conflist \(was enim's previous default\)$/m,
    );
    assertEquals(
      await Deno.readTextFile(dest),
      await Deno.readTextFile(join(ROOT, "deploy/10-enim.conflist")),
    );
    assertEquals(Deno.statSync(dest).mode! & 0o777, 0o644);
    // The next run keeps it.
    const again = await task("--prefix", prefix, "--launcher");
    assertMatch(
      again.stdout,
      /^kept +\/etc\/cni\/net\.d\/10-enim\.conflist \(exists; not overwritten\)$/m,
    );
  } finally {
    await Deno.remove(prefix, { recursive: true });
  }
});

Deno.test("deno task install keeps an edited 1.1.0-only conflist and warns that containerd 1.6/1.7 fail it", async () => {
  const prefix = await Deno.makeTempDir({ prefix: "enim-install-" });
  try {
    const dest = join(prefix, "etc/cni/net.d/10-enim.conflist");
    await Deno.mkdir(join(prefix, "etc/cni/net.d"), { recursive: true });
    const mine = PREVIOUS_CONFLISTS[0].replace('"name": "enim"', '"name": "mine"');
    await Deno.writeTextFile(dest, mine);
    const res = await task("--prefix", prefix, "--launcher");
    assertEquals(res.code, 0, res.stderr);
    assertEquals(await Deno.readTextFile(dest), mine);
    assertMatch(
      res.stdout,
      /^kept +\/etc\/cni\/net\.d\/10-enim\.conflist \(exists; not overwritten; warning: its "cniVersion" "1\.1\.0" fails every pod on containerd 1\.6\/1\.7/m,
    );
  } finally {
    await Deno.remove(prefix, { recursive: true });
  }
});

Deno.test("conflistProblem() flags 1.1.0 and later without cniVersions, nothing else", async (t) => {
  const cases: [string, boolean][] = [
    ['{"cniVersion": "1.1.0"}', true],
    ['{"cniVersion": "1.2.0"}', true],
    ['{"cniVersion": "2.0.0"}', true],
    ['{"cniVersion": "1.0.0"}', false],
    ['{"cniVersion": "0.4.0"}', false],
    ['{"cniVersion": "1.0.0", "cniVersions": ["1.0.0", "1.1.0"]}', false],
    ['{"cniVersion": "1.1.0", "cniVersions": ["1.0.0", "1.1.0"]}', false],
    ["{}", false],
    ["not json", false],
    ['{"cniVersion": 1}', false],
  ];
  for (const [text, flagged] of cases) {
    await t.step(text, () => assertEquals(conflistProblem(text) !== undefined, flagged));
  }
  assertEquals(
    conflistProblem(await Deno.readTextFile(join(ROOT, "deploy/10-enim.conflist"))),
    undefined,
  );
});

Deno.test("enim's previous conflists are what it shipped before, never the current one", async () => {
  const current = await Deno.readTextFile(join(ROOT, "deploy/10-enim.conflist"));
  assert(!PREVIOUS_CONFLISTS.includes(current), "the shipped conflist would be updated forever");
  for (const prev of PREVIOUS_CONFLISTS) assertEquals(JSON.parse(prev).name, "enim");
});

Deno.test("install() prefers dist/enim, replaces a changed binary and drops the launcher's drop-in", async () => {
  const repo = await Deno.makeTempDir({ prefix: "enim-repo-" });
  const prefix = await Deno.makeTempDir({ prefix: "enim-install-" });
  try {
    await Deno.mkdir(join(repo, "dist"));
    await Deno.mkdir(join(repo, "deploy"));
    for (const f of ["10-enim.conflist", "agent.jsonc", "enim-agent.service"]) {
      await Deno.copyFile(join(ROOT, "deploy", f), join(repo, "deploy", f));
    }
    await install({ prefix, root: repo, launcher: true });
    assert(Deno.statSync(join(prefix, LAUNCHER_DROPIN)).isFile);

    await Deno.writeTextFile(join(repo, "dist/enim"), "#!/bin/sh\necho compiled v1\n");
    const lines: string[] = [];
    const steps = await install({ prefix, root: repo, log: (l) => lines.push(l) });
    assertEquals(steps[0], {
      outcome: "updated",
      path: "/opt/cni/bin/enim",
      note: "compiled binary",
    });
    assertEquals(
      await Deno.readTextFile(join(prefix, "opt/cni/bin/enim")),
      "#!/bin/sh\necho compiled v1\n",
    );
    assertEquals(Deno.statSync(join(prefix, "opt/cni/bin/enim")).mode! & 0o777, 0o755);
    assert(steps.some((s) => s.outcome === "removed" && s.path === LAUNCHER_DROPIN));
    assert(!lines.some((l) => l.startsWith("notice:")));

    await Deno.writeTextFile(join(repo, "dist/enim"), "#!/bin/sh\necho compiled v2\n");
    const again = await install({ prefix, root: repo });
    assertEquals(again[0].outcome, "updated");
    assertEquals(
      again.filter((s) => s.outcome !== "kept" && s.outcome !== "unchanged").map((s) => s.path),
      ["/opt/cni/bin/enim"],
    );
  } finally {
    await Deno.remove(repo, { recursive: true });
    await Deno.remove(prefix, { recursive: true });
  }
});

Deno.test("install refuses to write into / unless root", () => {
  assertMatch(rootProblem(undefined, 1000) ?? "", /needs root.*--prefix DIR/);
  assertEquals(rootProblem(undefined, 0), undefined);
  assertEquals(rootProblem("/tmp/stage", 1000), undefined);
});

Deno.test("deno task install rejects an unknown option", async () => {
  const res = await task("--prefx", "/tmp/x");
  assertEquals(res.code, 2);
  assertStringIncludes(res.stderr, "--prefx");
});
