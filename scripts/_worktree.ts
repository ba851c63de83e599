/**
 * A commit of this repository checked out beside it in a temporary git worktree (detached),
 * removed afterwards: how `bench/compare.ts` runs an older tree's benches and how the tests
 * build an earlier release from history (`tests/support/releases.ts`).
 *
 * @module
 */
import { ROOT } from "./_paths.ts";

/** Runs `git args` in `cwd`; its stdout, or an error naming the command and its stderr. */
export async function git(args: string[], cwd: string = ROOT): Promise<string> {
  const out = await new Deno.Command("/usr/bin/git", {
    args,
    cwd,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(
      `git ${args.join(" ")} in "${cwd}" exited ${out.code}: ${
        new TextDecoder().decode(out.stderr).trim()
      }`,
    );
  }
  return new TextDecoder().decode(out.stdout);
}

/** A checked-out commit; `remove()` takes the worktree away (idempotent). */
export interface Worktree extends AsyncDisposable {
  /** The worktree's directory. */
  readonly path: string;
  /** The full commit checked out. */
  readonly commit: string;
  remove(): Promise<void>;
}

/** Checks `rev` out, detached, into a new temporary directory (`prefix` names it). */
export async function addWorktree(
  rev: string,
  opts: { prefix?: string; root?: string } = {},
): Promise<Worktree> {
  const root = opts.root ?? ROOT;
  const commit = (await git(["rev-parse", "--verify", `${rev}^{commit}`], root)).trim();
  const path = await Deno.makeTempDir({ prefix: opts.prefix ?? "enim-worktree-" });
  try {
    await git(["worktree", "add", "--detach", path, commit], root);
  } catch (err) {
    await Deno.remove(path, { recursive: true }).catch(() => {});
    throw err;
  }
  let removed = false;
  const remove = async () => {
    if (removed) return;
    removed = true;
    await git(["worktree", "remove", "--force", path], root).catch(async () => {
      await Deno.remove(path, { recursive: true }).catch(() => {});
      await git(["worktree", "prune"], root).catch(() => {});
    });
  };
  return { path, commit, remove, [Symbol.asyncDispose]: remove };
}
