/**
 * The map stays whole (issue 32): every relative link of README.md, docs/*.md and
 * deploy/README.md points at a file of the repository that exists, and every `#anchor`
 * at a heading of its target (GitHub's heading ids: see {@linkcode githubSlug}) or at
 * an explicit `<a id>`/`<a name>`. Every page of docs/ is listed in docs/README.md and in
 * the README's table, so a new page cannot be left out of the map.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";
import { dirname, join, normalize } from "node:path";

/** The Markdown files whose links are checked, relative to the root. */
async function linkedFiles(): Promise<string[]> {
  const pages: string[] = [];
  for await (const e of Deno.readDir(`${ROOT}/docs`)) {
    if (e.isFile && e.name.endsWith(".md")) pages.push(`docs/${e.name}`);
  }
  return ["README.md", ...pages.sort(), "deploy/README.md"];
}

/** The lines of `text` outside fenced code blocks, with their 1-based numbers. */
function proseLines(text: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let fence: string | undefined;
  text.split("\n").forEach((l, i) => {
    const m = /^\s{0,3}(`{3,}|~{3,})/.exec(l);
    if (m && (fence === undefined || m[1].startsWith(fence))) {
      fence = fence === undefined ? m[1] : undefined;
      return;
    }
    if (fence === undefined) out.push({ line: i + 1, text: l });
  });
  return out;
}

/**
 * The id GitHub gives a heading: its text as rendered (code spans, emphasis and links
 * reduced to their text), lower-cased, every character that is not a letter, a mark, a
 * digit, a connector (`_`), a space or a hyphen removed, and each space a hyphen
 * (github-slugger, which GitHub's renderer follows).
 */
export function githubSlug(heading: string): string {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/<[^>]+>/g, "")
    .replace(/[`*]/g, "");
  return text.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "").replaceAll(" ", "-");
}

/** Every anchor a Markdown text defines: its headings' ids (a repeated one gets `-1`, `-2`, …) and explicit `<a id>`/`<a name>`. */
export function anchorsOf(text: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const { text: l } of proseLines(text)) {
    const h = /^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$/.exec(l);
    if (h) {
      const base = githubSlug(h[1]);
      const n = seen.get(base) ?? 0;
      seen.set(base, n + 1);
      anchors.add(n === 0 ? base : `${base}-${n}`);
    }
    for (const m of l.matchAll(/<a\s[^>]*\b(?:id|name)="([^"]+)"/g)) anchors.add(m[1]);
  }
  return anchors;
}

/** One link of a Markdown text: its target as written and its line. */
interface Link {
  target: string;
  line: number;
}

/** Every link of a Markdown text outside code: inline links and images, and reference definitions. */
export function linksOf(text: string): Link[] {
  const out: Link[] = [];
  for (const { line, text: raw } of proseLines(text)) {
    const l = raw.replace(/`[^`]*`/g, "``");
    for (const m of l.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      out.push({ target: m[1], line });
    }
    const def = /^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?/.exec(l);
    if (def) out.push({ target: def[1], line });
  }
  return out;
}

/**
 * What is dead among the relative links of `file` (its `text`): a target that does not
 * exist, one outside the repository, an anchor its target does not define. `read`
 * gives a path's text relative to the root (`""` for a file that is not Markdown, a
 * directory's README.md for a directory), or `undefined` when nothing is there.
 */
export function deadLinks(
  file: string,
  text: string,
  read: (path: string) => string | undefined,
): string[] {
  const problems: string[] = [];
  for (const { target, line } of linksOf(text)) {
    // A scheme (https:, mailto:) or a protocol-relative URL leaves the repository.
    if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith("//")) continue;
    const [pathPart, anchor] = target.split("#", 2) as [string, string | undefined];
    const path = pathPart === "" ? file : normalize(join(dirname(file), decodeURI(pathPart)));
    const where = `${file}:${line}: "${target}"`;
    if (path.startsWith("..") || path.startsWith("/")) {
      problems.push(`${where} points outside the repository`);
      continue;
    }
    const target_ = read(path);
    if (target_ === undefined) {
      problems.push(`${where}: no such file "${path}"`);
      continue;
    }
    if (anchor !== undefined && !anchorsOf(target_).has(decodeURIComponent(anchor))) {
      problems.push(`${where}: "${path}" has no heading with the anchor "#${anchor}"`);
    }
  }
  return problems;
}

/** Reads a path of the repository as {@linkcode deadLinks} wants it. */
function readRepo(path: string): string | undefined {
  try {
    const full = `${ROOT}/${path}`;
    const info = Deno.statSync(full);
    if (info.isDirectory) {
      try {
        return Deno.readTextFileSync(`${full}/README.md`);
      } catch {
        return "";
      }
    }
    return /\.md$/i.test(path) ? Deno.readTextFileSync(full) : "";
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return undefined;
    throw err;
  }
}

Deno.test("every relative link of the README, docs/ and deploy/README.md points at a file that exists, and every anchor at a heading of it", async () => {
  const files = await linkedFiles();
  const problems: string[] = [];
  let links = 0;
  for (const f of files) {
    const text = await Deno.readTextFile(`${ROOT}/${f}`);
    links += linksOf(text).length;
    problems.push(...deadLinks(f, text, readRepo));
  }
  assertEquals(problems, []);
  assert(links > 50, `only ${links} links found: the link reader is broken`);
});

Deno.test("every page of docs/ is listed in docs/README.md and in the README's table", async () => {
  const pages = (await linkedFiles()).filter((f) =>
    f.startsWith("docs/") && f !== "docs/README.md"
  );
  const targets = (file: string) =>
    new Set(
      linksOf(Deno.readTextFileSync(`${ROOT}/${file}`))
        .map((l) => normalize(join(dirname(file), l.target.split("#")[0]))),
    );
  const index = targets("docs/README.md");
  const readme = targets("README.md");
  assertEquals(pages.filter((p) => !index.has(p)), [], "pages missing from docs/README.md");
  assertEquals(pages.filter((p) => !readme.has(p)), [], "pages missing from README.md");
});

Deno.test("github slugs are computed as GitHub computes them", async (t) => {
  for (
    const [heading, slug] of [
      [
        "5. Runtimes: which CNI version and which verbs each gets",
        "5-runtimes-which-cni-version-and-which-verbs-each-gets",
      ],
      [
        "Quick start (fresh machine: only Node.js/npm, as root)",
        "quick-start-fresh-machine-only-nodejsnpm-as-root",
      ],
      [
        "Scheduling: the node's ENIs as the extended resource `enim.dev/eni`",
        "scheduling-the-nodes-enis-as-the-extended-resource-enimdeveni",
      ],
      ["Two nodes, zone-wide sticky pods (`--zone`)", "two-nodes-zone-wide-sticky-pods---zone"],
      ["Options: enim's section", "options-enims-section"],
      ["A **bold** [link](x.md) and snake_case", "a-bold-link-and-snake_case"],
      ["Faults — what is left", "faults--what-is-left"],
    ]
  ) {
    await t.step(heading, () => assertEquals(githubSlug(heading), slug));
  }
  assertEquals(
    [...anchorsOf(
      '# A\n\n## Options\n\n```\n# not a heading\n```\n\n## Options\n\n<a id="here"></a>\n',
    )],
    ["a", "options", "options-1", "here"],
  );
});

Deno.test("the link check itself: a dead file, a dead anchor and a link outside the repository are found; code and URLs are left alone", () => {
  const repo: Record<string, string> = {
    "docs/a.md": "# Page A\n\n## Options\n",
    "deploy/agent.jsonc": "",
  };
  const text = [
    "[ok](a.md#options) [ok](../deploy/agent.jsonc) [ok](#here) [web](https://example.com/x#y)",
    "[gone](b.md) [no anchor](a.md#option)",
    "[up](../../etc/passwd)",
    "`[in code](nowhere.md)`",
    "```",
    "[in a block](nowhere.md)",
    "```",
    "## Here",
    "[ref]: a.md#nothing",
  ].join("\n");
  assertEquals(deadLinks("docs/c.md", text, (p) => p === "docs/c.md" ? text : repo[p]), [
    'docs/c.md:2: "b.md": no such file "docs/b.md"',
    'docs/c.md:2: "a.md#option": "docs/a.md" has no heading with the anchor "#option"',
    'docs/c.md:3: "../../etc/passwd" points outside the repository',
    'docs/c.md:9: "a.md#nothing": "docs/a.md" has no heading with the anchor "#nothing"',
  ]);
});
