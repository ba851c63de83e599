/**
 * Shared pieces of the real-client tests (podman, libcni): installing the client
 * through apt (timed), a CNI plugin directory holding the enim launcher beside
 * Debian's reference plugins, running a program inside a simulated node, and
 * removing only what a test created.
 *
 * @module
 */
import { type AptNeed, ensureApt, isRoot } from "../scripts/_deps.ts";
import { writeLauncher } from "../scripts/launcher.ts";
import type { SimulatedNode } from "./_node.ts";

/** Where Debian's containernetworking-plugins puts the reference plugins. */
export const DEBIAN_CNI_DIR = "/usr/lib/cni";

/** The outcome of {@linkcode clientDeps}: why the tests skip, or null when they can run. */
export interface ClientDeps {
  skip: string | null;
  /** Seconds the apt install took (0 when nothing was missing). */
  aptSeconds: number;
}

/**
 * Installs what a real-client test needs (root only), printing how long apt took.
 * Returns a skip reason when not root or when something is still missing.
 */
export async function clientDeps(label: string, needs: AptNeed[]): Promise<ClientDeps> {
  if (!isRoot()) {
    const skip = `${label}: skipped, needs root (installs ${
      needs.map((n) => n.pkg).join(", ")
    } through apt and creates network namespaces)`;
    console.error(skip);
    return { skip, aptSeconds: 0 };
  }
  const t0 = performance.now();
  const unmet = await ensureApt(needs, (m) => console.error(`${label}: ${m}`));
  const aptSeconds = (performance.now() - t0) / 1000;
  console.error(`${label}: apt install of its packages took ${aptSeconds.toFixed(1)} s`);
  if (unmet.length > 0) {
    const skip = `${label}: skipped, cannot install through apt: ${unmet.join(", ")}`;
    console.error(skip);
    return { skip, aptSeconds };
  }
  return { skip: null, aptSeconds };
}

/**
 * Fills `dir` as a client's CNI plugin directory: `enim` is the launcher (the entry point with
 * exactly the compiled binary's permission flags), the named reference plugins are symlinks
 * to Debian's.
 */
export async function pluginDir(dir: string, reference: string[]): Promise<void> {
  await Deno.mkdir(dir, { recursive: true });
  await writeLauncher(`${dir}/enim`);
  for (const name of reference) {
    await Deno.symlink(`${DEBIAN_CNI_DIR}/${name}`, `${dir}/${name}`);
  }
}

/** The output of one program run. */
export interface RunOutput {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `argv` inside the node's sandbox (its /run/enim and its network namespace). */
export async function runInNode(
  node: SimulatedNode,
  argv: string[],
  env: Record<string, string> = {},
  stdin?: string,
): Promise<RunOutput> {
  const [cmd, ...args] = node.sandbox.wrap(argv);
  const child = new Deno.Command(cmd, {
    args,
    clearEnv: true,
    env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", ...env },
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (stdin !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(stdin));
    await w.close();
  }
  const out = await child.output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** A fresh temp directory under /tmp named `<prefix>-<random>`. */
export async function tempDir(prefix: string): Promise<string> {
  const dir = `/tmp/${prefix}-${crypto.randomUUID().slice(0, 8)}`;
  await Deno.mkdir(dir, { mode: 0o700 });
  return dir;
}

/** Whether a path exists (without following a final symlink). */
export function exists(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Removes the empty directories `paths` (deepest first); a non-empty or missing one is left. */
export async function removeEmptyDirs(paths: string[]): Promise<void> {
  for (const p of paths) await Deno.remove(p).catch(() => {});
}
