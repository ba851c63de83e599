/**
 * `deno task install [--prefix DIR] [--launcher]`: installs enim on this node.
 *
 * | what | where (under the prefix) | when it exists |
 * | --- | --- | --- |
 * | `dist/enim` (or the launcher) | `/opt/cni/bin/enim`, 0755 | replaced (atomically) if different |
 * | `deploy/10-enim.conflist` | `/etc/cni/net.d/10-enim.conflist`, 0644 | kept (enim's previous default: updated) |
 * | `deploy/agent.jsonc` | `/etc/enim/agent.jsonc`, 0600 | kept |
 * | `deploy/enim-agent.service` | `/etc/systemd/system/enim-agent.service`, 0644 | replaced if different |
 * | state, logs | `/var/lib/enim` 0700, `/var/log/enim` 0750 | mode fixed |
 *
 * Without `dist/enim` (see `deno task compile`), or with `--launcher`, the launcher is installed
 * instead (scripts/launcher.ts) together with a systemd drop-in that lets the hardened unit
 * reach deno and its cache. Without `--prefix` it installs into `/` and requires root. Running it
 * again changes nothing that is already in place; every line it prints says what it did.
 *
 * The conflist is the administrator's once written, with one exception: a conflist that is
 * byte for byte one enim shipped before ({@linkcode PREVIOUS_CONFLISTS}) is replaced, because
 * the first one (`"cniVersion": "1.1.0"` alone) fails every pod on containerd 1.6 and 1.7. A
 * kept conflist that asks for 1.1.0 without `cniVersions` gets a warning saying so.
 *
 * @module
 */
import { existsSync as exists } from "../lib/fs.ts";
import { parseArgs } from "node:util";
import { z } from "zod";
import { dirname, join, resolve, ROOT } from "./_paths.ts";
import { currentDenoDir, launcherScript } from "./launcher.ts";

/** Options for {@linkcode install}. */
export interface InstallOptions {
  /** The root to install under (`/` for the real system). */
  prefix: string;
  /** Install the launcher even when `dist/enim` exists. */
  launcher?: boolean;
  /** The repository to install from (default: this one). */
  root?: string;
  /** Where progress lines go. */
  log?: (line: string) => void;
}

/** What happened to one path. */
export type Outcome = "installed" | "updated" | "unchanged" | "kept" | "created" | "removed";

/** One line of the install report. */
export interface Step {
  outcome: Outcome;
  /** The path on the target system (without the prefix). */
  path: string;
  note?: string;
}

/** The systemd drop-in used with the launcher, relative to the target root. */
export const LAUNCHER_DROPIN = "/etc/systemd/system/enim-agent.service.d/10-launcher.conf";

/** The drop-in's text: the launcher runs deno from wherever it lives, with its cache. */
export function launcherDropin(denoDir: string, root: string = ROOT): string {
  return [
    "# Written by `deno task install` with the launcher (no compiled binary): enim runs from",
    `# ${root} through deno, whose files and cache the unit would otherwise hide (ProtectHome)`,
    "# or make read-only (ProtectSystem=strict). Removed when the compiled binary is installed.",
    "[Service]",
    "ProtectHome=read-only",
    `ReadWritePaths=-${denoDir}`,
    `Environment=DENO_DIR=${denoDir}`,
    "",
  ].join("\n");
}

/** The version lines of every conflist shipped since the second. */
const BOTH_VERSIONS = ['  "cniVersion": "1.0.0",', '  "cniVersions": ["1.0.0", "1.1.0"],'];

/** A conflist as enim shipped them: its version lines, then the enim plugin with its capabilities. */
function shippedConflist(versions: string[], capabilities?: string): string {
  return [
    "{",
    ...versions,
    '  "name": "enim",',
    '  "plugins": [',
    "    {",
    '      "type": "enim",',
    '      "agentSocket": "/run/enim/enim.sock",',
    `      "logFile": "/var/log/enim/cni.log"${capabilities ? "," : ""}`,
    ...(capabilities ? [`      "capabilities": ${capabilities}`] : []),
    "    }",
    "  ]",
    "}",
    "",
  ].join("\n");
}

/**
 * The conflists enim shipped before, exactly as installed: replaced by the current one when
 * found unchanged. The first asked for CNI 1.1.0 only, which libcni < 1.2 (containerd 1.6 and
 * 1.7, CRI-O up to 1.30, podman 4) loads and then fails every pod with: `unsupported CNI
 * result version "1.1.0"`. The second did not declare the `bandwidth` capability (the pods'
 * bandwidth annotations still reached enim with the pod annotations). The third had no
 * `serviceCidrs`: its pods' host links (issue 27) route no Service.
 */
export const PREVIOUS_CONFLISTS: readonly string[] = [
  shippedConflist(['  "cniVersion": "1.1.0",']),
  shippedConflist(BOTH_VERSIONS, '{ "io.kubernetes.cri.pod-annotations": true }'),
  shippedConflist(
    BOTH_VERSIONS,
    '{ "io.kubernetes.cri.pod-annotations": true, "bandwidth": true }',
  ),
];

/** The version fields of a conflist (the rest is the runtime's and the plugins' business). */
const ConflistVersionsSchema = z.looseObject({
  cniVersion: z.string().optional(),
  cniVersions: z.array(z.string()).optional(),
});

/**
 * Why a conflist the installer keeps will fail on runtimes built on libcni < 1.2 (containerd
 * 1.6/1.7, CRI-O <= 1.30, podman 4), or undefined when it will not (or cannot be told).
 */
export function conflistProblem(text: string): string | undefined {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return undefined; // not JSON: the runtime will say so; nothing version-specific to add
  }
  const parsed = ConflistVersionsSchema.safeParse(json);
  if (!parsed.success) return undefined;
  const { cniVersion, cniVersions } = parsed.data;
  const [major, minor] = (cniVersion ?? "").split(".").map(Number);
  if (cniVersions !== undefined || !(major > 1 || (major === 1 && minor >= 1))) return undefined;
  return `its "cniVersion" ${JSON.stringify(cniVersion)} fails every pod on containerd 1.6/1.7 ` +
    `(libcni < 1.2); use "cniVersion": "1.0.0", "cniVersions": ["1.0.0", "1.1.0"] as ` +
    `deploy/10-enim.conflist does`;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** Creates `dir` (and parents) if missing; `mode` is enforced on `dir` itself. */
async function ensureDir(dir: string, mode?: number): Promise<boolean> {
  const created = !exists(dir);
  await Deno.mkdir(dir, { recursive: true });
  if (mode !== undefined && (Deno.statSync(dir).mode! & 0o7777) !== mode) {
    await Deno.chmod(dir, mode);
  }
  return created;
}

/** Writes `data` to `dest` with `mode` via a temporary file and a rename (never half-written). */
async function writeAtomic(dest: string, data: Uint8Array, mode: number): Promise<void> {
  await ensureDir(dirname(dest));
  const tmp = join(dirname(dest), `.${crypto.randomUUID()}.tmp`);
  try {
    await Deno.writeFile(tmp, data, { mode });
    await Deno.chmod(tmp, mode); // the umask may have narrowed it
    await Deno.rename(tmp, dest);
  } catch (err) {
    await Deno.remove(tmp).catch(() => {});
    throw err;
  }
}

/** Installs `data` at `dest`: replaced when different, kept when `keep` and present. */
async function put(
  dest: string,
  data: Uint8Array,
  mode: number,
  keep: boolean,
): Promise<Outcome> {
  if (exists(dest)) {
    if (keep) return "kept";
    const same = sameBytes(await Deno.readFile(dest), data);
    if (same && (Deno.statSync(dest).mode! & 0o7777) === mode) return "unchanged";
    await writeAtomic(dest, data, mode);
    return "updated";
  }
  await writeAtomic(dest, data, mode);
  return "installed";
}

/** Installs enim under `opts.prefix`; returns what it did, one step per path. */
export async function install(opts: InstallOptions): Promise<Step[]> {
  const root = opts.root ?? ROOT;
  const prefix = resolve(opts.prefix);
  const at = (p: string) => join(prefix, p);
  const log = opts.log ?? (() => {});
  const steps: Step[] = [];
  const record = (step: Step) => {
    steps.push(step);
    log(`${step.outcome.padEnd(9)} ${step.path}${step.note ? ` (${step.note})` : ""}`);
  };

  const compiled = join(root, "dist", "enim");
  const useLauncher = opts.launcher === true || !exists(compiled);
  if (useLauncher && opts.launcher !== true) {
    log(
      `notice: ${compiled} not found (deno task compile builds it); installing the launcher, ` +
        `which runs enim from ${root} with ${Deno.execPath()}`,
    );
  }

  // The plugin/agent executable.
  const denoDir = useLauncher ? await currentDenoDir() : "";
  const binary = useLauncher
    ? new TextEncoder().encode(launcherScript({ denoDir }))
    : await Deno.readFile(compiled);
  record({
    outcome: await put(at("/opt/cni/bin/enim"), binary, 0o755, false),
    path: "/opt/cni/bin/enim",
    note: useLauncher ? "launcher" : "compiled binary",
  });

  // Configuration: never overwritten, but for a conflist enim itself shipped before.
  const read = (rel: string) => Deno.readFile(join(root, "deploy", rel));
  const conflist = "/etc/cni/net.d/10-enim.conflist";
  const previous = exists(at(conflist)) &&
    PREVIOUS_CONFLISTS.includes(await Deno.readTextFile(at(conflist)));
  if (previous) {
    await writeAtomic(at(conflist), await read("10-enim.conflist"), 0o644);
    record({ outcome: "updated", path: conflist, note: "was enim's previous default" });
  } else {
    const outcome = await put(at(conflist), await read("10-enim.conflist"), 0o644, true);
    const problem = outcome === "kept"
      ? conflistProblem(await Deno.readTextFile(at(conflist)))
      : undefined;
    record({
      outcome,
      path: conflist,
      note: outcome !== "kept"
        ? ""
        : `exists; not overwritten${problem ? `; warning: ${problem}` : ""}`,
    });
  }
  await ensureDir(at("/etc/enim"), 0o755);
  const agentConfig = "/etc/enim/agent.jsonc";
  const outcome = await put(at(agentConfig), await read("agent.jsonc"), 0o600, true);
  record({ outcome, path: agentConfig, note: outcome === "kept" ? "exists; not overwritten" : "" });

  // The systemd unit (ours: replaced when it changes) and the launcher's drop-in.
  record({
    outcome: await put(
      at("/etc/systemd/system/enim-agent.service"),
      await read("enim-agent.service"),
      0o644,
      false,
    ),
    path: "/etc/systemd/system/enim-agent.service",
  });
  if (useLauncher) {
    const text = new TextEncoder().encode(launcherDropin(denoDir, root));
    record({ outcome: await put(at(LAUNCHER_DROPIN), text, 0o644, false), path: LAUNCHER_DROPIN });
  } else if (exists(at(LAUNCHER_DROPIN))) {
    await Deno.remove(at(LAUNCHER_DROPIN));
    record({ outcome: "removed", path: LAUNCHER_DROPIN, note: "not needed by the binary" });
  }

  // State and log directories.
  for (const [dir, mode] of [["/var/lib/enim", 0o700], ["/var/log/enim", 0o750]] as const) {
    const created = await ensureDir(at(dir), mode);
    record({ outcome: created ? "created" : "unchanged", path: dir });
  }
  return steps;
}

/** Why installing into the real root is refused (not root), or undefined when it may go on. */
export function rootProblem(prefix: string | undefined, uid: number | null): string | undefined {
  if (prefix !== undefined || uid === 0) return undefined;
  return "install: installing into / (/opt/cni/bin, /etc, /var) needs root; run it as root, " +
    "or pass --prefix DIR to stage the files in DIR";
}

/** The task: returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  let values: { prefix?: string; launcher?: boolean; help?: boolean };
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        prefix: { type: "string" },
        launcher: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
    }));
  } catch (err) {
    console.error(`install: ${err instanceof Error ? err.message : String(err)}`);
    return 2;
  }
  if (values.help) {
    console.log("usage: deno task install [--prefix DIR] [--launcher]");
    return 0;
  }
  const problem = rootProblem(values.prefix, Deno.uid());
  if (problem !== undefined) {
    console.error(problem);
    return 1;
  }
  const prefix = values.prefix ?? "/";
  if (prefix !== "/") console.log(`Staging into ${resolve(prefix)}`);
  await install({ prefix, launcher: values.launcher, log: (l) => console.log(l) });
  if (prefix === "/") {
    console.log(
      "Next: edit /etc/enim/agent.jsonc (provider), then\n" +
        "  systemctl daemon-reload && systemctl enable --now enim-agent.service",
    );
  }
  return 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
