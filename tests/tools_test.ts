/**
 * Every program the code runs by absolute path comes from a Debian package declared in
 * scripts/_deps.ts, for the users that run it (issue 41 item 2): `deno task test` installs
 * every package the tests use before the first test, so a test must not run a program only
 * a later test's helper would have installed (policy/nft_test.ts ran /usr/bin/socat on a
 * fresh machine before any test had installed socat).
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { z } from "zod";
import { APT_PACKAGES, type AptPackage, packageOf } from "../scripts/_deps.ts";
import { ROOT } from "../scripts/_paths.ts";
import { bareCommands, checkToolPaths, type Exemption, toolPaths } from "./support/tool_paths.ts";

const PACKAGES: Readonly<Record<string, AptPackage>> = APT_PACKAGES;

/** Mentions of programs that run inside a container image, or nowhere. */
const EXEMPTIONS: Exemption[] = [
  ...["/bin/ip", "/bin/ping", "/bin/sleep"].map((path) => ({
    file: "tests/podman_test.ts",
    path,
    why: "busybox's applet in the container's rootfs (podman exec)",
  })),
  {
    file: "tests/k8s_rollout_test.ts",
    path: "/bin/cat",
    why: "busybox's applet in the workload pod's image (the echo server's command)",
  },
  {
    file: "tests/support/cri/image.ts",
    path: "/bin/sleep",
    why: "the pause image's entrypoint, busybox's applet in the image",
  },
  {
    file: "scripts/launcher_test.ts",
    path: "/usr/bin/deno",
    why: "a word shQuote() must leave alone; nothing runs it",
  },
  {
    file: "tests/stress/_fuzz.ts",
    path: "/usr/bin/ip",
    why: "a path the fuzz gives as a network namespace; nothing runs it",
  },
];

Deno.test("toolPaths() finds a tool path wherever it stands, and only where a path starts", async (t) => {
  const cases: [string, string, string[]][] = [
    ["a Deno.Command", 'new Deno.Command("/usr/bin/socat", { args: ["-"] })', ["/usr/bin/socat"]],
    ["a constant (policy/nft_test.ts at 295bf8b)", 'const SOCAT = "/usr/bin/socat";', [
      "/usr/bin/socat",
    ]],
    [
      "an argv array",
      'runCommand(["/usr/sbin/ip", "netns", "exec", ns, "/usr/bin/timeout", "3", SOCAT], {})',
      ["/usr/sbin/ip", "/usr/bin/timeout"],
    ],
    ["lazyTool", 'const nft = lazyTool("/usr/sbin/nft");', ["/usr/sbin/nft"]],
    ["a single-quoted string", "spawn('/sbin/iptables-restore')", ["/sbin/iptables-restore"]],
    [
      "a shell script in a template string, and a shebang",
      '`#!/bin/sh\\nexec /usr/sbin/runc --root ${d}/runc "$@"\\n`',
      ["/bin/sh", "/usr/sbin/runc"],
    ],
    ["a CNI plugin", 'runInNode(node, ["/usr/lib/cni/portmap"], env)', ["/usr/lib/cni/portmap"]],
    ["a comment, its full stop left out", "// runs /usr/bin/time.", ["/usr/bin/time"]],
    ["a folder under a variable", "`${dir}/bin/runc`, `${rootfs}/bin/busybox`", []],
    ["other folders", '"/usr/local/bin/enim", "/opt/cni/bin/enim", "./bin/x"', []],
    ["PATH and a folder alone", '{ PATH: "/usr/sbin:/usr/bin:/sbin:/bin" }, "/usr/lib/cni"', []],
    ["a name made at run time", "`/usr/bin/${e.name}`", []],
  ];
  for (const [name, text, paths] of cases) {
    await t.step(name, () => assertEquals(toolPaths("x.ts", text).map((m) => m.path), paths));
  }
  assertEquals(toolPaths("x.ts", 'a\nb\n  "/usr/bin/ping"')[0].line, 3);
});

Deno.test("bareCommands() reports a program handed to Deno.Command by its name", () => {
  const text = [
    'new Deno.Command("openssl", { args });',
    "new Deno.Command(Deno.execPath(), { args });",
    "new Deno.Command(cmd, { args });",
    'new Deno.Command(\n  "/usr/bin/tar", { args });',
    "new Deno.Command(`${dir}/enim`, {});",
  ].join("\n");
  assertEquals(bareCommands("x.ts", text), [{ file: "x.ts", line: 1, path: "openssl" }]);
});

/** A copy of the tools' folders of this checkout with one more file; removed by the caller. */
async function plantedTree(planted: string): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "enim-tools-" });
  await Deno.mkdir(`${dir}/tests`);
  await Deno.writeTextFile(`${dir}/tests/planted_test.ts`, planted);
  return dir;
}

Deno.test("the check fails on a planted Deno.Command of a program no declared package has, or one the tests do not install", async () => {
  const dir = await plantedTree(
    [
      "const out = await new Deno.Command(",
      '  "/usr/bin/socat",',
      '  { args: ["-T1", "-", "TCP4:10.0.0.1:80"] },',
      ").output();",
      'await new Deno.Command("/usr/bin/frobnicate").output();',
      'await new Deno.Command("socat").output();',
    ].join("\n"),
  );
  try {
    const declared = await checkToolPaths(dir, PACKAGES);
    assertEquals(declared.offenders, [
      "tests/planted_test.ts:5 /usr/bin/frobnicate: no declared package has it",
    ]);
    assertEquals(declared.bare, ["tests/planted_test.ts:6 socat"]);
    // policy/nft_test.ts at 295bf8b: socat declared only for a helper that installs it
    // lazily, not among what `deno task test` installs first.
    const lazy = {
      ...PACKAGES,
      socat: { files: ["/usr/bin/socat"], users: ["bench"] },
    } satisfies Record<string, AptPackage>;
    assertEquals((await checkToolPaths(dir, lazy)).offenders, [
      'tests/planted_test.ts:2 /usr/bin/socat: its package "socat" is not installed for "test"',
      "tests/planted_test.ts:5 /usr/bin/frobnicate: no declared package has it",
    ]);
    const { socat: _, ...withoutSocat } = PACKAGES;
    assertEquals((await checkToolPaths(dir, withoutSocat)).offenders.length, 2);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("every tool path in tests/, scripts/, bench/, deploy/ and the shipped folders is a file of a package its users install", async () => {
  const check = await checkToolPaths(ROOT, PACKAGES, EXEMPTIONS);
  assertEquals(check.offenders, [], "declare the package in scripts/_deps.ts");
  assertEquals(
    check.bare,
    [],
    "run the program by its absolute path, declared in scripts/_deps.ts",
  );
  assertEquals(check.stale, [], "an exemption that matches nothing");
  const unnamed = Object.keys(PACKAGES).filter((p) => !check.named.has(p));
  assertEquals(unnamed, [], "a declared package no source names: drop it");
});

const DenoJsonSchema = z.object({
  permissions: z.object({ enim: z.object({ run: z.array(z.string()) }) }),
});

Deno.test("every program of the enim permission set comes from a package the demo, the tests and the bench install", async () => {
  const { run } = DenoJsonSchema.parse(JSON.parse(await Deno.readTextFile(`${ROOT}/deno.json`)))
    .permissions.enim;
  assert(run.length > 0);
  for (const path of run) {
    const pkg = packageOf(path);
    assert(pkg !== null, `"${path}" (deno.json's enim run list) is in no declared package`);
    assertEquals(PACKAGES[pkg].users, ["demo", "test", "bench", "bench-cri"], pkg);
  }
});

Deno.test("the tests install every package the demo installs (tests/demo_test.ts runs it)", () => {
  const notForTests = Object.entries(PACKAGES)
    .filter(([, p]) => p.users.includes("demo") && !p.users.includes("test"))
    .map(([n]) => n);
  assertEquals(notForTests, []);
});

const DPKG = "/usr/bin/dpkg";
const DPKG_QUERY = "/usr/bin/dpkg-query";
const hasDpkg = (() => {
  try {
    return Deno.statSync(DPKG_QUERY).isFile;
  } catch {
    return false;
  }
})();

/** The other spelling of a path under merged /usr: `/usr/bin/cat` and `/bin/cat`. */
function alias(path: string): string {
  return path.startsWith("/usr/") ? path.slice(4) : `/usr${path}`;
}

Deno.test({
  name: "each declared file of an installed package belongs to that package (dpkg -S)",
  ignore: !hasDpkg,
  async fn() {
    const dec = new TextDecoder();
    const q = await new Deno.Command(DPKG_QUERY, {
      args: ["-W", "-f", "${Package} ${db:Status-Status}\n"],
      stdout: "piped",
      stderr: "null",
    }).output();
    const installed = new Set(
      dec.decode(q.stdout).split("\n").filter((l) => l.endsWith(" installed"))
        .map((l) => l.split(" ")[0]),
    );
    const checked: [string, string, string[]][] = [];
    for (const [pkg, p] of Object.entries(PACKAGES)) {
      if (!installed.has(pkg)) continue;
      for (const file of p.files) {
        let real = file;
        try {
          real = await Deno.realPath(file);
        } catch { /* missing: dpkg says so */ }
        checked.push([pkg, file, [...new Set([file, alias(file), real, alias(real)])]]);
      }
    }
    const s = await new Deno.Command(DPKG, {
      args: ["-S", ...new Set(checked.flatMap(([, , c]) => c))],
      stdout: "piped",
      stderr: "null",
    }).output();
    const owners = new Map<string, string[]>();
    for (const line of dec.decode(s.stdout).split("\n")) {
      const m = /^([^/]+): (\/.*)$/.exec(line);
      if (!m || m[1].startsWith("diversion by")) continue;
      owners.set(m[2], m[1].split(", ").map((n) => n.replace(/:[a-z0-9]+$/, "")));
    }
    const wrong = checked
      .filter(([pkg, , candidates]) => !candidates.some((c) => owners.get(c)?.includes(pkg)))
      .map(([pkg, file, c]) => `${file} is not "${pkg}"'s (${c.join(" ")})`);
    assertEquals(wrong, []);
    console.error(`checked ${checked.length} files of ${installed.size} installed packages`);
  },
});
