/**
 * The codebase's shape, checked (issue 15): no production module imports from
 * `tests/`, the module graph of `main.ts` has no import cycle (type-only imports
 * included), and a production file over 400 lines says at its top why it is one
 * file. Issue 32: benches live in `bench/`, never in a shipped folder, and a fake in
 * a shipped folder says at its top why it ships.
 */
import { assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";

/** The folders whose modules ship (one not made yet is skipped). */
const PRODUCTION = [
  "agent",
  "api",
  "cli",
  "cni",
  "manager",
  "providers",
  "netns",
  "lib",
  "kube",
  "policy",
];

async function* productionFiles(): AsyncGenerator<string> {
  for await (const p of shippedFolderFiles()) {
    const name = p.slice(p.lastIndexOf("/") + 1);
    if (name.endsWith(".ts") && !/_(test|bench)\.ts$/.test(name)) yield p;
  }
  yield `${ROOT}/main.ts`;
}

/** Every file under the production folders, tests and all. */
async function* shippedFolderFiles(): AsyncGenerator<string> {
  for (const dir of PRODUCTION) {
    try {
      await Deno.stat(`${ROOT}/${dir}`);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) continue;
      throw err;
    }
    yield* walk(`${ROOT}/${dir}`);
  }
}

async function* walk(dir: string): AsyncGenerator<string> {
  for await (const e of Deno.readDir(dir)) {
    const p = `${dir}/${e.name}`;
    if (e.isDirectory) yield* walk(p);
    else yield p;
  }
}

Deno.test("no production module imports from tests/", async () => {
  const offenders: string[] = [];
  for await (const f of productionFiles()) {
    const text = await Deno.readTextFile(f);
    for (const m of text.matchAll(/(?:from|import)\s*\(?\s*"([^"]+)"/g)) {
      if (/(^|\/)tests\//.test(m[1])) {
        offenders.push(`${f.slice(ROOT.length + 1)} → ${m[1]}`);
      }
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
      dependencies?: {
        code?: { specifier?: string };
        type?: { specifier?: string };
      }[];
    }[];
  };
  const graph = new Map<string, string[]>();
  for (const m of info.modules) {
    if (!m.specifier.startsWith("file://")) continue;
    graph.set(
      m.specifier,
      (m.dependencies ?? []).flatMap((
        d,
      ) => [d.code?.specifier, d.type?.specifier])
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
          [...stack.slice(stack.indexOf(v)), v].map((s) => s.split("/main/")[1])
            .join(" → "),
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

/** The top-level folder of a repository-relative path (`main.ts` for the entry point). */
function room(rel: string): string {
  return rel.includes("/") ? rel.slice(0, rel.indexOf("/")) : rel;
}

/** Every relative import of every production file, as [from, to] repository-relative paths. */
async function productionEdges(): Promise<[string, string][]> {
  const edges: [string, string][] = [];
  for await (const f of productionFiles()) {
    const rel = f.slice(ROOT.length + 1);
    const text = await Deno.readTextFile(f);
    for (
      const m of text.matchAll(/(?:from|import)\s*\(?\s*"(\.{1,2}\/[^"]+)"/g)
    ) {
      const target = new URL(m[1], `file:///${rel}`).pathname.slice(1);
      edges.push([rel, target]);
    }
  }
  return edges;
}

Deno.test("no two production folders import each other (the rooms have floors)", async () => {
  const pairs = new Set<string>();
  for (const [from, to] of await productionEdges()) {
    if (room(from) !== room(to)) pairs.add(`${room(from)} → ${room(to)}`);
  }
  const both = [...pairs].filter((p) => {
    const [a, b] = p.split(" → ");
    return a < b && pairs.has(`${b} → ${a}`);
  });
  assertEquals(both, []);
});

Deno.test("the CNI plugin process reaches nothing of kube/ (the agent alone talks to Kubernetes)", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "--config", `${ROOT}/deno.json`, `${ROOT}/cni/main.ts`],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string }[];
  };
  const files = info.modules.map((m) => m.specifier).filter((s) => s.startsWith("file://"));
  assertEquals(files.length > 5, true, "deno info saw the plugin's graph");
  assertEquals(files.filter((s) => s.startsWith(`file://${ROOT}/kube/`)), []);
});

Deno.test("api/ is below its users: it imports none of cni/, cli/, agent/ or manager/", async () => {
  const up = (await productionEdges()).filter(([from, to]) =>
    room(from) === "api" &&
    ["cni", "cli", "agent", "manager"].includes(room(to))
  );
  assertEquals(up, []);
});

/** The npm package a specifier names (`npm:/@scope/name@1.2.3/sub` → `@scope/name`). */
function npmPackage(specifier: string): string {
  const bare = specifier.replace(/^npm:\/?/, "");
  const parts = bare.split("/");
  const name = bare.startsWith("@") ? `${parts[0]}/${parts[1]}` : parts[0];
  return name.replace(/(.)@.*$/, "$1");
}

/** The npm packages `deno info` resolves from `entry` under the root config. */
async function npmPackagesOf(entry: string): Promise<string[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "info",
      "--json",
      "--config",
      `${ROOT}/deno.json`,
      `${ROOT}/${entry}`,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string }[];
  };
  return [
    ...new Set(
      info.modules.map((m) => m.specifier).filter((s) => s.startsWith("npm:"))
        .map(npmPackage),
    ),
  ].sort();
}

Deno.test("one import map per audience: production, and the tests' superset of it", async () => {
  const root = JSON.parse(await Deno.readTextFile(`${ROOT}/deno.json`)) as {
    imports: Record<string, string>;
  };
  const tests = JSON.parse(
    await Deno.readTextFile(`${ROOT}/tests/deno.json`),
  ) as {
    imports: Record<string, string>;
  };
  // The tests' map holds the production map unchanged (one version of each package).
  for (const [k, v] of Object.entries(root.imports)) {
    assertEquals(tests.imports[k], v, k);
  }
  // Every production entry is loaded by the shipped program or the demo: nothing test-only.
  const used = new Set([
    ...await npmPackagesOf("main.ts"),
    ...await npmPackagesOf("scripts/demo.ts"),
  ]);
  const unused = Object.values(root.imports).map(npmPackage).filter((p) => !used.has(p));
  assertEquals(unused, []);
  // The production lockfile, which the demo installs whole, holds only those packages' trees.
  const lock = JSON.parse(await Deno.readTextFile(`${ROOT}/deno.lock`)) as {
    specifiers: Record<string, string>;
  };
  assertEquals(
    [...new Set(Object.keys(lock.specifiers).map(npmPackage))].sort(),
    [...new Set(Object.values(root.imports).map(npmPackage))].sort(),
  );
});

Deno.test("test support lives under tests/: no shipped folder holds a fake, a fixture or a suite", async () => {
  const misplaced: string[] = [];
  for await (const f of productionFiles()) {
    const name = f.slice(f.lastIndexOf("/") + 1);
    if (/^_(testing|fake|run)|contract_suite/.test(name)) {
      misplaced.push(f.slice(ROOT.length + 1));
    }
  }
  assertEquals(misplaced, []);
});

Deno.test("benches live in bench/: no shipped folder holds a *_bench.ts or a bench folder", async () => {
  const misplaced: string[] = [];
  for await (const f of shippedFolderFiles()) {
    const rel = f.slice(ROOT.length + 1);
    if (/_bench\.ts$/.test(rel) || /(^|\/)(bench|benches|_bench)\//.test(rel)) {
      misplaced.push(rel);
    }
  }
  assertEquals(misplaced, []);
});

Deno.test("a fake in a shipped folder says at its top why it ships", async () => {
  const unexplained: string[] = [];
  for await (const f of productionFiles()) {
    const name = f.slice(f.lastIndexOf("/") + 1);
    if (!/fake/i.test(name)) continue;
    const head = (await Deno.readTextFile(f)).split("\n").slice(0, 40).join("\n");
    if (!/Why it ships:/.test(head)) unexplained.push(f.slice(ROOT.length + 1));
  }
  assertEquals(unexplained, []);
});
