/**
 * A fresh machine's view of this one, for the tests of what the demo and `deno task test`
 * install (issues 12 and 41), without removing a package from this machine (other work
 * runs on it): a program runs in a private mount namespace where every file of the
 * packages of scripts/_deps.ts that are not part of every Debian system is missing, and
 * whose `/usr/bin/apt-get` is a stand-in that records its calls and, asked to install such
 * a package, puts that package's files back. So the program sees what a fresh machine
 * shows: the packages absent while its modules load, present once its apt step has run.
 *
 * Each folder holding a hidden file (/usr/bin, /usr/sbin, /usr/lib/cni, …) is replaced by
 * a farm of symlinks to the real folder's entries (bind-mounted aside) without the hidden
 * ones. A package not installed on this machine is already missing; asked for it, the
 * stand-in records the call and installs nothing.
 *
 * Everything runs on CPU 0 (taskset): a sandbox the program makes pins a mount namespace to
 * a file (tests/support/sandbox.ts), which the kernel refuses ("Invalid argument") unless
 * the pinned namespace is newer than the pinning one, by namespace id. On these machines'
 * kernel (6.18) those ids are not in creation order across CPUs, so inside this private
 * mount namespace the pin failed in about a third of runs; on one CPU it never did
 * (measured: 0 of 120).
 *
 * @module
 */
import { APT_PACKAGES, type AptPackage } from "../../scripts/_deps.ts";
import { type CommandOutput, runFromRoot } from "./command.ts";

const PACKAGES: Readonly<Record<string, AptPackage>> = APT_PACKAGES;
const APT_GET = "/usr/bin/apt-get";

/** What {@linkcode inFreshView} saw. */
export interface FreshRun extends CommandOutput {
  /** The packages hidden, each with the files of it this machine has. */
  hidden: Map<string, string[]>;
  /** Each apt-get call's arguments, in order. */
  aptCalls: string[][];
  /** The packages apt-get was asked to install, in order of the first request. */
  installed: string[];
}

function present(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

function basename(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1);
}

/** Single-quotes a word for sh. */
function q(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/**
 * Runs `argv` from the repository's root in the fresh view (see the module doc), with
 * `dir` (an empty temp directory the caller removes) for the farms and the stand-in's log.
 */
export async function inFreshView(dir: string, argv: string[]): Promise<FreshRun> {
  const hidden = new Map<string, string[]>();
  for (const [pkg, p] of Object.entries(PACKAGES)) {
    if (p.base) continue;
    const files = p.files.filter(present);
    if (files.length > 0) hidden.set(pkg, files);
  }
  const hiddenFiles = new Set([...hidden.values()].flat());
  // Each file in its folder's real path (/bin/busybox is in /usr/bin on merged /usr),
  // so that no folder gets two farms.
  const real = (f: string) => `${Deno.realPathSync(f.slice(0, f.lastIndexOf("/")))}/${basename(f)}`;
  const hiddenReal = new Set([...hiddenFiles].map(real));
  const folders = [
    ...new Set(["/usr/bin", ...[...hiddenReal].map((f) => f.slice(0, f.lastIndexOf("/")))]),
  ];
  const log = `${dir}/apt.log`;
  const orig = (folder: string) => `${dir}/orig${folder.replaceAll("/", "_")}`;
  const farm = (folder: string) => `${dir}/farm${folder.replaceAll("/", "_")}`;
  const mounts: string[] = [];
  for (const folder of folders) {
    await Deno.mkdir(orig(folder));
    await Deno.mkdir(farm(folder));
    for (const e of Deno.readDirSync(folder)) {
      const path = `${folder}/${e.name}`;
      if (hiddenReal.has(path) || path === APT_GET) continue;
      // A symlink is copied as it is (a relative one resolves from its folder again).
      const target = e.isSymlink ? await Deno.readLink(path) : `${orig(folder)}/${e.name}`;
      await Deno.symlink(target, `${farm(folder)}/${e.name}`);
    }
    mounts.push(`mount --bind ${q(folder)} ${q(orig(folder))}`);
    mounts.push(`mount --bind ${q(farm(folder))} ${q(folder)}`);
  }
  // The stand-in: records the call; each hidden package it is asked for comes back.
  const stub = [
    "#!/bin/sh",
    "# Stands in for apt-get (tests/support/fresh_view.ts).",
    `echo "$*" >> ${q(log)}`,
  ];
  for (const [pkg, files] of hidden) {
    const back = files.map(real).map((f) => {
      const folder = f.slice(0, f.lastIndexOf("/"));
      return `ln -sf ${q(`${orig(folder)}/${basename(f)}`)} ${q(f)}`;
    });
    stub.push(`case " $* " in *" ${pkg} "*) ${back.join("; ")} ;; esac`);
  }
  await Deno.writeTextFile(`${farm("/usr/bin")}/apt-get`, [...stub, ""].join("\n"), {
    mode: 0o755,
  });
  await Deno.writeTextFile(log, "");
  const script = [
    ...mounts,
    ...[...hiddenFiles].map((f) =>
      `{ test ! -e ${q(f)} || { echo ${q(`still there: ${f}`)} >&2; exit 1; }; }`
    ),
    `exec ${argv.map(q).join(" ")}`,
  ].join(" && ");
  const out = await runFromRoot([
    "/usr/bin/taskset",
    "--cpu-list",
    "0",
    "/usr/bin/unshare",
    "--mount",
    "--propagation",
    "private",
    "--",
    "/bin/sh",
    "-c",
    script,
  ]);
  const aptCalls = (await Deno.readTextFile(log)).split("\n").filter((l) => l !== "")
    .map((l) => l.split(" "));
  const installed = [
    ...new Set(
      aptCalls.filter((c) => c[0] === "install").flatMap((c) =>
        c.slice(1).filter((w) => w in PACKAGES)
      ),
    ),
  ];
  return { ...out, hidden, aptCalls, installed };
}
