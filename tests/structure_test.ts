/**
 * The codebase's shape, checked (issue 15): no production module imports from
 * `tests/`, the module graph of `main.ts` has no import cycle (type-only imports
 * included), and a production file over 400 lines says at its top why it is one
 * file.
 */
import { assertEquals } from "../lib/assert.ts";
import { ROOT } from "./_enim.ts";

/** The folders whose modules ship. */
const PRODUCTION = ["cli", "cni", "manager", "providers", "netns", "lib"];

async function* productionFiles(): AsyncGenerator<string> {
  for (const dir of PRODUCTION) yield* walk(`${ROOT}/${dir}`);
  yield `${ROOT}/main.ts`;
}

async function* walk(dir: string): AsyncGenerator<string> {
  for await (const e of Deno.readDir(dir)) {
    const p = `${dir}/${e.name}`;
    if (e.isDirectory) yield* walk(p);
    else if (e.name.endsWith(".ts") && !/_(test|bench)\.ts$/.test(e.name)) yield p;
  }
}

Deno.test("no production module imports from tests/", async () => {
  const offenders: string[] = [];
  for await (const f of productionFiles()) {
    const text = await Deno.readTextFile(f);
    for (const m of text.matchAll(/(?:from|import)\s*\(?\s*"([^"]+)"/g)) {
      if (/(^|\/)tests\//.test(m[1])) offenders.push(`${f.slice(ROOT.length + 1)} → ${m[1]}`);
    }
  }
  assertEquals(offenders, []);
});

Deno.test("the module graph of main.ts has no import cycle", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", `${ROOT}/main.ts`],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: {
      specifier: string;
      dependencies?: { code?: { specifier?: string }; type?: { specifier?: string } }[];
    }[];
  };
  const graph = new Map<string, string[]>();
  for (const m of info.modules) {
    if (!m.specifier.startsWith("file://")) continue;
    graph.set(
      m.specifier,
      (m.dependencies ?? []).flatMap((d) => [d.code?.specifier, d.type?.specifier])
        .filter((s): s is string => s?.startsWith("file://") ?? false),
    );
  }
  const cycles: string[] = [];
  const state = new Map<string, "open" | "done">();
  const stack: string[] = [];
  const visit = (u: string) => {
    state.set(u, "open");
    stack.push(u);
    for (const v of graph.get(u) ?? []) {
      if (state.get(v) === "open") {
        cycles.push(
          [...stack.slice(stack.indexOf(v)), v].map((s) => s.split("/main/")[1]).join(" → "),
        );
      } else if (!state.has(v)) visit(v);
    }
    stack.pop();
    state.set(u, "done");
  };
  for (const u of graph.keys()) if (!state.has(u)) visit(u);
  assertEquals(graph.size > 50, true, "deno info saw the graph");
  assertEquals(cycles, []);
});

Deno.test("a production file over 400 lines says at its top why it is one file", async () => {
  const unexplained: string[] = [];
  for await (const f of productionFiles()) {
    const text = await Deno.readTextFile(f);
    const lines = text.split("\n").length;
    const head = text.split("\n").slice(0, 40).join("\n");
    if (lines > 400 && !/Why one file:/.test(head)) {
      unexplained.push(`${f.slice(ROOT.length + 1)} (${lines} lines)`);
    }
  }
  assertEquals(unexplained, []);
});
