/**
 * `deno task compile [--output PATH]`: builds `dist/enim`, one executable: the artifact of
 * `deno task build` (`dist/bundle/main.js` and its chunks, roles chosen by the first argument)
 * compiled with the `enim` permission set from deno.json baked in, the same flags the launcher
 * and the tests run the bundle with (scripts/_permissions.ts).
 *
 * `deno compile` embeds the program into `denort`, a runtime-only Deno build of the same
 * version and target, which it normally downloads from dl.deno.land into its cache
 * (`$DENO_DIR/dl/release/v<version>/denort-<target>.zip`). Deno reads the `DENORT_BIN`
 * environment variable before that cache: the path of an unzipped `denort` executable used as
 * is. Where neither is available and the download host cannot be reached, this script fails
 * within seconds with a message that says how to supply it.
 *
 * After compiling it runs `<binary> version` to prove the binary is enim (a wrong DENORT_BIN
 * produces an executable that is not), and only then moves it to the output path.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { dirname, join, resolve, ROOT } from "./_paths.ts";
import { build, runtimeFlags } from "./build.ts";
import { permissionFlags } from "./_permissions.ts";

/**
 * The `deno compile` arguments that compile the bundle whose entry is `entry` into `output`.
 * Every module of the bundle is reached by literal imports (the roles, the CLI's commands,
 * the provider registry), so compile embeds them all without `--include`.
 */
export function compileArgs(output: string, entry: string, flags = permissionFlags()): string[] {
  return [
    "compile",
    "--no-config",
    "--no-lock",
    ...runtimeFlags(),
    ...flags,
    "--output",
    output,
    entry,
  ];
}

/** Where `deno compile` looks for the runtime it builds on. */
export interface DenortLocation {
  /** The file name Deno downloads: `denort-<target>.zip`. */
  zipName: string;
  /** The download URL for this Deno version and target. */
  url: string;
  /** Deno's cache path of that zip (used offline when present). */
  cachePath: string;
}

/** The denort download URL and cache path for this Deno's version and target. */
export function denortLocation(denoDir: string): DenortLocation {
  const zipName = `denort-${Deno.build.target}.zip`;
  const rel = `release/v${Deno.version.deno}/${zipName}`;
  return {
    zipName,
    url: `https://dl.deno.land/${rel}`,
    cachePath: join(denoDir, "dl", rel),
  };
}

/** The message printed when the denort runtime cannot be obtained. */
export function denortHelp(reason: string, loc: DenortLocation): string {
  const v = Deno.version.deno;
  const t = Deno.build.target;
  return [
    `Cannot obtain the denort runtime that deno compile builds on: ${reason}`,
    "",
    `deno compile embeds enim into denort (a runtime-only build of Deno ${v} for ${t}),`,
    `which it downloads from ${loc.url}.`,
    "Supply it yourself:",
    `  1. On a machine with internet access download that zip and unzip it (one file: denort).`,
    "  2. Copy denort to this machine and run:",
    "",
    "       DENORT_BIN=/path/to/denort deno task compile",
    "",
    `DENORT_BIN must name the unzipped denort executable of Deno ${v} for ${t}: not the zip,`,
    "not the deno CLI, not another version. Deno reads it instead of its download cache.",
    `Alternatively put the zip, unchanged, at ${loc.cachePath}`,
    "(deno's own cache; used offline).",
    "",
    "Nothing else needs the compiled binary: `deno task install --launcher` installs a launcher",
    "that runs enim from this repository with the same permissions.",
  ].join("\n");
}

function isFile(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

/** Deno's cache directory, as `deno info --json` reports it. */
async function denoDir(): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json"],
    stdout: "piped",
    stderr: "null",
    stdin: "null",
  }).output();
  const info: unknown = JSON.parse(new TextDecoder().decode(out.stdout));
  if (typeof info === "object" && info !== null && "denoDir" in info) {
    return String(info.denoDir);
  }
  throw new Error('Cannot read denoDir from "deno info --json"');
}

/**
 * Checks that deno compile will find its runtime; returns a problem, or undefined when fine.
 * Never waits longer than `probeMs` on the network.
 */
export async function checkDenort(
  env: { DENORT_BIN?: string },
  loc: DenortLocation,
  probeMs: number,
): Promise<string | undefined> {
  if (env.DENORT_BIN !== undefined) {
    const path = env.DENORT_BIN;
    let real: string;
    try {
      real = Deno.realPathSync(path);
      if (!Deno.statSync(real).isFile) return `DENORT_BIN "${path}" is not a file`;
    } catch {
      return `DENORT_BIN "${path}" does not exist`;
    }
    if (real === Deno.realPathSync(Deno.execPath())) {
      return `DENORT_BIN "${path}" is the deno CLI itself, not denort ` +
        "(the result would start a REPL instead of enim)";
    }
    if (real.endsWith(".zip")) return `DENORT_BIN "${path}" is the zip: unzip it first`;
    return undefined;
  }
  if (isFile(loc.cachePath)) return undefined;
  try {
    const res = await fetch(loc.url, { method: "HEAD", signal: AbortSignal.timeout(probeMs) });
    await res.body?.cancel();
    if (!res.ok) return `${loc.url} answered HTTP ${res.status}`;
    return undefined;
  } catch (err) {
    const cause = err instanceof Error && err.cause instanceof Error
      ? `: ${err.cause.message}`
      : "";
    const why = (err instanceof Error ? err.message : String(err)) + cause;
    return `DENORT_BIN is not set, ${loc.zipName} is not in deno's cache, ` +
      `and ${loc.url} cannot be reached (${why})`;
  }
}

/** Runs a command with a time limit; returns its exit code and output (code 124 on timeout). */
async function run(
  cmd: string,
  args: string[],
  timeoutMs: number,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = new Deno.Command(cmd, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    cwd: ROOT,
    env: { NO_COLOR: "1" },
  }).spawn();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    try {
      child.kill("SIGKILL");
    } catch { /* already gone */ }
  }, timeoutMs);
  try {
    const out = await child.output();
    const dec = new TextDecoder();
    return {
      code: timedOut ? 124 : out.code,
      stdout: dec.decode(out.stdout),
      stderr: dec.decode(out.stderr),
    };
  } finally {
    clearTimeout(timer);
  }
}

/** The task: returns the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: { output: { type: "string", default: join(ROOT, "dist", "enim") } },
  });
  const output = resolve(values.output);
  const env = { DENORT_BIN: Deno.env.get("DENORT_BIN") };
  const probeMs = Number(Deno.env.get("ENIM_DENORT_PROBE_MS") ?? 5000);
  const loc = denortLocation(await denoDir());

  const problem = await checkDenort(env, loc, probeMs);
  if (problem !== undefined) {
    console.error(denortHelp(problem, loc));
    return 1;
  }

  await Deno.mkdir(dirname(output), { recursive: true });
  // Build beside the target and rename only after the smoke test: a broken binary never
  // replaces a good one (and `deno task install` never picks one up).
  const staging = `${output}.tmp-${Deno.pid}`;
  try {
    return await compile(staging, output, loc);
  } finally {
    await Deno.remove(staging).catch(() => {});
  }
}

async function compile(staging: string, output: string, loc: DenortLocation): Promise<number> {
  const entry = await build();
  console.error(`built ${entry}`);
  const args = compileArgs(staging, entry);
  console.error(`deno ${args.join(" ")}`);
  const compileMs = Number(Deno.env.get("ENIM_COMPILE_TIMEOUT_MS") ?? 600_000);
  const res = await run(Deno.execPath(), args, compileMs);
  if (res.code !== 0) {
    console.error(res.stderr.trimEnd());
    if (res.code === 124) console.error(`deno compile did not finish within ${compileMs} ms`);
    if (/denort|dl\.deno\.land|base binary/i.test(res.stderr)) {
      console.error("\n" + denortHelp("deno compile could not set up denort (above)", loc));
    }
    return 1;
  }

  const smoke = await run(staging, ["version"], 30_000);
  if (smoke.code !== 0 || !/^enim \d/.test(smoke.stdout)) {
    console.error(
      `The compiled binary does not run as enim ("<binary> version" exited ${smoke.code}: ` +
        `${JSON.stringify((smoke.stdout + smoke.stderr).slice(0, 200))}); ` +
        "is DENORT_BIN the denort of this Deno version?",
    );
    return 1;
  }
  await Deno.rename(staging, output);
  const size = Deno.statSync(output).size;
  console.log(`${output} (${(size / 1048576).toFixed(1)} MiB): ${smoke.stdout.trim()}`);
  return 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
