/**
 * The plugin's start-up cost is what its process loads. The plugin process
 * (`cni/forward.ts`) must load no npm package and none of the agent's, the
 * CLI's or the providers' code: in the sources, and in the built bundle that
 * ships (`dist/bundle`), where its chunk, and the plugin entry the launcher runs, must import
 * nothing at all.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";
import { ensureBuiltSync, pluginEntry } from "../scripts/build.ts";
import { dirname, join } from "node:path";

/** Every module specifier `deno info` resolves from `entry`. */
async function moduleGraph(entry: string): Promise<string[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "--config", `${ROOT}/deno.json`, entry],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert(out.success, new TextDecoder().decode(out.stderr));
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string }[];
  };
  return info.modules.map((m) => m.specifier.replace(`file://${ROOT}/`, ""));
}

Deno.test("the plugin process's sources load only the wire, the spec, the log file, the version and lib's text helpers", async () => {
  const graph = (await moduleGraph(`${ROOT}/cni/forward.ts`)).sort();
  assertEquals(graph, [
    "api/wire.ts",
    "cni/forward.ts",
    "cni/log_file.ts",
    "cni/spec.ts",
    "lib/clip.ts",
    "lib/http1.ts",
    "lib/log.ts",
    "lib/timestamp.ts",
    "lib/utf8.ts",
    "lib/version.ts",
  ]);
});

/** The relative modules a bundled file imports statically (`import … from "./x.js"`). */
function staticImports(file: string): string[] {
  const text = Deno.readTextFileSync(file);
  return [...text.matchAll(/^\s*(?:import|export)\b[^;'"]*?from\s*["']([^"']+)["']/gm)]
    .map((m) => m[1])
    .concat([...text.matchAll(/^\s*import\s*["']([^"']+)["']/gm)].map((m) => m[1]));
}

Deno.test("in the shipped bundle the CNI role loads two small files through main.js, and one through the plugin entry", () => {
  const entry = ensureBuiltSync();
  assertEquals(staticImports(entry), [], "main.js imports nothing statically");
  const main = Deno.readTextFileSync(entry);
  const dynamic = [...main.matchAll(/import\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1]);
  assertEquals(dynamic.length, 2, `main.js loads one module per role: ${dynamic.join(", ")}`);
  const forward = dynamic.filter((d) => /forward/.test(d));
  assertEquals(forward.length, 1, `no plugin chunk among ${dynamic.join(", ")}`);
  // What the launcher runs for a CNI call: the plugin entry, one file, importing nothing.
  const plugin = pluginEntry(entry);
  for (const file of [join(dirname(entry), forward[0]), plugin]) {
    const code = Deno.readTextFileSync(file);
    assertEquals(staticImports(file), [], `${file} imports nothing`);
    assert(!/import\(/.test(code), `${file} imports nothing dynamically`);
    for (const marker of ["zod", "commander", "node:", "sqlite", "ZodError"]) {
      assert(!code.includes(marker), `${file} mentions "${marker}"`);
    }
    assert(code.length < 40_000, `${file} is ${code.length} bytes`);
  }
  // The plugin entry is the forward chunk's code, minified: both answer a CNI call alone.
  assert(
    Deno.readTextFileSync(plugin).length <
      Deno.readTextFileSync(join(dirname(entry), forward[0])).length,
    "the plugin entry is minified",
  );
});
