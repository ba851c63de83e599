/**
 * What the agent's part of the shipped bundle (`dist/bundle/cli/`) may hold.
 *
 * Classic zod (`import { z } from "zod"`) costs the agent ~20 MB of memory: its
 * `z` namespace keeps every schema class, every locale and the JSON Schema code
 * alive, whatever the program uses. Production code is on `zod/mini`; only the
 * BCE provider's chunk, which the agent loads when the provider is `bce`, may
 * still bring classic zod, until that provider is converted too. (Until then
 * classic zod's `z` also keeps all of zod's core and every locale alive, and as
 * esbuild splits by file, they sit in the chunk the agent shares with zod/mini:
 * ~380 KB the agent does not use.) The plugin process's chunk is checked by
 * `cni/import_graph_test.ts`: it imports nothing.
 *
 * @module
 */
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { bundleArgv, ensureBuiltSync } from "./build.ts";
import { dirname, join, ROOT } from "./_paths.ts";

/**
 * Strings only classic zod defines: its base schema's and its error's constructor
 * names (zod/mini's are `"ZodMiniType"`, core's `"$ZodType"` and `"$ZodError"`). They
 * survive minification; {@linkcode bundleSource} checks that they still mark classic zod.
 */
const CLASSIC_MARKERS = ['"ZodType"', '"ZodError"'];

/** The relative chunks a bundled file imports: statically, and through `import()`. */
function chunkImports(text: string): { static: string[]; dynamic: string[] } {
  const all = (re: RegExp) => [...text.matchAll(re)].map((m) => m[1]);
  return {
    static: [
      ...all(/\bfrom\s*["'](\.\/[^"']+\.js)["']/g),
      ...all(/\bimport\s*["'](\.\/[^"']+\.js)["']/g),
    ],
    dynamic: all(/\bimport\(\s*["'](\.\/[^"']+\.js)["']\s*\)/g),
  };
}

/** The chunk of `dir` whose source map names `source` (a path relative to the repository). */
function chunkOf(dir: string, source: string): string {
  const found = [...Deno.readDirSync(dir)]
    .filter((e) => e.name.endsWith(".js.map"))
    .filter((e) => {
      const map = JSON.parse(Deno.readTextFileSync(join(dir, e.name))) as { sources: string[] };
      return map.sources.some((s) => s.endsWith(`/${source}`));
    })
    .map((e) => e.name.replace(/\.map$/, ""));
  assertEquals(found.length, 1, `chunks built from ${source}: ${found.join(", ")}`);
  return found[0];
}

/** Bundles `source` (a module text using the repository's import map) as the CLI is bundled. */
async function bundleSource(source: string): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "enim-bundle-test-" });
  try {
    await Deno.writeTextFile(join(dir, "entry.ts"), source);
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "bundle",
        "--quiet",
        "--minify",
        "--platform",
        "deno",
        "--config",
        join(ROOT, "deno.json"),
        "--outdir",
        join(dir, "out"),
        join(dir, "entry.ts"),
      ],
      cwd: ROOT,
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).output();
    assert(out.success, new TextDecoder().decode(out.stderr));
    return Deno.readTextFileSync(join(dir, "out", "entry.js"));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("the classic zod markers are in a classic zod bundle and not in a zod/mini one", async () => {
  const classic = await bundleSource(
    'import { z } from "zod";\nconsole.log(z.object({ a: z.string() }).safeParse({}).error);\n',
  );
  const mini = await bundleSource(
    'import * as z from "zod/mini";\nconsole.log(z.object({ a: z.string() }).safeParse({}).error);\n',
  );
  for (const marker of CLASSIC_MARKERS) {
    assert(classic.includes(marker), `classic zod's bundle lacks ${marker}`);
    assert(!mini.includes(marker), `zod/mini's bundle has ${marker}`);
  }
});

Deno.test("the agent's chunks hold no classic zod; only the BCE provider's chunk may", () => {
  const dir = join(dirname(ensureBuiltSync()), "cli");
  const bce = chunkOf(dir, "providers/bce/mod.ts");
  const seen = new Set<string>();
  const walk = (chunk: string, from: string) => {
    if (chunk === bce || seen.has(chunk)) return;
    seen.add(chunk);
    const text = Deno.readTextFileSync(join(dir, chunk));
    for (const marker of CLASSIC_MARKERS) {
      assert(!text.includes(marker), `cli/${chunk} (reached from ${from}) holds classic zod`);
    }
    const { static: imports, dynamic } = chunkImports(text);
    for (const d of imports) {
      assert(d.slice(2) !== bce, `cli/${chunk} imports the BCE provider's chunk statically`);
      walk(d.slice(2), chunk);
    }
    for (const d of dynamic) walk(d.slice(2), chunk);
  };
  walk("mod.js", "main.js");
  // The walk reached the agent, the providers' registry and the mock provider.
  for (const source of ["manager/agent.ts", "providers/registry.ts", "providers/mock/mod.ts"]) {
    assert(seen.has(chunkOf(dir, source)), `the walk missed the chunk of ${source}`);
  }
});

Deno.test("the bundled agent's zod/mini errors read in English", async () => {
  const [cmd, ...args] = bundleArgv(ensureBuiltSync());
  const out = await new Deno.Command(cmd, {
    args: [...args, "agent", "--check-config"],
    clearEnv: true,
    env: { PATH: "/usr/bin:/bin", ENIM_PROVIDER: "mock", ENIM_GC_INTERVAL: "-1", NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assertEquals(out.code, 1, stderr);
  assertMatch(
    stderr,
    /gc\.intervalSeconds \(from ENIM_GC_INTERVAL\): Too small: expected number to be >0/,
  );
});
