/**
 * Shared pieces of the real-client tests (podman, libcni, containerd): installing the
 * client through apt (timed), a CNI plugin directory holding the enim launcher beside
 * Debian's reference plugins, recording the calls a runtime makes, running a program
 * inside a simulated node, and removing only what a test created.
 *
 * @module
 */
import { existsSync as exists } from "../../lib/fs.ts";
export { exists };
import { z } from "zod";
import { type AptNeed, ensureApt, isRoot } from "../../scripts/_deps.ts";
import { writeLauncher } from "../../scripts/launcher.ts";
import type { SimulatedNode } from "./node.ts";
import { type CommandOutput, runCommand } from "./command.ts";

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
      [...new Set(needs.map((n) => n.pkg))].join(", ")
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
export type RunOutput = CommandOutput;

/** Runs `argv` inside the node's sandbox (its /run/enim and its network namespace). */
export async function runInNode(
  node: SimulatedNode,
  argv: string[],
  env: Record<string, string> = {},
  stdin?: string,
): Promise<RunOutput> {
  return await runCommand(
    node.sandbox.wrap(argv),
    { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", ...env },
    stdin,
  );
}

/** A fresh temp directory under /tmp named `<prefix>-<random>`. */
export async function tempDir(prefix: string): Promise<string> {
  const dir = `/tmp/${prefix}-${crypto.randomUUID().slice(0, 8)}`;
  await Deno.mkdir(dir, { mode: 0o700 });
  return dir;
}

/** Removes the empty directories `paths` (deepest first); a non-empty or missing one is left. */
export async function removeEmptyDirs(paths: string[]): Promise<void> {
  for (const p of paths) await Deno.remove(p).catch(() => {});
}

/** The entries of /run/netns (where runtimes and `ip netns` pin network namespaces). */
export function netnsEntries(): string[] {
  try {
    return [...Deno.readDirSync("/run/netns")].map((e) => e.name);
  } catch {
    return [];
  }
}

/**
 * Puts a recorder in front of the plugin `name` of the plugin directory `dir`: each call's
 * environment and stdin go to `recordDir` (`<time>-<pid>.env`, `.stdin`) before the plugin
 * itself runs with the same arguments, stdin and environment. Costs a shell and a `tee` per
 * call; leave it out where calls are timed.
 */
export async function recordCalls(dir: string, name: string, recordDir: string): Promise<void> {
  await Deno.mkdir(recordDir, { recursive: true });
  const real = `${dir}/.${name}.recorded`;
  await Deno.rename(`${dir}/${name}`, real);
  await Deno.writeTextFile(
    `${dir}/${name}`,
    [
      "#!/bin/sh",
      "# Records this CNI call (environment and stdin) for the test, then runs the plugin.",
      `f=${recordDir}/$(date +%s%N)-$$`,
      'env > "$f.env"',
      `tee "$f.stdin" | ${real} "$@"`,
      "",
    ].join("\n"),
    { mode: 0o755 },
  );
}

/** One recorded CNI call. */
export interface RecordedCall {
  env: Record<string, string>;
  /** The network config the runtime sent (parsed; fields beyond these are kept). */
  config: z.infer<typeof RecordedConfigSchema>;
}

/** The parts of a recorded network config the tests look at. */
export const RecordedConfigSchema = z.looseObject({
  cniVersion: z.string(),
  name: z.string(),
  type: z.string(),
  runtimeConfig: z.record(z.string(), z.unknown()).optional(),
  prevResult: z.unknown().optional(),
});

/** The calls {@linkcode recordCalls} saw, oldest first. */
export async function readCalls(recordDir: string): Promise<RecordedCall[]> {
  const names = [...Deno.readDirSync(recordDir)].map((e) => e.name)
    .filter((n) => n.endsWith(".env")).map((n) => n.slice(0, -4))
    .sort((a, b) => {
      const [ta, tb] = [a, b].map((n) => BigInt(n.split("-")[0]));
      return ta < tb ? -1 : ta > tb ? 1 : 0;
    });
  const calls: RecordedCall[] = [];
  for (const n of names) {
    const env: Record<string, string> = {};
    for (const line of (await Deno.readTextFile(`${recordDir}/${n}.env`)).split("\n")) {
      const i = line.indexOf("=");
      if (i > 0) env[line.slice(0, i)] = line.slice(i + 1);
    }
    const config = RecordedConfigSchema.parse(
      JSON.parse(await Deno.readTextFile(`${recordDir}/${n}.stdin`)),
    );
    calls.push({ env, config });
  }
  return calls;
}
