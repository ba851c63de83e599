/**
 * `deno task build`: the one build step. It bundles enim (`main.ts` and every
 * module it can load) into `dist/bundle/`: `main.js` and its chunks, plain
 * JavaScript with the npm packages inside, so running it needs no config, no
 * lockfile and no package resolution.
 *
 * Code splitting keeps the roles apart: `main.js` only picks the role, the CNI
 * plugin's chunk holds `cni/forward.ts` and what it imports (no zod, no agent,
 * CLI or provider code), and the agent, the CLI and each provider load their
 * own chunks. Everything that stands for the shipped binary runs this bundle:
 * `deno task compile` compiles it, the launcher (`scripts/launcher.ts`) execs it,
 * and the demo, the bench and the subprocess tests run it through
 * {@linkcode bundleArgv}, with the permissions of the `enim` permission set.
 *
 * The bundle is built beside `dist/bundle` and swapped in whole, so a running
 * plugin or agent never sees half of one. `BUILD.json` records what was built.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { z } from "zod";
import { dirname, join, resolve, ROOT, SHIPPED_DIRS } from "./_paths.ts";
import { permissionFlags, type PermissionSetName, readPermissionSet } from "./_permissions.ts";

/** Where the bundle goes. */
export const BUNDLE_DIR: string = join(ROOT, "dist", "bundle");
/** The bundle's entry point, relative to its directory. */
export const ENTRY = "main.js";
/**
 * The plugin process's own entry (`cni/main.ts`), relative to the bundle's directory:
 * the launcher starts it for a CNI call, so `deno run` parses none of the CLI's chunks.
 */
export const PLUGIN_ENTRY = "cni/main.js";

/** The source trees the bundle is built from (for the staleness check). */
const SOURCES = ["main.ts", "deno.json", "deno.lock", ...SHIPPED_DIRS];

/** The stamp written beside the bundle. */
const StampSchema = z.object({ version: z.string(), deno: z.string(), builtAt: z.string() });

/** The newest modification time (ms) among the non-test sources under `root`. */
export function newestSource(root: string = ROOT): number {
  let newest = 0;
  const visit = (path: string) => {
    let st: Deno.FileInfo;
    try {
      st = Deno.statSync(path);
    } catch {
      return;
    }
    if (st.isDirectory) {
      for (const e of Deno.readDirSync(path)) visit(join(path, e.name));
    } else if (!/_test\.ts$|_bench\.ts$/.test(path)) {
      newest = Math.max(newest, st.mtime?.getTime() ?? 0);
    }
  };
  for (const s of SOURCES) visit(join(root, s));
  return newest;
}

/** Whether `dir` holds a bundle at least as new as every source. */
export function isFresh(dir: string = BUNDLE_DIR, root: string = ROOT): boolean {
  try {
    const stamp = Deno.statSync(join(dir, "BUILD.json"));
    Deno.statSync(join(dir, ENTRY));
    Deno.statSync(join(dir, PLUGIN_ENTRY));
    return (stamp.mtime?.getTime() ?? 0) >= newestSource(root);
  } catch {
    return false;
  }
}

/** The CLI's module, bundled on its own (the agent, the operator commands, the providers). */
const CLI_SOURCE = "./cli/mod.ts";
/** Where the CLI bundle's entry lands, relative to the bundle's directory. */
const CLI_ENTRY = "./cli/mod.js";

/** `deno bundle` arguments: code splitting for Deno, `entry` (one or more) into `outdir`. */
export function bundleArgs(
  entry: string | string[],
  outdir: string,
  root: string = ROOT,
  opts: { external?: string[]; minify?: boolean } = {},
): string[] {
  return [
    "bundle",
    "--quiet",
    "--code-splitting",
    ...(opts.minify ? ["--minify", "--sourcemap=linked"] : []),
    "--platform",
    "deno",
    "--config",
    join(root, "deno.json"),
    "--outdir",
    outdir,
    ...(opts.external ?? []).map((e) => `--external=${e}`),
    ...[entry].flat().map((e) => join(root, e)),
  ];
}

async function denoBundle(args: string[], root: string): Promise<void> {
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: root,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`deno bundle failed:\n${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

/**
 * Bundles into `staging` in three passes, so the plugin process shares no chunk
 * with the rest: the CLI (`cli/mod.ts`, whose CommonJS packages need esbuild's
 * `node:module` shim, which alone costs a plugin call ~13 ms) into `cli/`, then
 * `main.ts` with the CLI left external, whose only other chunk is the plugin
 * process (`cni/forward.ts` and what it imports, inlined). The one reference to
 * the CLI in `main.js` is then pointed at the CLI bundle. The third pass bundles
 * `cni/main.ts`, the plugin process's own entry (`PLUGIN_ENTRY`), alone: one
 * self-contained file that imports nothing, which the launcher runs for a CNI call.
 *
 * The CLI bundle and the plugin entry are minified (with linked source maps for
 * stack traces, read only when one is printed): `deno run` reads and parses every
 * module a literal dynamic import can reach before it starts, so the CLI's size
 * would be paid by every call through `main.js` (about 1 ms per MB), and the plugin
 * entry's by every CNI call (one file of 16 KB instead of an entry and a 30 KB chunk:
 * measured about 0.4 ms less before the module runs).
 */
async function bundleInto(staging: string, root: string): Promise<void> {
  await denoBundle(bundleArgs(CLI_SOURCE, join(staging, "cli"), root, { minify: true }), root);
  await denoBundle(bundleArgs("main.ts", staging, root, { external: [CLI_SOURCE] }), root);
  await denoBundle(
    bundleArgs("cni/main.ts", join(staging, dirname(PLUGIN_ENTRY)), root, { minify: true }),
    root,
  );
  Deno.statSync(join(staging, PLUGIN_ENTRY));
  const mainPath = join(staging, ENTRY);
  const main = await Deno.readTextFile(mainPath);
  const quoted = JSON.stringify(CLI_SOURCE);
  const count = main.split(quoted).length - 1;
  if (count !== 1) {
    throw new Error(`Expected one import of ${quoted} in the bundled ${ENTRY}, found ${count}`);
  }
  await Deno.writeTextFile(mainPath, main.replace(quoted, JSON.stringify(CLI_ENTRY)));
  Deno.statSync(join(staging, CLI_ENTRY));
}

/** Builds the bundle into `dir` (default `dist/bundle`), replacing what is there. */
export async function build(dir: string = BUNDLE_DIR, root: string = ROOT): Promise<string> {
  const staging = `${dir}.tmp-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  try {
    await bundleInto(staging, root);
    const { VERSION } = await import("../lib/version.ts");
    const stamp = StampSchema.parse({
      version: VERSION,
      deno: Deno.version.deno,
      builtAt: new Date().toISOString(),
    });
    await Deno.writeTextFile(join(staging, "BUILD.json"), JSON.stringify(stamp, null, 2) + "\n");
    await swapIn(staging, dir);
    return join(dir, ENTRY);
  } finally {
    await Deno.remove(staging, { recursive: true }).catch(() => {});
  }
}

/** Replaces `dir` with `staging` (the old one is renamed away first, then removed). */
async function swapIn(staging: string, dir: string): Promise<void> {
  await Deno.mkdir(resolve(dir, ".."), { recursive: true });
  const old = `${dir}.old-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  let moved = false;
  try {
    await Deno.rename(dir, old);
    moved = true;
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  await Deno.rename(staging, dir);
  if (moved) await Deno.remove(old, { recursive: true }).catch(() => {});
}

/** Builds the bundle unless it is fresh; returns its entry point. Synchronous (tests call it lazily). */
export function ensureBuiltSync(dir: string = BUNDLE_DIR, root: string = ROOT): string {
  if (!isFresh(dir, root)) {
    const out = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", join(root, "scripts", "build.ts"), "--outdir", dir],
      cwd: root,
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).outputSync();
    if (!out.success) {
      throw new Error(`deno task build failed:\n${new TextDecoder().decode(out.stderr).trim()}`);
    }
  }
  return join(dir, ENTRY);
}

/** The plugin process's entry beside the bundle entry `entry` (its `main.js`). */
export function pluginEntry(entry: string): string {
  return join(dirname(entry), PLUGIN_ENTRY);
}

/**
 * V8 flags every enim process runs with (the launcher, the tests, and baked into the
 * compiled binary). `--max-semi-space-size=1` caps V8's young generation at 1 MB per
 * semi-space (the default grows to 16 MB): the agent's live heap is small and steady,
 * so scavenges stay cheap, and its RSS no longer carries up to ~30 MB of young-
 * generation pages it rarely needs (measured: 107 → 83 MB after 300 ADD/DEL cycles).
 * The plugin process allocates less than that in its whole life.
 *
 * `--lite-mode` leaves out V8's optimizing compiler and allocates feedback lazily:
 * enim's JavaScript is a thin layer over `ip`, SQLite and sockets, so nothing in it
 * runs hot enough to pay for TurboFan's code and its pages of the binary. Measured
 * (A/B on one machine: the agent under 5 rounds of 16 parallel ADD/DEL, and 80
 * serial ones): peak RSS 5–9 MB lower, ADD/DEL latency and the plugin's start-up
 * unchanged within the noise.
 *
 * `--heap-growing-percent=30`: lite mode also has V8 optimize for size, which lets the
 * old generation grow only ~10% past what the last full collection kept before the next
 * one starts. With NetworkPolicy on, the agent's cluster caches keep ~45 MB live, and
 * the few MB each ADD and DEL promote started a full (incremental) mark of all of it
 * about once per ADD and DEL (each ~7–17 ms of pause and ~8–37 ms of marking steps). 30% makes
 * that collection rarer. Measured (`bench/policy_agent.ts`, 2026-11-27,
 * one run each): the agent's CPU per ADD and DEL 56–61 → 43–46 ms, CPU per cache event
 * 8.65 → 7.4 ms, its VmHWM 123 → 126 MB (goal ≤ 150); without policy (`deno task
 * bench`) the agent's VmHWM stays within its run-to-run spread (72.5 MB; 73.7–79.9
 * without the flag; goal ≤ 80).
 */
export const V8_FLAGS = ["--max-semi-space-size=1", "--lite-mode", "--heap-growing-percent=30"];

/** {@linkcode V8_FLAGS} as the `--v8-flags` argument. */
export function runtimeFlags(): string[] {
  return [`--v8-flags=${V8_FLAGS.join(",")}`];
}

/**
 * The permission set an entry of the bundle runs with: the plugin process's own entry
 * (`cni/main.js`) the narrow `enim-plugin` set, every other entry (`main.js`: the agent,
 * the operator commands) the `enim` set, which the compiled binary bakes in.
 */
export function permissionSetOf(entry: string): PermissionSetName {
  return entry.endsWith(`/${PLUGIN_ENTRY}`) ? "enim-plugin" : "enim";
}

/**
 * `deno run` flags of the plugin process's entry alone. `--no-code-cache`: deno's V8
 * code cache is a SQLite database in DENO_DIR (`v8_code_cache_v2`, shared by every
 * deno program of the user: megabytes, with its write-ahead log), which each process
 * opens, and whose lookup the module's load waits for; the plugin entry is one 16 KB
 * file that V8 compiles lazily (most of it never runs in a call), so opening the cache
 * costs more than it saves. Measured (in-process, `performance.now()` at the top of
 * the module, 20–25 runs each): about 0.8 ms earlier to the module's first line and
 * 1 ms less to its exit, the plugin's own work unchanged.
 */
export const PLUGIN_RUN_FLAGS = ["--no-code-cache"];

/**
 * The argv that runs the bundle as the compiled binary would run: `deno run`
 * with no config and no lockfile (the bundle needs neither) and exactly the
 * permission set of deno.json for that entry ({@linkcode permissionSetOf}), as flags: the
 * deno.json under `root` (a release built from history has its own; one without the
 * `enim-plugin` set runs every entry with `enim`, as its compiled binary did). The
 * plugin entry also gets {@linkcode PLUGIN_RUN_FLAGS}.
 */
export function bundleArgv(
  entry: string,
  deno: string = Deno.execPath(),
  root: string = ROOT,
): string[] {
  const set = permissionSetOf(entry);
  return [
    deno,
    "run",
    "--no-config",
    "--no-lock",
    "--quiet",
    "--no-prompt",
    ...(set === "enim-plugin" ? PLUGIN_RUN_FLAGS : []),
    ...runtimeFlags(),
    ...permissionFlags(readPermissionSet(root, set)),
    entry,
  ];
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: { outdir: { type: "string", default: BUNDLE_DIR } },
  });
  const t0 = performance.now();
  const entry = await build(resolve(values.outdir));
  console.error(`built ${entry} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}
