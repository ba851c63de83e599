import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { join, ROOT } from "./_paths.ts";
import { checkDenort, compileArgs, denortLocation } from "./compile.ts";

const dec = new TextDecoder();

/** Deno's cache directory (the tests keep it: an empty one would refetch npm packages). */
async function denoDir(): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), { args: ["info", "--json"] }).output();
  return JSON.parse(dec.decode(out.stdout)).denoDir;
}

/** Whether deno compile could find denort here without the network (then nothing is tested). */
const denortAtHand = await (async () => {
  try {
    return Deno.statSync(denortLocation(await denoDir()).cachePath).isFile;
  } catch {
    return false;
  }
})();
if (denortAtHand) {
  console.error("compile_test: denort is in deno's cache here; the offline failure is not tested");
}

/**
 * Runs `deno task compile --output <tmp>` with no denort in reach: no DENORT_BIN (unless
 * given) and a proxy that refuses connections, so the result is the same with or without
 * internet.
 */
async function compileOffline(extraEnv: Record<string, string>) {
  const dir = await Deno.makeTempDir({ prefix: "enim-compile-" });
  try {
    const env: Record<string, string> = {
      PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
      HOME: Deno.env.get("HOME") ?? dir,
      DENO_DIR: await denoDir(),
      HTTPS_PROXY: "http://127.0.0.1:9",
      HTTP_PROXY: "http://127.0.0.1:9",
      NO_COLOR: "1",
      ...extraEnv,
    };
    const child = new Deno.Command(Deno.execPath(), {
      args: ["task", "-q", "compile", "--output", join(dir, "enim")],
      cwd: ROOT,
      clearEnv: true,
      env,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const started = Date.now();
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    const out = await child.output().finally(() => clearTimeout(timer));
    const seconds = (Date.now() - started) / 1000;
    let produced = true;
    try {
      Deno.statSync(join(dir, "enim"));
    } catch {
      produced = false;
    }
    return { code: out.code, stderr: dec.decode(out.stderr), seconds, produced };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test({
  name: "deno task compile without denort fails fast and says how to supply DENORT_BIN",
  ignore: denortAtHand,
}, async () => {
  const res = await compileOffline({});
  assertEquals(res.code, 1, res.stderr);
  assert(res.seconds < 30, `took ${res.seconds}s`);
  assert(!res.produced, "no binary is left behind");
  assertStringIncludes(res.stderr, "DENORT_BIN=/path/to/denort deno task compile");
  assertStringIncludes(res.stderr, `denort-${Deno.build.target}.zip`);
  assertStringIncludes(res.stderr, "cannot be reached");
});

Deno.test("deno task compile refuses a DENORT_BIN that is missing or is the deno CLI", async (t) => {
  await t.step("missing", async () => {
    const res = await compileOffline({ DENORT_BIN: "/nonexistent/denort" });
    assertEquals(res.code, 1);
    assertStringIncludes(res.stderr, 'DENORT_BIN "/nonexistent/denort" does not exist');
    assertStringIncludes(res.stderr, "DENORT_BIN=/path/to/denort deno task compile");
  });
  await t.step("the deno CLI", async () => {
    const res = await compileOffline({ DENORT_BIN: Deno.execPath() });
    assertEquals(res.code, 1);
    assertStringIncludes(res.stderr, "is the deno CLI itself");
    assert(!res.produced);
  });
});

Deno.test("checkDenort() accepts a denort found in deno's cache without the network", async () => {
  const dir = await Deno.makeTempDir({ prefix: "enim-denort-" });
  try {
    const loc = denortLocation(dir);
    assertEquals(
      loc.cachePath,
      join(dir, "dl", "release", `v${Deno.version.deno}`, `denort-${Deno.build.target}.zip`),
    );
    await Deno.mkdir(join(loc.cachePath, ".."), { recursive: true });
    await Deno.writeFile(loc.cachePath, new Uint8Array([0x50, 0x4b]));
    assertEquals(await checkDenort({}, loc, 1), undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("compileArgs() compiles the bundle with the enim permission set and no config", () => {
  const flags = ["--allow-env=CNI_*", "--allow-read=/run/enim"];
  const entry = `${ROOT}/dist/bundle/main.js`;
  assertEquals(compileArgs("/out/enim", entry, flags), [
    "compile",
    "--no-config",
    "--no-lock",
    "--v8-flags=--max-semi-space-size=1,--lite-mode,--heap-growing-percent=30",
    ...flags,
    "--output",
    "/out/enim",
    entry,
  ]);
  const real = compileArgs("/out/enim", entry);
  for (const kind of ["env", "read", "write", "run", "sys"]) {
    assert(real.some((a) => a.startsWith(`--allow-${kind}=`)), `--allow-${kind} is baked in`);
  }
  // The agent reaches whatever API server and cloud endpoint its config names (issue 50).
  assert(real.includes("--allow-net"), "the whole network is baked in");
  assert(!real.includes("--allow-all") && !real.includes("-A"));
});
