/**
 * Finds the programs enim's code runs by absolute path, for the check that every one of
 * them comes from a Debian package of scripts/_deps.ts (tests/tools_test.ts, issue 41).
 *
 * A tool path is any `/usr/bin/…`, `/usr/sbin/…`, `/bin/…`, `/sbin/…` or `/usr/lib/cni/…`
 * in a source file, wherever it stands: a `Deno.Command` or `lazyTool` argument, an argv
 * array, a constant, a shell script in a template string, a shebang, a comment. Counting
 * every mention (not only the calls a pattern of today's code recognises) is what makes
 * the check hold for code written tomorrow: a mention that runs nothing on this machine
 * (a program inside a container image) is an exemption with its reason, in the test.
 * A path only counts where it starts: `${dir}/bin/x`, `/usr/local/bin/x` or
 * `/opt/cni/bin/x` are not Debian's folders.
 *
 * A program given to `Deno.Command` by a bare name (found on PATH) is reported apart: the
 * check wants the path, which names the package.
 *
 * @module
 */
import type { AptPackage, AptUser } from "../../scripts/_deps.ts";
import { SHIPPED_DIRS } from "../../scripts/_paths.ts";

/** One tool path in one file, with the line it is on (1-based). */
export interface ToolMention {
  file: string;
  line: number;
  path: string;
}

/** The tool folders, as the start of a path (not after a word, `}`, `.`, `-` or `/`). */
const TOOL_PATH = /(?<![\w.$}/-])(?:(?:\/usr)?\/s?bin|\/usr\/lib\/cni)\/[\w.+-]*[\w+-]/g;

/** A `Deno.Command` whose program is a string literal (the literal is group 2). */
const COMMAND_LITERAL = /\bDeno\.Command\(\s*(["'`])([^"'`$]*)\1/g;

function lineOf(text: string, index: number): number {
  let line = 1;
  for (let i = text.indexOf("\n"); i !== -1 && i < index; i = text.indexOf("\n", i + 1)) line++;
  return line;
}

/** Every tool path in `text` (the source of `file`), in order. */
export function toolPaths(file: string, text: string): ToolMention[] {
  return [...text.matchAll(TOOL_PATH)].map((m) => ({
    file,
    line: lineOf(text, m.index),
    path: m[0],
  }));
}

/** Every program `text` hands `Deno.Command` by a literal that is not an absolute path. */
export function bareCommands(file: string, text: string): ToolMention[] {
  return [...text.matchAll(COMMAND_LITERAL)]
    .filter((m) => !m[2].startsWith("/"))
    .map((m) => ({ file, line: lineOf(text, m.index), path: m[2] }));
}

/** A mention that runs nothing of this machine's, and why. */
export interface Exemption {
  file: string;
  path: string;
  why: string;
}

/** What {@linkcode checkToolPaths} found. */
export interface ToolCheck {
  /** Each tool path no declared package provides to the users of its file, as `file:line path: why`. */
  offenders: string[];
  /** Each program handed to `Deno.Command` by a bare name, as `file:line name`. */
  bare: string[];
  /** Exemptions that match nothing (the code moved on; drop them). */
  stale: Exemption[];
  /** Every declared package a source names: one of its files, or its name in quotes. */
  named: Set<string>;
}

/** Who runs the code of a file: the bench (`bench/`) or the tests (everything else). */
export function usersOf(file: string): readonly AptUser[] {
  return file.startsWith("bench/") ? ["bench", "bench-cri"] : ["test"];
}

/** The folders scanned: the tests, the scripts, the bench, deploy's tests and the shipped ones. */
export const SCANNED_DIRS = ["tests", "scripts", "bench", "deploy", ...SHIPPED_DIRS];

/** Files not scanned: the list itself, and the check's own test with its planted samples. */
export const UNSCANNED = ["scripts/_deps.ts", "tests/tools_test.ts"];
const DEPS_FILE = UNSCANNED[0];

/**
 * Checks every tool path of the sources of `root` against `packages`: each must be a file of
 * a package that the users of its file install (see {@linkcode usersOf}), unless exempted.
 */
export async function checkToolPaths(
  root: string,
  packages: Readonly<Record<string, AptPackage>>,
  exemptions: readonly Exemption[] = [],
): Promise<ToolCheck> {
  const skipped = new Set(UNSCANNED);
  const offenders: string[] = [];
  const bare: string[] = [];
  const used = new Set<Exemption>();
  const named = new Set<string>();
  const owners = (path: string) =>
    Object.entries(packages).filter(([, p]) => p.files.includes(path));
  for (const file of await sourceFiles(root, SCANNED_DIRS, ["main.ts"])) {
    if (file === DEPS_FILE) continue;
    const text = await Deno.readTextFile(`${root}/${file}`);
    for (const [pkg, p] of Object.entries(packages)) {
      if (p.files.some((f) => text.includes(f)) || text.includes(`"${pkg}"`)) named.add(pkg);
    }
    if (skipped.has(file)) continue;
    for (const m of toolPaths(file, text)) {
      const exempt = exemptions.find((e) => e.file === file && e.path === m.path);
      if (exempt) {
        used.add(exempt);
        continue;
      }
      const found = owners(m.path);
      const users = usersOf(file);
      if (found.length === 0) {
        offenders.push(`${file}:${m.line} ${m.path}: no declared package has it`);
      } else if (!found.some(([, p]) => users.some((u) => p.users.includes(u)))) {
        offenders.push(
          `${file}:${m.line} ${m.path}: its package ${
            found.map(([n]) => `"${n}"`).join(", ")
          } is not installed for ${users.map((u) => `"${u}"`).join(" or ")}`,
        );
      }
    }
    for (const m of bareCommands(file, text)) bare.push(`${file}:${m.line} ${m.path}`);
  }
  return { offenders, bare, stale: exemptions.filter((e) => !used.has(e)), named };
}

/** The extensions of the source files that are scanned. */
export const SOURCE_EXTENSIONS = [".ts", ".js", ".mjs", ".go", ".sh"];

/**
 * The source files under `dirs` of `root` (relative paths, sorted), and `files` of them
 * that exist; a folder not made yet is skipped.
 */
export async function sourceFiles(
  root: string,
  dirs: readonly string[],
  files: readonly string[] = [],
): Promise<string[]> {
  const out: string[] = [];
  async function walk(rel: string): Promise<void> {
    let entries: Deno.DirEntry[];
    try {
      entries = await Array.fromAsync(Deno.readDir(`${root}/${rel}`));
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) return;
      throw err;
    }
    for (const e of entries) {
      const p = `${rel}/${e.name}`;
      if (e.isDirectory) await walk(p);
      else if (e.isFile && SOURCE_EXTENSIONS.some((x) => e.name.endsWith(x))) out.push(p);
    }
  }
  for (const d of dirs) await walk(d);
  for (const f of files) {
    try {
      if ((await Deno.stat(`${root}/${f}`)).isFile) out.push(f);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    }
  }
  return out.sort();
}
