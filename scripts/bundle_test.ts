/**
 * What the agent's part of the shipped bundle (`dist/bundle/cli/`) may hold.
 *
 * Classic zod (`import { z } from "zod"`) costs the agent memory and bundle size:
 * its `z` namespace keeps every schema class, all of zod's core, every locale and
 * the JSON Schema code alive, whatever the program uses, and as esbuild splits by
 * file they land in the chunk the agent shares with zod/mini (~380 KB). All
 * production code is on `zod/mini`, with English messages only
 * (`lib/zod_locale.ts`), so no chunk the agent can load, the providers' included,
 * holds classic zod or another language's messages. The plugin process's chunk
 * is checked by `cni/import_graph_test.ts`: it imports nothing.
 *
 * @module
 */
import * as locales from "zod/locales";
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { bundleArgv, ensureBuiltSync } from "./build.ts";
import { dirname, join, ROOT } from "./_paths.ts";
import { runFromRoot } from "../tests/support/command.ts";

/**
 * Strings only classic zod defines: its base schema's and its error's constructor
 * names (zod/mini's are `"ZodMiniType"`, core's `"$ZodType"` and `"$ZodError"`). They
 * survive minification; {@linkcode bundleSource} checks that they still mark classic zod.
 */
const CLASSIC_MARKERS = ['"ZodType"', '"ZodError"'];

/**
 * How a string can appear in a bundle: as it is, and as esbuild writes it with
 * every non-ASCII character escaped (`"Ung\xFCltige"`, `"\u7121\u52B9"`).
 */
function bundleForms(s: string): string[] {
  const escaped = [...s].map((ch) => {
    const code = ch.charCodeAt(0);
    if (ch.length === 1 && code < 0x80) return ch;
    if (ch.length === 1 && code <= 0xff) return `\\x${code.toString(16).toUpperCase()}`;
    return [...Array(ch.length).keys()]
      .map((i) => `\\u${ch.charCodeAt(i).toString(16).toUpperCase().padStart(4, "0")}`)
      .join("");
  }).join("");
  return escaped === s ? [s] : [s, escaped];
}

/**
 * Non-English zod messages: each locale's message for an issue it has no words
 * for (English: "Invalid input"), read from zod's own locales, so they follow
 * zod's updates. A bundle that holds one of them can report errors in that
 * language; {@linkcode bundleSource} checks that the bundle of `z.locales` has them.
 */
const FOREIGN_MESSAGES: Map<string, string> = (() => {
  const message = (locale: () => { localeError: (issue: never) => unknown }) => {
    const m = locale().localeError({ code: "enim_unknown_code" } as never);
    return typeof m === "string" ? m : (m as { message: string }).message;
  };
  const english = message(locales.en);
  const out = new Map<string, string>();
  for (const [name, locale] of Object.entries(locales)) {
    if (typeof locale !== "function") continue; // the typings also list a default export
    const m = message(locale);
    if (name !== "en" && m !== english && m.length >= 5) out.set(m, name);
  }
  return out;
})();

/** The first non-English zod message `text` holds, and its locale; null when none. */
function foreignMessage(text: string): string | null {
  for (const [m, locale] of FOREIGN_MESSAGES) {
    if (bundleForms(m).some((f) => text.includes(f))) return `${locale} ("${m}")`;
  }
  return null;
}

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
    const out = await runFromRoot([
      Deno.execPath(),
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
    ]);
    assert(out.code === 0, out.stderr);
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
    'import * as z from "zod/mini";\nimport { en } from "zod/locales";\nz.config(en());\n' +
      "console.log(z.object({ a: z.string() }).safeParse({}).error);\n",
  );
  for (const marker of CLASSIC_MARKERS) {
    assert(classic.includes(marker), `classic zod's bundle lacks ${marker}`);
    assert(!mini.includes(marker), `zod/mini's bundle has ${marker}`);
  }
  // Classic zod's `z` keeps every locale: each one's message is found in its bundle.
  assert(FOREIGN_MESSAGES.size >= 40, `only ${FOREIGN_MESSAGES.size} non-English messages`);
  for (const [m, locale] of FOREIGN_MESSAGES) {
    assert(bundleForms(m).some((f) => classic.includes(f)), `${locale} ("${m}") not found`);
  }
  assertEquals(foreignMessage(mini), null, "zod/mini with English holds another language");
});

Deno.test("the agent's chunks, the providers' included, hold no classic zod and only English", () => {
  const dir = join(dirname(ensureBuiltSync()), "cli");
  const bce = chunkOf(dir, "providers/bce/mod.ts");
  const seen = new Set<string>();
  const problems: string[] = [];
  const walk = (chunk: string, from: string) => {
    if (seen.has(chunk)) return;
    seen.add(chunk);
    const text = Deno.readTextFileSync(join(dir, chunk));
    const where = `cli/${chunk} (reached from ${from})`;
    if (CLASSIC_MARKERS.some((m) => text.includes(m))) problems.push(`${where} holds classic zod`);
    const foreign = foreignMessage(text);
    if (foreign) problems.push(`${where} holds zod's ${foreign}`);
    const { static: imports, dynamic } = chunkImports(text);
    for (const d of imports) {
      if (d.slice(2) === bce) problems.push(`${where} imports the BCE provider's chunk statically`);
      walk(d.slice(2), chunk);
    }
    for (const d of dynamic) walk(d.slice(2), chunk);
  };
  walk("mod.js", "main.js");
  assertEquals(problems, []);
  // The walk reached the agent, the providers' registry and both providers.
  for (
    const source of [
      "agent/agent.ts",
      "providers/registry.ts",
      "providers/mock/mod.ts",
      "providers/bce/mod.ts",
      "providers/bce/client.ts",
    ]
  ) {
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

Deno.test("gRPC is in the device plugin's chunk only, which nothing imports statically", () => {
  const dir = join(dirname(ensureBuiltSync()), "cli");
  const plugin = chunkOf(dir, "agent/deviceplugin/plugin.ts");
  // grpc-js's user agent: a string only its code holds, minified or not.
  const marker = "grpc-node-js";
  assert(Deno.readTextFileSync(join(dir, plugin)).includes(marker), `${plugin} holds no gRPC`);
  const agent = chunkOf(dir, "agent/agent.ts");
  const problems: string[] = [];
  for (const e of Deno.readDirSync(dir)) {
    if (!e.name.endsWith(".js") || e.name === plugin) continue;
    const text = Deno.readTextFileSync(join(dir, e.name));
    if (text.includes(marker)) problems.push(`cli/${e.name} holds gRPC`);
    const { static: imports, dynamic } = chunkImports(text);
    if (imports.includes(`./${plugin}`)) {
      problems.push(`cli/${e.name} imports ${plugin} statically`);
    }
    if (e.name === agent && !dynamic.includes(`./${plugin}`)) {
      problems.push(`the agent's chunk does not load ${plugin} with import()`);
    }
  }
  assertEquals(problems, []);
});
