/**
 * `deno task image`: builds enim's container image, as an OCI archive, from what a machine
 * with Debian's apt and the npm registry reaches (no container registry, no Dockerfile
 * builder): the image the DaemonSet (deploy/kubernetes/daemonset.yaml) runs.
 *
 * Three layers, each a reproducible tar (sorted names, fixed owners and times), gzip'd:
 *
 * 1. **Debian**: a root filesystem made by `mmdebstrap` from Debian's packages: the
 *    Essential set (dash as /bin/sh, coreutils, grep, util-linux's nsenter, …) and what the
 *    agent runs besides ({@linkcode IMAGE_PACKAGES}: iproute2, nftables, conntrack), merged
 *    /usr, no manuals, no translations, no documentation but the copyright files, no apt.
 *    mmdebstrap runs as root in a private mount namespace (its mounts of /proc, /sys and
 *    /dev into its own chroot folder end with it), with SOURCE_DATE_EPOCH fixed, so the
 *    same package versions give the same tar.
 * 2. **Deno**: the `deno` binary of the npm package `@deno/linux-<arch>-glibc` of the
 *    running Deno's version: what `npx deno@<version>` runs (the `deno` package only picks
 *    that platform package), fetched by Deno's own npm client, which checks the registry's
 *    integrity hash. At `/usr/local/lib/enim/deno`.
 * 3. **enim**: the built bundle (`deno task build`, without its BUILD.json stamp) at
 *    `/usr/local/lib/enim/bundle`, the launcher `/usr/local/bin/enim` (runs the bundle
 *    with the `enim` permission set, exactly as scripts/launcher.ts does), and what the
 *    init container installs onto the node: `/usr/local/lib/enim/install-cni`, a POSIX sh
 *    script that copies deno and the bundle to `<cni bin>/enim.d/<ID>/` and replaces
 *    `<cni bin>/enim` with a launcher pointing there ({@linkcode installScript}).
 *
 * The entry point is the one deploy/Containerfile had: `/usr/local/bin/enim agent --config
 * /etc/enim/agent.jsonc`. A compiled binary (`deno task compile`, which needs denort)
 * would replace layers 2 and 3's deno and bundle; this builder does not need it.
 *
 * The Debian tar and the deno binary are cached under `~/.cache/enim/image/` (keyed by
 * what made them; the Debian tar is rebuilt after {@linkcode ROOTFS_MAX_AGE_DAYS} days to
 * take security updates, or with `--refresh`), and each gzip'd layer by its tar's digest:
 * a second build only tars and hashes.
 *
 * ```sh
 * deno task image                        # dist/image/enim-<version>.oci.tar; prints digest, size
 * deno task image --ref registry.example.com/enim:0.1.0 --out-dir /tmp/img
 * ```
 *
 * @module
 */
import { parseArgs } from "node:util";
import { z } from "zod";
import { join, resolve, ROOT } from "./_paths.ts";
import { BUNDLE_DIR, bundleArgv, ensureBuiltSync, ENTRY, PLUGIN_ENTRY } from "./build.ts";
import { shQuote } from "./launcher.ts";
import {
  ociArch,
  type OciArchive,
  reproducibleTar,
  sha256Bytes,
  sha256File,
  writeOciArchive,
} from "./_oci.ts";

/** mmdebstrap (Debian's `mmdebstrap`). */
export const MMDEBSTRAP = "/usr/bin/mmdebstrap";
/** unshare (util-linux): mmdebstrap runs in a private mount namespace. */
const UNSHARE = "/usr/bin/unshare";
/** mmdebstrap's hook that makes /bin, /sbin and /lib links into /usr (bookworm's layout). */
const MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr";

/** The Debian release of the root filesystem. */
export const SUITE = "bookworm";
/**
 * What the agent runs besides Debian's Essential set (which brings /bin/sh, coreutils'
 * stat, grep and util-linux's nsenter): `ip` and `tc`, `nft`, `conntrack`. The `run` list
 * of deno.json's `enim` permission set, plus /bin/sh and what its scripts run
 * (netns/ip.ts SH_BIN, CONNTRACK_BIN; netns/mod.ts GREP_BIN).
 */
export const IMAGE_PACKAGES = ["iproute2", "nftables", "conntrack"] as const;
/** Every program the agent runs inside the image (checked by scripts/image_test.ts). */
export const AGENT_PROGRAMS = [
  "/usr/sbin/ip",
  "/usr/sbin/tc",
  "/usr/bin/nsenter",
  "/usr/bin/stat",
  "/usr/sbin/nft",
  "/usr/sbin/conntrack",
  "/bin/sh",
  "/bin/grep",
] as const;
/**
 * The time of every file of the Debian and Deno layers (mmdebstrap clamps newer ones to
 * it), fixed so those layers do not change with enim's commits: bookworm's release,
 * 2023-06-10.
 */
export const ROOTFS_EPOCH = 1686355200;
/** After this many days the cached Debian tar is rebuilt (security updates). */
export const ROOTFS_MAX_AGE_DAYS = 7;
/** Where the files live inside the image. */
export const IMAGE_DIR = "/usr/local/lib/enim";
/** The image's entry point. */
export const IMAGE_ENTRYPOINT = "/usr/local/bin/enim";
/** The placeholder for the payload folder in the launcher template. */
const DIR_PLACEHOLDER = "@ENIM_DIR@";

/** Paths dpkg leaves out of the root filesystem: documentation (but the copyrights), manuals, translations. */
const DPKG_EXCLUDES = [
  "path-exclude=/usr/share/man/*",
  "path-exclude=/usr/share/locale/*",
  "path-exclude=/usr/share/doc/*",
  "path-include=/usr/share/doc/*/copyright",
  "path-exclude=/usr/share/info/*",
  "path-exclude=/usr/share/lintian/*",
  "path-exclude=/usr/share/bash-completion/*",
];

/** The cache folder (`~/.cache/enim/image`, or `$XDG_CACHE_HOME/enim/image`). */
export function defaultCacheDir(): string {
  const base = Deno.env.get("XDG_CACHE_HOME") ??
    join(Deno.env.get("HOME") ?? "/root", ".cache");
  return join(base, "enim", "image");
}

function log(m: string): void {
  console.error(`image: ${m}`);
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

async function run(argv: string[], opts: { env?: Record<string, string>; cwd?: string } = {}) {
  const out = await new Deno.Command(argv[0], {
    args: argv.slice(1),
    env: opts.env,
    cwd: opts.cwd,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  if (!out.success) {
    throw new Error(
      `${argv.slice(0, 3).join(" ")} … failed (exit ${out.code}):\n${
        (text(out.stderr) + text(out.stdout)).slice(-4000)
      }`,
    );
  }
  return text(out.stdout);
}

/** The machine's Debian release codename (`VERSION_CODENAME` of /etc/os-release), or null. */
function machineCodename(): string | null {
  try {
    const m = /^VERSION_CODENAME=(\S+)$/m.exec(Deno.readTextFileSync("/etc/os-release"));
    return m ? m[1].replaceAll('"', "") : null;
  } catch {
    return null;
  }
}

/**
 * The apt sources mmdebstrap reads: the machine's own (its mirror, proxy-free snapshot or
 * not) when the machine runs {@linkcode SUITE}, else none (mmdebstrap's default,
 * deb.debian.org with the security and updates suites).
 */
export function machineSources(suite: string = SUITE): string[] {
  if (machineCodename() !== suite) return [];
  const files: string[] = [];
  try {
    for (const e of Deno.readDirSync("/etc/apt/sources.list.d")) {
      if (e.name.endsWith(".sources") || e.name.endsWith(".list")) {
        files.push(`/etc/apt/sources.list.d/${e.name}`);
      }
    }
  } catch { /* none */ }
  try {
    const main = Deno.readTextFileSync("/etc/apt/sources.list");
    if (main.split("\n").some((l) => /^\s*deb\s/.test(l))) files.push("/etc/apt/sources.list");
  } catch { /* none */ }
  return files.sort();
}

/** The mmdebstrap arguments for the root filesystem (outputs last). */
export function mmdebstrapArgs(sources: string[], packagesOut: string, tarOut: string): string[] {
  return [
    "--mode=root",
    "--variant=essential",
    "--format=tar",
    `--hook-dir=${MERGED_USR_HOOKS}`,
    `--include=${IMAGE_PACKAGES.join(",")}`,
    ...DPKG_EXCLUDES.map((o) => `--dpkgopt=${o}`),
    // No /dev (nor its device nodes): the runtime mounts one; the Deno layer adds the folder.
    "--skip=output/dev",
    // The machine's resolver and name stay out (the runtime writes both); info's index too.
    `--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname" "$1/usr/share/info/dir"`,
    // What was installed, with versions and sizes, for the caller and the tests.
    `--customize-hook=chroot "$1" dpkg-query -W -f='\${Package}\\t\${Version}\\t\${Installed-Size}\\n' > ${
      shQuote(packagesOut)
    }`,
    SUITE,
    tarOut,
    ...sources,
  ];
}

/** One package of the root filesystem. */
export interface RootfsPackage {
  name: string;
  version: string;
  /** dpkg's Installed-Size, in KiB. */
  installedKiB: number;
}

/** The Debian layer: its tar and what it holds. */
export interface Rootfs {
  tar: string;
  packages: RootfsPackage[];
  /** Whether it came from the cache. */
  cached: boolean;
}

function parsePackages(text: string): RootfsPackage[] {
  return text.trim().split("\n").filter((l) => l).map((l) => {
    const [name, version, size] = l.split("\t");
    return { name, version, installedKiB: Number(size) || 0 };
  }).sort((a, b) => a.name.localeCompare(b.name));
}

/**
 * The Debian root filesystem's tar, from the cache when made by the same arguments, the
 * same mmdebstrap and apt sources, less than {@linkcode ROOTFS_MAX_AGE_DAYS} days ago;
 * else built by mmdebstrap (root only).
 */
export async function buildRootfs(
  opts: { cacheDir?: string; refresh?: boolean } = {},
): Promise<Rootfs> {
  const cacheDir = opts.cacheDir ?? defaultCacheDir();
  const sources = machineSources();
  const version = (await run([MMDEBSTRAP, "--version"]).catch(() => "")).trim();
  if (!version) throw new Error(`${MMDEBSTRAP} is missing: apt-get install mmdebstrap`);
  const key = sha256Bytes(
    new TextEncoder().encode(JSON.stringify({
      version,
      arch: ociArch(),
      epoch: ROOTFS_EPOCH,
      args: mmdebstrapArgs(sources, "PACKAGES", "OUT"),
      sources: sources.map((f) => Deno.readTextFileSync(f)),
    })),
  ).slice(0, 16);
  const dir = join(cacheDir, `rootfs-${SUITE}-${ociArch()}-${key}`);
  const tar = join(dir, "rootfs.tar");
  const pkgs = join(dir, "packages.tsv");
  const st = await Deno.stat(tar).catch(() => null);
  const fresh = st?.mtime &&
    Date.now() - st.mtime.getTime() < ROOTFS_MAX_AGE_DAYS * 86400_000;
  if (st && fresh && !opts.refresh && await exists(pkgs)) {
    return { tar, packages: parsePackages(await Deno.readTextFile(pkgs)), cached: true };
  }
  if (Deno.uid() !== 0) {
    throw new Error("Building the Debian layer needs root (mmdebstrap --mode=root)");
  }
  await prune(cacheDir);
  await Deno.mkdir(dir, { recursive: true });
  const work = await Deno.makeTempDir({ dir, prefix: ".build-" });
  try {
    const tmp = join(work, "tmp");
    await Deno.mkdir(tmp);
    const t0 = performance.now();
    log(`building the Debian layer with mmdebstrap (${SUITE}, ${IMAGE_PACKAGES.join(", ")})`);
    // A private mount namespace: mmdebstrap's mounts into its chroot end with it, whatever
    // happens to mmdebstrap.
    await run([
      UNSHARE,
      "--mount",
      "--propagation",
      "private",
      "--",
      MMDEBSTRAP,
      ...mmdebstrapArgs(sources, join(work, "packages.tsv"), join(work, "rootfs.tar")),
    ], {
      env: { SOURCE_DATE_EPOCH: String(ROOTFS_EPOCH), TMPDIR: tmp, LC_ALL: "C.UTF-8" },
    });
    log(`Debian layer built in ${((performance.now() - t0) / 1000).toFixed(0)} s`);
    await Deno.rename(join(work, "packages.tsv"), pkgs);
    await Deno.rename(join(work, "rootfs.tar"), tar);
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
  return { tar, packages: parsePackages(await Deno.readTextFile(pkgs)), cached: false };
}

/**
 * Removes what the cache holds past {@linkcode ROOTFS_MAX_AGE_DAYS} days: Debian layers of
 * other inputs, gzip'd layers no build used since (a build touches those it uses).
 */
async function prune(cacheDir: string): Promise<void> {
  const old = (st: Deno.FileInfo) =>
    (st.mtime?.getTime() ?? 0) < Date.now() - ROOTFS_MAX_AGE_DAYS * 86400_000;
  const sweep = async (dir: string, match: (name: string) => boolean) => {
    let entries: Deno.DirEntry[];
    try {
      entries = [...Deno.readDirSync(dir)];
    } catch {
      return;
    }
    for (const e of entries.filter((e) => match(e.name))) {
      const path = join(dir, e.name);
      // A Debian layer's age is its tar's (its folder's while one is being built).
      const st = await Deno.stat(join(path, "rootfs.tar")).catch(() => Deno.stat(path))
        .catch(() => null);
      if (st !== null && old(st)) {
        log(`removing ${path} from the cache`);
        await Deno.remove(path, { recursive: true }).catch(() => {});
      }
    }
  };
  await sweep(cacheDir, (n) => n.startsWith("rootfs-"));
  await sweep(join(cacheDir, "layers"), (n) => n.endsWith(".tar.gz"));
}

/** The npm package holding deno's binary for this machine. */
export function denoPackage(version: string = Deno.version.deno): string {
  const platform = ({ amd64: "linux-x64-glibc", arm64: "linux-arm64-glibc" } as const)[
    ociArch() as "amd64" | "arm64"
  ];
  return `@deno/${platform}@${version}`;
}

const LockSchema = z.object({
  npm: z.record(z.string(), z.object({ integrity: z.string() })),
});

/**
 * deno's binary from npm (cached), and the registry's integrity hash of its package. Deno
 * itself fetches the package (`deno install` of a package.json naming it, in a scratch
 * folder with its own cache), checking the registry's integrity hash, which it records in
 * the lockfile: no npm client needed.
 */
export async function fetchDeno(
  opts: { cacheDir?: string; version?: string } = {},
): Promise<{ path: string; pkg: string; integrity: string }> {
  const pkg = denoPackage(opts.version);
  const dir = join(opts.cacheDir ?? defaultCacheDir(), "deno", pkg.replace(/[/@]/g, "_"));
  const path = join(dir, "deno");
  if (await exists(path) && await exists(join(dir, "integrity"))) {
    return { path, pkg, integrity: (await Deno.readTextFile(join(dir, "integrity"))).trim() };
  }
  await Deno.mkdir(dir, { recursive: true });
  const work = await Deno.makeTempDir({ dir, prefix: ".fetch-" });
  try {
    log(`fetching ${pkg} from npm`);
    const at = pkg.lastIndexOf("@");
    const [name, want] = [pkg.slice(0, at), pkg.slice(at + 1)];
    await Deno.writeTextFile(
      join(work, "package.json"),
      JSON.stringify({ dependencies: { [name]: want } }),
    );
    await run([Deno.execPath(), "install", "--quiet", "--node-modules-dir=auto"], {
      cwd: work,
      env: { DENO_DIR: join(work, "cache"), NO_COLOR: "1" },
    });
    const lock = LockSchema.parse(JSON.parse(await Deno.readTextFile(join(work, "deno.lock"))));
    const integrity = lock.npm[`${name}@${want}`]?.integrity;
    if (!integrity) throw new Error(`deno.lock names no integrity for ${pkg}`);
    const bin = join(work, "node_modules", name, "deno");
    const version = await run([bin, "--version"]);
    if (!version.startsWith(`deno ${want} `)) {
      throw new Error(`${pkg}'s deno says "${version.split("\n")[0]}", not deno ${want}`);
    }
    await Deno.copyFile(bin, `${path}.tmp`);
    await Deno.chmod(`${path}.tmp`, 0o755);
    await Deno.writeTextFile(join(dir, "integrity"), integrity + "\n");
    await Deno.rename(`${path}.tmp`, path);
    return { path, pkg, integrity };
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
}

/**
 * The launcher, with `dir` (deno at `dir/deno`, the bundle at `dir/bundle`) in place:
 * exactly the argv scripts/launcher.ts writes (`bundleArgv()`), deno's cache in `dir/cache`
 * unless the caller sets DENO_DIR (runtimes start plugins without HOME), no update check,
 * and the plugin's own entry for a CNI call.
 */
export function payloadLauncher(dir: string, root?: string): string {
  const argv = (entry: string) =>
    bundleArgv(`${dir}/bundle/${entry}`, `${dir}/deno`, root).map(shQuote).join(" ");
  return [
    "#!/bin/sh",
    "# enim: runs the bundle in the folder below with deno beside it, with the `enim`",
    "# permission set of deno.json as flags (written by scripts/image.ts).",
    `DENO_DIR="\${DENO_DIR:-${dir}/cache}"`,
    "export DENO_DIR",
    "DENO_NO_UPDATE_CHECK=1",
    "export DENO_NO_UPDATE_CHECK",
    "# A CNI call (CNI_COMMAND set, even empty) runs the plugin process's own entry.",
    'if [ "${CNI_COMMAND+set}" = set ]; then',
    `  exec ${argv(PLUGIN_ENTRY)} "$@"`,
    "fi",
    `exec ${argv(ENTRY)} "$@"`,
    "",
  ].join("\n");
}

/**
 * The init container's installer, `/usr/local/lib/enim/install-cni [DEST [HOST_DIR]]`: makes
 * the node's CNI bin folder (mounted at DEST, default /host/opt/cni/bin; HOST_DIR, default
 * /opt/cni/bin, is the same folder as the node sees it) run this image's enim with nothing
 * else installed on the node.
 *
 * 1. deno and the bundle are copied to `DEST/enim.d/<ID>/` through a temporary folder that
 *    is renamed when complete (a folder already complete is kept: a restarted init
 *    container copies nothing);
 * 2. `DEST/enim`, a launcher naming `HOST_DIR/enim.d/<ID>`, is written beside and renamed
 *    over the old one (a runtime starting the plugin sees the old or the new, whole);
 * 3. then the other versions go, but the one the old launcher named: a plugin that started
 *    before the rename may still be loading it.
 */
export function installScript(): string {
  return `#!/bin/sh
# Installs this image's enim onto the node (the DaemonSet's init container runs it):
# deno and the bundle under <cni bin>/enim.d/<ID>/, and <cni bin>/enim, a launcher.
# Usage: install-cni [DEST [HOST_DIR]]
#   DEST      the node's CNI bin folder, as mounted here (default /host/opt/cni/bin)
#   HOST_DIR  the same folder as the node sees it (default /opt/cni/bin)
set -eu
src=${IMAGE_DIR}
dest=\${1:-/host/opt/cni/bin}
hostdir=\${2:-/opt/cni/bin}
case "$hostdir" in
  /*) ;;
  *) echo "install-cni: HOST_DIR must be an absolute path, not '$hostdir'" >&2; exit 2 ;;
esac
case "$hostdir" in
  *[!A-Za-z0-9._/-]*) echo "install-cni: HOST_DIR '$hostdir' has a character other than A-Z a-z 0-9 . _ / -" >&2; exit 2 ;;
esac
[ -d "$dest" ] || { echo "install-cni: $dest is not a folder" >&2; exit 2; }
id=$(cat "$src/ID")
store=$dest/enim.d
mkdir -p "$store"
if [ ! -f "$store/$id/.complete" ]; then
  tmp=$store/.tmp-$id
  rm -rf "$tmp"
  mkdir "$tmp"
  cp -R "$src/deno" "$src/bundle" "$tmp/"
  "$tmp/deno" --version >/dev/null
  : >"$tmp/.complete"
  sync
  rm -rf "\${store:?}/$id"
  mv "$tmp" "$store/$id"
fi
# The version the current launcher runs: kept until the next install.
prev=
if [ -f "$dest/enim" ]; then
  prev=$(sed -n 's|.*/enim\\.d/\\([^/ ]*\\)/deno .*|\\1|p' "$dest/enim" | head -n 1) || prev=
fi
sed "s|${DIR_PLACEHOLDER}|$hostdir/enim.d/$id|g" "$src/launcher.in" >"$dest/.enim.tmp"
chmod 0755 "$dest/.enim.tmp"
sync
mv -f "$dest/.enim.tmp" "$dest/enim"
for d in "$store"/* "$store"/.tmp-*; do
  [ -e "$d" ] || continue
  name=\${d##*/}
  if [ "$name" = "$id" ] || [ "$name" = "$prev" ]; then continue; fi
  rm -rf "$d"
done
echo "installed $hostdir/enim: enim $id in $hostdir/enim.d/$id\${prev:+ (kept $prev)}"
`;
}

/** The files of a folder (relative paths, sorted), each with its SHA-256. */
async function treeDigest(dir: string, skip: (rel: string) => boolean): Promise<string> {
  const lines: string[] = [];
  const walk = async (rel: string) => {
    for (
      const e of [...Deno.readDirSync(join(dir, rel))].sort((a, b) => a.name < b.name ? -1 : 1)
    ) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (skip(r)) continue;
      if (e.isDirectory) await walk(r);
      else lines.push(`${r}\t${await sha256File(join(dir, r))}`);
    }
  };
  await walk("");
  return sha256Bytes(new TextEncoder().encode(lines.join("\n")));
}

/** Options of {@linkcode buildImage}. */
export interface BuildImageOptions {
  /** Where the archive goes (default `dist/image`). */
  outDir?: string;
  /** The image's name (default `localhost/enim:<version>`). */
  ref?: string;
  /** The cache (default `~/.cache/enim/image`). */
  cacheDir?: string;
  /** Rebuild the Debian layer even if a cached one is fresh. */
  refresh?: boolean;
  /** The built bundle (default `dist/bundle`, built first when stale). */
  bundleDir?: string;
  /**
   * The time of the enim layer's files and the config's `created` (default: the
   * SOURCE_DATE_EPOCH variable, else the commit time of the repository's HEAD).
   */
  sourceDateEpoch?: number;
  /**
   * The bundle is an earlier release's, built from history (tests/support/releases.ts):
   * `version` names the payload (its ID, the image's labels) and `root` is the folder of
   * that release's deno.json, whose permission sets the launchers take. The bundle is used
   * as it is (never rebuilt from this tree's sources).
   */
  release?: { version: string; root: string };
}

/** What {@linkcode buildImage} built. */
export interface BuiltImage extends OciArchive {
  /** The payload's ID: `<version>-<12 hex digits of deno's and the bundle's digests>`. */
  id: string;
  /** The Debian packages in the image. */
  packages: RootfsPackage[];
  /** The npm package deno came from, and its integrity. */
  deno: { pkg: string; integrity: string };
  /** Whether the Debian layer came from the cache. */
  rootfsCached: boolean;
}

async function headCommitTime(): Promise<number> {
  try {
    const out = await run(["/usr/bin/git", "-C", ROOT, "log", "-1", "--format=%ct"]);
    return Number(out.trim()) || 0;
  } catch {
    return 0;
  }
}

/** Builds the image (see the module's documentation) and returns where it is and its digest. */
export async function buildImage(opts: BuildImageOptions = {}): Promise<BuiltImage> {
  const VERSION = opts.release?.version ?? (await import("../lib/version.ts")).VERSION;
  const permissionRoot = opts.release?.root;
  const cacheDir = opts.cacheDir ?? defaultCacheDir();
  const outDir = resolve(opts.outDir ?? join(ROOT, "dist", "image"));
  const bundleDir = opts.bundleDir ?? BUNDLE_DIR;
  const ref = opts.ref ?? `localhost/enim:${VERSION}`;
  const envEpoch = Deno.env.get("SOURCE_DATE_EPOCH");
  const epoch = opts.sourceDateEpoch ??
    (envEpoch && /^\d+$/.test(envEpoch) ? Number(envEpoch) : await headCommitTime());

  if (!opts.release) ensureBuiltSync(bundleDir);
  const rootfs = await buildRootfs({ cacheDir, refresh: opts.refresh });
  const deno = await fetchDeno({ cacheDir });

  await Deno.mkdir(outDir, { recursive: true });
  const work = await Deno.makeTempDir({ dir: outDir, prefix: ".build-" });
  try {
    const bundleDigest = await treeDigest(bundleDir, (r) => r === "BUILD.json");
    const denoDigest = await sha256File(deno.path);
    const id = `${VERSION}-${
      sha256Bytes(new TextEncoder().encode(`${denoDigest}\n${bundleDigest}`)).slice(0, 12)
    }`;

    // Layer 2: deno.
    const denoRoot = join(work, "deno-root");
    await Deno.mkdir(join(denoRoot, IMAGE_DIR.slice(1)), { recursive: true, mode: 0o755 });
    await Deno.copyFile(deno.path, join(denoRoot, IMAGE_DIR.slice(1), "deno"));
    await Deno.chmod(join(denoRoot, IMAGE_DIR.slice(1), "deno"), 0o755);
    // The mount point of the runtime's /dev (the Debian layer has none).
    await Deno.mkdir(join(denoRoot, "dev"), { mode: 0o755 });
    await Deno.chmod(join(denoRoot, "dev"), 0o755);
    await reproducibleTar(denoRoot, ["dev", "usr"], join(work, "deno.tar"), ROOTFS_EPOCH);

    // Layer 3: the bundle, the launchers, the installer.
    const enimRoot = join(work, "enim-root");
    const lib = join(enimRoot, IMAGE_DIR.slice(1));
    await Deno.mkdir(lib, { recursive: true, mode: 0o755 });
    await Deno.mkdir(join(enimRoot, "usr/local/bin"), { recursive: true, mode: 0o755 });
    await copyTree(bundleDir, join(lib, "bundle"), (r) => r === "BUILD.json");
    const write = async (path: string, text: string, mode: number) => {
      await Deno.writeTextFile(path, text);
      await Deno.chmod(path, mode);
    };
    await write(join(lib, "ID"), `${id}\n`, 0o644);
    await write(join(lib, "launcher.in"), payloadLauncher(DIR_PLACEHOLDER, permissionRoot), 0o644);
    await write(join(lib, "install-cni"), installScript(), 0o755);
    await write(
      join(enimRoot, IMAGE_ENTRYPOINT.slice(1)),
      payloadLauncher(IMAGE_DIR, permissionRoot),
      0o755,
    );
    await reproducibleTar(enimRoot, ["usr"], join(work, "enim.tar"), epoch);

    const layerCache = join(cacheDir, "layers");
    const image = await writeOciArchive({
      workDir: work,
      out: join(outDir, `enim-${VERSION}.oci.tar`),
      ref,
      created: epoch,
      layers: [
        {
          tar: rootfs.tar,
          createdBy: `mmdebstrap ${SUITE} essential + ${IMAGE_PACKAGES.join(" ")}`,
          cacheDir: layerCache,
        },
        { tar: join(work, "deno.tar"), createdBy: `npm ${deno.pkg}`, cacheDir: layerCache },
        { tar: join(work, "enim.tar"), createdBy: `enim ${id} bundle`, cacheDir: layerCache },
      ],
      config: {
        Entrypoint: [IMAGE_ENTRYPOINT],
        Cmd: ["agent", "--config", "/etc/enim/agent.jsonc"],
        Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        WorkingDir: "/",
        Labels: {
          "org.opencontainers.image.title": "enim",
          "org.opencontainers.image.version": VERSION,
          "dev.enim.id": id,
          "dev.enim.deno": `${deno.pkg} ${deno.integrity}`,
        },
      },
      annotations: {
        "org.opencontainers.image.title": "enim",
        "org.opencontainers.image.version": VERSION,
      },
    });
    return {
      ...image,
      id,
      packages: rootfs.packages,
      deno: { pkg: deno.pkg, integrity: deno.integrity },
      rootfsCached: rootfs.cached,
    };
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
}

/** Copies the files of `src` to `dst` (folders 0755, files 0644), but those `skip` names. */
async function copyTree(src: string, dst: string, skip: (rel: string) => boolean): Promise<void> {
  const walk = async (rel: string) => {
    await Deno.mkdir(join(dst, rel), { recursive: true });
    await Deno.chmod(join(dst, rel), 0o755);
    for (const e of Deno.readDirSync(join(src, rel))) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (skip(r)) continue;
      if (e.isDirectory) await walk(r);
      else {
        await Deno.copyFile(join(src, r), join(dst, r));
        await Deno.chmod(join(dst, r), 0o644);
      }
    }
  };
  await walk("");
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      "out-dir": { type: "string" },
      ref: { type: "string" },
      "cache-dir": { type: "string" },
      refresh: { type: "boolean", default: false },
      json: { type: "boolean", default: false },
    },
  });
  const t0 = performance.now();
  const image = await buildImage({
    outDir: values["out-dir"],
    ref: values.ref,
    cacheDir: values["cache-dir"],
    refresh: values.refresh,
  });
  const seconds = (performance.now() - t0) / 1000;
  if (values.json) {
    console.log(JSON.stringify({ ...image, seconds }, null, 2));
  } else {
    const kib = image.packages.reduce((n, p) => n + p.installedKiB, 0);
    console.log(`archive: ${image.archive}`);
    console.log(`ref:     ${image.ref}`);
    console.log(`digest:  ${image.digest}`);
    console.log(`size:    ${image.size} bytes (${(image.size / 1048576).toFixed(1)} MiB)`);
    console.log(`id:      ${image.id}`);
    console.log(
      `debian:  ${image.packages.length} packages, ${(kib / 1024).toFixed(1)} MiB installed${
        image.rootfsCached ? " (cached)" : ""
      }`,
    );
    console.log(`built in ${seconds.toFixed(1)} s`);
  }
}
