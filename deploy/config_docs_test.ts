/**
 * The configuration is documented where a user looks for it, and every documented
 * example is a config enim accepts (issue 25 point 5, issue 32):
 *
 * - the agent's option keys come from the schemas themselves: the agent config's
 *   (`agent/config.ts`) with, under `provider.<name>`, each provider module's own
 *   `configSchema`, walked key by key (a record's keys, such as profile names, as `*`);
 *   the fields of enim's section of the CNI config from `EnimSectionSchema`;
 * - each of them is documented once, in a table of the page of its subject
 *   (`SUBJECTS` below: an `| option | default | what |` table for the agent's options,
 *   a `| field | default | what |` table for the CNI config's fields), and those tables
 *   name nothing else;
 * - deploy/agent.jsonc holds every agent option, set or as a commented-out line (`// "key": …`);
 * - every JSON and JSONC example of README.md, docs/ and deploy/README.md parses: an
 *   agent config through the agent's config schema and each present provider section's
 *   schema, a CNI config (it names its `cniVersion`) through the plugin's config parser;
 *   so do deploy/agent.jsonc as shipped and with every commented-out option enabled, and
 *   the DaemonSet's ConfigMap.
 *
 * A key added to a schema without documenting it fails here until it is documented.
 */
import * as z from "zod/mini";
import { parseAllDocuments } from "yaml";
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";
import { AgentConfigSchema, parseConfigText, resolveConfig } from "../agent/config.ts";
import { EnimSectionSchema, parseNetworkConfig } from "../cni/config.ts";
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

/**
 * Parses one documented CNI config, a network config or a conflist (each of its plugins
 * that is enim or has enim as IPAM, with the list's `cniVersion` and `name`), as the
 * plugin does; returns the problems (empty when it is valid).
 */
function cniProblemsOf(where: string, text: string): string[] {
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    return [`${where}: ${err instanceof Error ? err.message : err}`];
  }
  const isEnim = (p: Record<string, unknown>) =>
    p.type === "enim" || (p.ipam as Record<string, unknown> | undefined)?.type === "enim";
  const configs = Array.isArray(raw.plugins)
    ? (raw.plugins as Record<string, unknown>[]).filter(isEnim)
      .map((p) => ({ cniVersion: raw.cniVersion, name: raw.name, ...p }))
    : [raw];
  if (configs.length === 0) return [`${where}: no plugin of the list is enim`];
  const out: string[] = [];
  for (const c of configs) {
    try {
      parseNetworkConfig(c);
    } catch (err) {
      out.push(`${where}: ${err instanceof Error ? err.message : err}`);
    }
  }
  return out;
}

/** The Markdown files that document the configuration: the README, docs/, deploy/README.md. */
async function docFiles(): Promise<Map<string, string>> {
  const pages: string[] = [];
  for await (const e of Deno.readDir(`${ROOT}/docs`)) {
    if (e.isFile && e.name.endsWith(".md")) pages.push(`docs/${e.name}`);
  }
  const files = new Map<string, string>();
  for (const f of ["README.md", ...pages.sort(), "deploy/README.md"]) {
    files.set(f, await Deno.readTextFile(`${ROOT}/${f}`));
  }
  return files;
}

const DOCS = await docFiles();
const AGENT_JSONC = await Deno.readTextFile(`${ROOT}/deploy/agent.jsonc`);

/** Which kind of key a documentation table lists, by its first header cell. */
type Kind = "option" | "field";

/** One documented key: a code span of a table's first column. */
interface Documented {
  key: string;
  file: string;
  line: number;
}

/**
 * The keys the tables of `files` document: every code span of the first column of a
 * table whose first header cell is `kind` (`<name>`, a profile's name, read as `*`).
 */
export function documentedKeys(files: Map<string, string>, kind: Kind): Documented[] {
  const out: Documented[] = [];
  for (const [file, text] of files) {
    const lines = text.split("\n");
    let inTable = false;
    let fence = false;
    for (let i = 0; i < lines.length; i++) {
      if (/^\s*```/.test(lines[i])) fence = !fence;
      const first = fence ? undefined : /^\|([^|]*)\|/.exec(lines[i])?.[1];
      if (first === undefined) {
        inTable = false;
        continue;
      }
      if (!/^\|/.test(lines[i - 1] ?? "")) inTable = first.trim() === kind; // a header
      else if (inTable && !/^[\s:-]+$/.test(first)) {
        for (const m of first.matchAll(/`([^`]+)`/g)) {
          out.push({ key: m[1].replaceAll("<name>", "*"), file, line: i + 1 });
        }
      }
    }
  }
  return out;
}

/** A subject: the keys it owns, and the page that documents them. */
interface Subject {
  page: string;
  owns: (key: string, keys: string[]) => boolean;
}

/** Whether `key` is the default profile's twin of a named profile's key (`provider.x.k` of `provider.x.profiles.*.k`). */
function defaultProfileKey(key: string, keys: string[]): boolean {
  const m = /^provider\.([^.]+)\.(.+)$/.exec(key);
  return m !== null && keys.includes(`provider.${m[1]}.profiles.*.${m[2]}`);
}

/** Each key's page: the first subject that owns it. */
const SUBJECTS: Record<Kind, Subject[]> = {
  option: [
    { page: "docs/scheduling.md", owns: (k) => k.startsWith("devicePlugin.") },
    { page: "docs/kubernetes.md", owns: (k) => k.startsWith("hostLink.") },
    { page: "docs/network_policy.md", owns: (k) => /^(networkPolicy|kubernetes)\./.test(k) },
    { page: "docs/operations.md", owns: (k) => /^(gc|log|metrics|health)\./.test(k) },
    {
      page: "docs/sticky_pods.md",
      owns: (k) =>
        /^sticky\.|^provider\.[^.]+\.(profiles\.\*\.)?sticky\./.test(k) ||
        /^provider\.bce\.(clusterId|timeouts\.(parkedExpiryGraceMs|stickyIndexTtlMs))$/.test(k),
    },
    {
      // A profile's keys, the default profile's, and the node's ENI limit they share.
      page: "docs/profiles.md",
      owns: (k, keys) =>
        k === "cloudDescriptions" || /^provider\.[^.]+\.(profiles\.|maxEnisPerNode$)/.test(k) ||
        defaultProfileKey(k, keys),
    },
    { page: "docs/agent.md", owns: () => true },
  ],
  field: [
    {
      page: "docs/kubernetes.md",
      owns: (k) => /^(serviceCidrs|hostStackCidrs|hostLink\.)/.test(k),
    },
    { page: "docs/configuration.md", owns: () => true },
  ],
};

/** The page that documents `key` (one of `keys`, the schema's). */
function pageOf(kind: Kind, key: string, keys: string[]): string {
  return SUBJECTS[kind].find((s) => s.owns(key, keys))!.page;
}

/**
 * What is wrong with how `files` document `keys` (the schema's leaves): a key documented
 * nowhere or more than once, or on a page not its subject's; a documented key the schema
 * does not have. Empty when the docs and the schema agree.
 */
export function docProblems(kind: Kind, keys: string[], files: Map<string, string>): string[] {
  const documented = documentedKeys(files, kind);
  const where = (d: Documented) => `${d.file}:${d.line}`;
  const problems: string[] = [];
  for (const k of keys) {
    const docs = documented.filter((d) => matches(k, d.key));
    const page = pageOf(kind, k, keys);
    if (docs.length === 0) {
      problems.push(`${kind} "${k}" is documented nowhere (its page: ${page})`);
    }
    if (docs.length > 1) {
      problems.push(
        `${kind} "${k}" is documented ${docs.length} times: ${docs.map(where).join(", ")}`,
      );
    }
    for (const d of docs.filter((d) => d.file !== page)) {
      problems.push(
        `${kind} "${k}" is documented in ${where(d)}, not on its subject's page ${page}`,
      );
    }
  }
  for (const d of documented.filter((d) => !keys.some((k) => matches(k, d.key)))) {
    problems.push(`${where(d)} documents ${kind} "${d.key}", which the schema does not have`);
  }
  return problems;
}

/** Every field of enim's section of the CNI config. */
function cniFields(): string[] {
  return leaves(keyPaths(EnimSectionSchema as unknown as Walkable).map((p) => p.join(".")));
}

Deno.test("every agent config option is documented once, on the page of its subject", async () => {
  assertEquals(docProblems("option", leaves(await optionKeys()), DOCS), []);
});

Deno.test("every field of enim's CNI config section is documented once, on the page of its subject", () => {
  assertEquals(docProblems("field", cniFields(), DOCS), []);
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

Deno.test("every documented config example is valid: agent configs and CNI configs", async (t) => {
  const examples: { where: string; text: string }[] = [
    { where: "deploy/agent.jsonc", text: AGENT_JSONC },
    { where: "deploy/agent.jsonc (every option enabled)", text: enableAll(AGENT_JSONC) },
  ];
  const cniExamples: { where: string; text: string }[] = [];
  for (const [file, text] of DOCS) {
    for (const b of fenced(text, ["json", "jsonc"])) {
      const where = `${file} line ${b.line} (${b.lang})`;
      // A CNI network config (it names its spec version) is the plugin's, not the agent's.
      if (/"cniVersion"/.test(b.body)) {
        cniExamples.push({ where, text: b.body });
        continue;
      }
      // A fragment (`"provider": {…}`) is shown as it sits in the file's top-level object.
      const body = b.body.trim().startsWith("{") ? b.body : `{\n${b.body}\n}`;
      examples.push({ where, text: body });
    }
  }
  const cms = parseAllDocuments(await Deno.readTextFile(`${ROOT}/deploy/kubernetes/configmap.yaml`))
    .map((d) => d.toJS()).filter((d) => d?.data?.["agent.jsonc"] !== undefined);
  assertEquals(cms.length, 1, "the ConfigMap holding agent.jsonc");
  examples.push({ where: "deploy/kubernetes/configmap.yaml", text: cms[0].data["agent.jsonc"] });
  // The BCE overlay's agent configuration (deploy/kubernetes/bce/agent-config.yaml).
  const bce = parseAllDocuments(
    await Deno.readTextFile(`${ROOT}/deploy/kubernetes/bce/agent-config.yaml`),
  ).map((d) => d.toJS()).filter((d) => d?.data?.["agent.jsonc"] !== undefined);
  assertEquals(bce.length, 1, "the BCE overlay's ConfigMap holding agent.jsonc");
  examples.push({
    where: "deploy/kubernetes/bce/agent-config.yaml",
    text: bce[0].data["agent.jsonc"],
  });
  assert(examples.some((e) => e.where.startsWith("docs/")), "docs/ shows an agent config");
  assert(cniExamples.some((e) => e.where.startsWith("docs/")), "docs/ shows a CNI config");
  for (const e of examples) {
    await t.step(e.where, async () => assertEquals(await problemsOf(e.where, e.text), []));
  }
  for (const e of cniExamples) {
    await t.step(e.where, () => assertEquals(cniProblemsOf(e.where, e.text), []));
  }
});

Deno.test("the doc check itself: a key missing, documented twice, on another page or unknown is found", () => {
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
  const table = (...rows: string[]) =>
    ["| option | default | what |", "| --- | --- | --- |", ...rows, ""].join("\n");
  const files = new Map([
    ["docs/operations.md", table("| `gc.graceSeconds` | 30 | x |", "| `gc.gone` | 1 | x |")],
    ["docs/agent.md", table("| `gc.graceSeconds` | 30 | x |")],
    // Neither another table's first column nor a table in a code block documents a key.
    [
      "docs/x.md",
      "| path | what |\n| --- | --- |\n| `gc.newKnob` | x |\n\n```\n" +
      table("| `gc.newKnob` | x | x |") + "```\n",
    ],
  ]);
  assertEquals(docProblems("option", keys, files), [
    'option "gc.graceSeconds" is documented 2 times: docs/operations.md:3, docs/agent.md:3',
    'option "gc.graceSeconds" is documented in docs/agent.md:3, not on its subject\'s page docs/operations.md',
    'option "gc.newKnob" is documented nowhere (its page: docs/operations.md)',
    'option "provider.mock.profiles.*.zone" is documented nowhere (its page: docs/profiles.md)',
    'docs/operations.md:4 documents option "gc.gone", which the schema does not have',
  ]);
  assert(matches("provider.mock.profiles.*.enis", "provider.mock.profiles.pci.enis"));
  assert(!matches("provider.mock.enis", "provider.mock.profiles.pci.enis"));
  // The enabling of commented-out options leaves prose alone.
  assertEquals(
    enableAll('  "a": 1\n  // "file": "/x",\n  // One of "a", "b".\n  //   "k": 1,\n  // },'),
    '  "a": 1,\n  "file": "/x",\n  // One of "a", "b".\n    "k": 1,\n  },',
  );
});
