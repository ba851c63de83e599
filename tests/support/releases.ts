/**
 * An earlier release of enim, built from history: the commit `releases.json` records for
 * it is checked out into a temporary worktree (`scripts/_worktree.ts`, as `bench/compare.ts`
 * does), its own `scripts/build.ts` bundles it, and the bundle and that release's deno.json
 * (its permission set) are kept in a per-machine cache, `~/.cache/enim/releases/<version>-<commit>`
 * (`ENIM_RELEASE_CACHE` moves it), so later runs find it there. The release runs exactly as
 * its own shipped artifact ran: `deno run` on its bundle with its own permission set.
 *
 * @module
 */
import { join } from "node:path";
import { releaseOf } from "../../scripts/_releases.ts";
import { addWorktree } from "../../scripts/_worktree.ts";
import { permissionFlags, readPermissionSet } from "../../scripts/_permissions.ts";
import { runtimeFlags } from "../../scripts/build.ts";
import { VERSION } from "../../lib/version.ts";
import { ROOT } from "../../scripts/_paths.ts";

/** How to run one version of enim. */
export interface EnimBuild {
  /** The version it reports. */
  version: string;
  /** The argv prefix that runs it (the CLI, or the plugin with CNI_COMMAND set). */
  argv: string[];
  /** A release's folder in the cache: its `bundle/` and its deno.json (none for this tree's). */
  dir?: string;
}

function cacheRoot(): string {
  const override = Deno.env.get("ENIM_RELEASE_CACHE");
  if (override) return override;
  return join(Deno.env.get("HOME") ?? "/root", ".cache", "enim", "releases");
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

const building = new Map<string, Promise<EnimBuild>>();

/** The released `version` (e.g. "0.1.0"), built from its commit on first use. */
export function releaseBuild(version: string): Promise<EnimBuild> {
  let p = building.get(version);
  if (!p) {
    p = buildRelease(version);
    building.set(version, p);
    p.catch(() => building.delete(version));
  }
  return p;
}

async function buildRelease(version: string): Promise<EnimBuild> {
  const r = releaseOf(version);
  const dir = join(cacheRoot(), `${r.version}-${r.commit.slice(0, 12)}`);
  const entry = join(dir, "bundle", "main.js");
  if (!exists(join(dir, "deno.json")) || !exists(entry)) {
    await Deno.mkdir(cacheRoot(), { recursive: true });
    // Built beside and renamed in whole: two tests building at once both end with one.
    const staging = `${dir}.tmp-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
    await using tree = await addWorktree(r.commit, { prefix: `enim-release-${r.version}-` });
    try {
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", "scripts/build.ts", "--outdir", join(staging, "bundle")],
        cwd: tree.path,
        env: { NO_COLOR: "1" },
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      if (!out.success) {
        throw new Error(
          `Building enim ${r.version} (${r.commit}) failed:\n${
            new TextDecoder().decode(out.stderr).trim()
          }`,
        );
      }
      await Deno.copyFile(join(tree.path, "deno.json"), join(staging, "deno.json"));
      await Deno.rename(staging, dir).catch((err) => {
        if (!exists(join(dir, "deno.json"))) throw err;
      });
    } finally {
      await Deno.remove(staging, { recursive: true }).catch(() => {});
    }
  }
  return {
    version: r.version,
    dir,
    argv: [
      Deno.execPath(),
      "run",
      "--no-config",
      "--no-lock",
      "--quiet",
      "--no-prompt",
      ...runtimeFlags(),
      ...permissionFlags(readPermissionSet(dir)),
      entry,
    ],
  };
}

/** This tree's build (`dist/bundle`), as an {@linkcode EnimBuild}. */
export async function currentBuild(): Promise<EnimBuild> {
  const { enimArgv } = await import("./enim.ts");
  return { version: VERSION, argv: enimArgv() };
}

/**
 * The sources of the released `version` (`git archive` of its commit), extracted once into
 * the same cache: for checks that run its own modules (its state store opening a database).
 * Returns the tree's directory.
 */
export async function releaseSource(version: string): Promise<string> {
  const r = releaseOf(version);
  const dir = join(cacheRoot(), `${r.version}-${r.commit.slice(0, 12)}`, "src");
  if (exists(join(dir, "deno.json"))) return dir;
  await Deno.mkdir(join(dir, ".."), { recursive: true });
  const staging = `${dir}.tmp-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  await Deno.mkdir(staging, { recursive: true });
  try {
    const out = await new Deno.Command("/bin/sh", {
      args: [
        "-c",
        `/usr/bin/git archive --format=tar "$1" | /usr/bin/tar -x -C "$2"`,
        "sh",
        r.commit,
        staging,
      ],
      cwd: ROOT,
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!out.success) {
      throw new Error(
        `git archive of ${r.version} failed: ${new TextDecoder().decode(out.stderr).trim()}`,
      );
    }
    await Deno.rename(staging, dir).catch((err) => {
      if (!exists(join(dir, "deno.json"))) throw err;
    });
  } finally {
    await Deno.remove(staging, { recursive: true }).catch(() => {});
  }
  return dir;
}
