/**
 * The agent's options are documented where a user looks for them, and every documented
 * example is a config the agent accepts (issue 25 point 5):
 *
 * - the option keys come from the schemas themselves: the agent config's
 *   (`agent/config.ts`) with, under `provider.<name>`, each provider module's own
 *   `configSchema`, walked key by key (a record's keys, such as profile names, as `*`);
 * - README.md's table "Every agent option" names every one of them and nothing else;
 * - deploy/agent.jsonc holds every one of them, set or as a commented-out line (`// "key": …`);
 * - every JSONC example in README.md and deploy/README.md, deploy/agent.jsonc as shipped
 *   and with every commented-out option enabled, and the DaemonSet's ConfigMap parse
 *   through the agent's config schema and each present provider section's schema.
 *
 * A key added to a schema without documenting it fails here until it is documented.
 */
import * as z from "zod/mini";
import { parseAllDocuments } from "yaml";
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";
import { AgentConfigSchema, parseConfigText, resolveConfig } from "../agent/config.ts";
import { loadProvider, PROVIDER_NAMES } from "../providers/registry.ts";

/** The parts of a zod schema's definition the walk reads. */
interface SchemaDef {
  type: string;
  shape?: Record<string, Walkable>;
  innerType?: Walkable;
  in?: Walkable;
  valueType?: Walkable;
  element?: Walkable;
  options?: Walkable[];
  left?: Walkable;
  right?: Walkable;
  getter?: () => Walkable;
}
/** Any zod schema (classic or mini). */
interface Walkable {
  _zod: { def: SchemaDef };
}

/** Every key path of `schema` (a record's keys as `*`), containers included. */
export function keyPaths(schema: Walkable, prefix: string[] = []): string[][] {
  const def = schema._zod.def;
  switch (def.type) {
    case "object":
      return Object.entries(def.shape!).flatMap(([k, v]) => [
        [...prefix, k],
        ...keyPaths(v, [...prefix, k]),
      ]);
    case "optional":
    case "nullable":
    case "default":
    case "prefault":
    case "nonoptional":
    case "readonly":
    case "catch":
      return keyPaths(def.innerType!, prefix);
    case "pipe":
      return keyPaths(def.in!, prefix);
    case "record":
      return keyPaths(def.valueType!, [...prefix, "*"]);
    case "array":
      return keyPaths(def.element!, prefix);
    case "union":
      return def.options!.flatMap((o) => keyPaths(o, prefix));
    case "intersection":
      return [...keyPaths(def.left!, prefix), ...keyPaths(def.right!, prefix)];
    case "lazy":
      return keyPaths(def.getter!(), prefix);
    default:
      return [];
  }
}

/** Every option key of the agent config: the agent's own, then each provider's section. */
async function optionKeys(): Promise<string[]> {
  const paths = keyPaths(AgentConfigSchema as unknown as Walkable)
    // A provider's section is a record here; its module's schema says what it holds.
    .filter((p) =>
      !(p[0] === "provider" && PROVIDER_NAMES.includes(p[1] as never) && p.length > 2)
    );
  for (const name of PROVIDER_NAMES) {
    const mod = await loadProvider(name);
    paths.push(...keyPaths(mod.configSchema as unknown as Walkable, ["provider", name]));
  }
  return [...new Set(paths.map((p) => p.join(".")))];
}

/** The keys no other key extends: the options themselves (their sections are implied). */
function leaves(keys: string[]): string[] {
  return keys.filter((k) => !keys.some((o) => o.startsWith(`${k}.`)));
}

/** Whether a documented key (`a.b.<name>.c` or a concrete `a.b.pci.c`) is schema key `k`. */
function matches(schemaKey: string, documented: string): boolean {
  const re = new RegExp(
    `^${
      schemaKey.split(".").map((s) => s === "*" ? "[^.]+" : s.replace(/[$^\\]/g, "\\$&")).join(
        "\\.",
      )
    }$`,
  );
  return re.test(documented);
}

/** Every key path a parsed config holds (arrays' objects under their array's key). */
function pathsOf(value: unknown, prefix: string[] = []): string[] {
  if (Array.isArray(value)) return value.flatMap((v) => pathsOf(v, prefix));
  if (value === null || typeof value !== "object") return [];
  return Object.entries(value).flatMap(([k, v]) => [
    [...prefix, k].join("."),
    ...pathsOf(v, [...prefix, k]),
  ]);
}

/**
 * deploy/agent.jsonc with every commented-out option enabled: a comment line whose text
 * is JSON (`"key": …`, or a brace or bracket closing one) loses its `// `, and the code
 * line before an enabled key gets the comma it needs. Prose never starts with a quoted key
 * followed by a colon, so it stays a comment.
 */
function enableAll(text: string): string {
  const out: string[] = [];
  let lastCode = -1;
  for (const line of text.split("\n")) {
    const m = /^(\s*)\/\/ ?(?=\s*("[^"]+"\s*:|[}\]]))(.*)$/.exec(line);
    const code = m ? `${m[1]}${m[3]}` : line;
    if (m && /^\s*"/.test(m[3]) && lastCode >= 0 && !/[,{[]\s*$/.test(out[lastCode])) {
      out[lastCode] += ",";
    }
    out.push(code);
    if (code.trim() !== "" && !code.trim().startsWith("//")) lastCode = out.length - 1;
  }
  return out.join("\n");
}

/** The fenced blocks of a Markdown text in one of `langs`. */
function fenced(text: string, langs: string[]): { lang: string; body: string; line: number }[] {
  const out: { lang: string; body: string; line: number }[] = [];
  const re = /^```(\w*)\n([\s\S]*?)^```/gm;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    if (langs.includes(m[1])) {
      out.push({ lang: m[1], body: m[2], line: text.slice(0, m.index).split("\n").length });
    }
  }
  return out;
}

/**
 * Parses one documented config through the agent's schema (`resolveConfig`, as the agent
 * does) and each provider section it holds through that provider's schema; returns the
 * problems (empty when it is valid).
 */
async function problemsOf(where: string, text: string): Promise<string[]> {
  let raw: Record<string, unknown>;
  try {
    resolveConfig({ file: { path: where, text } });
    raw = parseConfigText(where, text) as Record<string, unknown>;
  } catch (err) {
    return [`${where}: ${err instanceof Error ? err.message : err}`];
  }
  const provider = (raw.provider ?? {}) as Record<string, unknown>;
  const out: string[] = [];
  for (const name of PROVIDER_NAMES) {
    if (provider[name] === undefined) continue;
    const mod = await loadProvider(name);
    const r = z.safeParse(mod.configSchema, provider[name]);
    if (!r.success) {
      out.push(
        ...r.error.issues.map((i) =>
          `${where}: provider.${name}.${i.path.join(".")}: ${i.message}`
        ),
      );
    }
  }
  return out;
}

const README = await Deno.readTextFile(`${ROOT}/README.md`);
const DEPLOY_README = await Deno.readTextFile(`${ROOT}/deploy/README.md`);
const AGENT_JSONC = await Deno.readTextFile(`${ROOT}/deploy/agent.jsonc`);

/** The option keys README.md's "Every agent option" table names (first column). */
function readmeOptionKeys(): string[] {
  const start = README.indexOf("### Every agent option\n");
  assert(start >= 0, 'README.md has a section "### Every agent option"');
  const rest = README.slice(README.indexOf("\n", start));
  const section = rest.slice(0, rest.search(/^#{2,3} /m));
  const keys: string[] = [];
  for (const line of section.split("\n")) {
    const first = /^\|([^|]*)\|/.exec(line)?.[1];
    if (!first) continue;
    for (const m of first.matchAll(/`([^`]+)`/g)) keys.push(m[1].replaceAll("<name>", "*"));
  }
  return keys;
}

Deno.test("every agent config option is in README.md's table, and the table names no other", async () => {
  const options = leaves(await optionKeys());
  const documented = readmeOptionKeys();
  const missing = options.filter((k) => !documented.some((d) => matches(k, d)));
  assertEquals(
    missing,
    [],
    `options of the config schema missing from README.md "Every agent option": ${
      missing.join(", ")
    }`,
  );
  const stale = documented.filter((d) => !options.some((k) => matches(k, d)));
  assertEquals(
    stale,
    [],
    `README.md documents options the schema does not have: ${stale.join(", ")}`,
  );
});

Deno.test("every agent config option is in deploy/agent.jsonc, set or commented out", async () => {
  const options = await optionKeys();
  const enabled = parseConfigText(
    "deploy/agent.jsonc (every option enabled)",
    enableAll(AGENT_JSONC),
  );
  const present = pathsOf(enabled);
  const missing = options.filter((k) => !present.some((d) => matches(k, d)));
  assertEquals(missing, [], `options missing from deploy/agent.jsonc: ${missing.join(", ")}`);
});

Deno.test("every documented agent config example is valid", async (t) => {
  const examples: { where: string; text: string }[] = [
    { where: "deploy/agent.jsonc", text: AGENT_JSONC },
    { where: "deploy/agent.jsonc (every option enabled)", text: enableAll(AGENT_JSONC) },
  ];
  for (const [file, text] of [["README.md", README], ["deploy/README.md", DEPLOY_README]]) {
    for (const b of fenced(text, ["json", "jsonc"])) {
      // A CNI network config (it names its spec version) is the plugin's, not the agent's.
      if (/"cniVersion"/.test(b.body)) continue;
      // A fragment (`"provider": {…}`) is shown as it sits in the file's top-level object.
      const body = b.body.trim().startsWith("{") ? b.body : `{\n${b.body}\n}`;
      examples.push({ where: `${file} line ${b.line} (${b.lang})`, text: body });
    }
  }
  const cms = parseAllDocuments(await Deno.readTextFile(`${ROOT}/deploy/kubernetes/configmap.yaml`))
    .map((d) => d.toJS()).filter((d) => d?.data?.["agent.jsonc"] !== undefined);
  assertEquals(cms.length, 1, "the ConfigMap holding agent.jsonc");
  examples.push({ where: "deploy/kubernetes/configmap.yaml", text: cms[0].data["agent.jsonc"] });
  assert(examples.some((e) => e.where.startsWith("README.md")), "README.md shows a config");
  for (const e of examples) {
    await t.step(e.where, async () => assertEquals(await problemsOf(e.where, e.text), []));
  }
});

Deno.test("the doc check itself: a key missing from the docs is found", () => {
  // A schema with one more option than documented: the walk finds it, the docs lack it.
  const extra = z.strictObject({
    gc: z.strictObject({ graceSeconds: z.number(), newKnob: z.optional(z.boolean()) }),
    provider: z.strictObject({
      mock: z.strictObject({
        profiles: z.record(z.string(), z.strictObject({ zone: z.string() })),
      }),
    }),
  });
  const keys = leaves(keyPaths(extra as unknown as Walkable).map((p) => p.join(".")));
  assertEquals(keys, ["gc.graceSeconds", "gc.newKnob", "provider.mock.profiles.*.zone"]);
  const documented = readmeOptionKeys();
  assertEquals(keys.filter((k) => !documented.some((d) => matches(k, d))), [
    "gc.newKnob",
    "provider.mock.profiles.*.zone",
  ]);
  assert(matches("provider.mock.profiles.*.enis", "provider.mock.profiles.pci.enis"));
  assert(!matches("provider.mock.enis", "provider.mock.profiles.pci.enis"));
  // The enabling of commented-out options leaves prose alone.
  assertEquals(
    enableAll('  "a": 1\n  // "file": "/x",\n  // One of "a", "b".\n  //   "k": 1,\n  // },'),
    '  "a": 1,\n  "file": "/x",\n  // One of "a", "b".\n    "k": 1,\n  },',
  );
});
