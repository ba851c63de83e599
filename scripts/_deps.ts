/**
 * Installs what the tests, the demo and the bench need from Debian's packages,
 * so a fresh machine (CI) needs nothing set up by hand. Only as root; only what
 * is missing; `apt-get update` at most once per process. Every package and the
 * files of it the code uses are declared once, in {@linkcode APT_PACKAGES}.
 *
 * @module
 */
import { existsSync as exists } from "../lib/fs.ts";

/** A package and the file that shows it is installed. */
export interface AptNeed {
  pkg: string;
  file: string;
}

/**
 * Who uses a package: `deno task demo`, `deno task test` (every test, test helper and
 * script a test runs), `deno task bench`, and the bench's CRI rounds (`--no-cri` skips them).
 */
export type AptUser = "demo" | "test" | "bench" | "bench-cri";

/** A Debian package enim's own code uses, outside the shipped agent and plugin. */
export interface AptPackage {
  /**
   * The files of the package that the code runs, reads or copies, each by the absolute
   * path the code uses (tests/tools_test.ts fails on a tool path no package here lists).
   * A missing one means the package is to be installed.
   */
  readonly files: readonly string[];
  /** Who needs it: only those install it. */
  readonly users: readonly AptUser[];
  /**
   * Part of every Debian system (Essential, or of required priority), so never missing
   * where apt itself is: listed for completeness, and never hidden by the fresh-machine
   * tests (scripts/fresh_machine_test.ts).
   */
  readonly base?: boolean;
}

const ALL = ["demo", "test", "bench", "bench-cri"] as const;

/**
 * Every Debian package the demo, the tests, their helpers and the bench use, with the
 * files of it that their code runs: the one list (issue 41). `deno task test` installs
 * every package whose users include "test" before the first test starts; the demo and the
 * bench install theirs. A helper that needs a package takes it from here
 * ({@linkcode aptNeeds}, {@linkcode lazyTool}), so a test file run alone still installs
 * what it needs.
 *
 * The shipped agent and plugin run the `run` list of deno.json's `enim` permission set
 * (ip, tc, nsenter, stat, nft); those packages are here for every user.
 */
export const APT_PACKAGES = {
  apt: { files: ["/usr/bin/apt-get", "/usr/bin/apt"], users: ALL, base: true },
  dash: { files: ["/bin/sh"], users: ALL, base: true },
  // The agent's check of the node's tracked connections (netns/mod.ts CONNTRACK_FLUSH_SCRIPT).
  grep: { files: ["/bin/grep"], users: ALL, base: true },
  // Which package owns a file (tests/tools_test.ts checks this list against dpkg's).
  dpkg: { files: ["/usr/bin/dpkg", "/usr/bin/dpkg-query"], users: ["test"], base: true },
  coreutils: {
    files: [
      "/usr/bin/stat",
      "/usr/bin/timeout",
      "/usr/bin/cat",
      "/usr/bin/dd",
      "/usr/bin/ls",
      "/usr/bin/readlink",
      "/usr/bin/rm",
      "/usr/bin/sleep",
      // The image's test runs the init container's command in its root filesystem.
      "/usr/sbin/chroot",
      "/usr/bin/env",
    ],
    users: ALL,
    base: true,
  },
  "util-linux": {
    files: ["/usr/bin/nsenter", "/usr/bin/unshare", "/usr/bin/setpriv", "/usr/bin/taskset"],
    users: ALL,
    base: true,
  },
  mount: { files: ["/usr/bin/mount", "/usr/bin/umount"], users: ALL, base: true },
  // An earlier release built from history (scripts/_worktree.ts, tests/support/releases.ts).
  git: { files: ["/usr/bin/git"], users: ["test", "bench"] },
  tar: { files: ["/usr/bin/tar"], users: ["test", "bench-cri"], base: true },
  // Image layers (scripts/_oci.ts, `deno task image`).
  gzip: { files: ["/usr/bin/gzip"], users: ["test"], base: true },
  // The image's Debian layer (scripts/image.ts; its test builds it).
  mmdebstrap: { files: ["/usr/bin/mmdebstrap"], users: ["test"] },
  // The commit time of HEAD: the image's SOURCE_DATE_EPOCH by default (scripts/image.ts).
  // ss: the chaos test's silent watch finds the agent's connections (tests/support/api_silence.ts).
  iproute2: { files: ["/usr/sbin/ip", "/usr/sbin/tc", "/bin/ss"], users: ALL },
  // The agent flushes a retired address's tracked connections (netns/ip.ts CONNTRACK_BIN).
  conntrack: { files: ["/usr/sbin/conntrack"], users: ["test"] },
  // The agent's tables for pods' host links and NetworkPolicy; the simulated VPC's checks.
  nftables: { files: ["/usr/sbin/nft"], users: ALL },
  "iputils-ping": { files: ["/usr/bin/ping"], users: ["demo", "test"] },
  procps: { files: ["/usr/sbin/sysctl"], users: ["test", "bench", "bench-cri"] },
  // Clients of the traffic tests (tests/support/traffic.ts, policy/nft_test.ts).
  socat: { files: ["/usr/bin/socat"], users: ["test"] },
  // kube-proxy's iptables mode (tests/support/kube_proxy.ts), libcni's portmap.
  iptables: {
    files: [
      "/usr/sbin/iptables",
      "/usr/sbin/ip6tables",
      "/usr/sbin/iptables-restore",
      "/usr/sbin/ip6tables-restore",
      // What the real kube-proxy's iptables mode wrote (tests/support/k8s/kube_proxy.ts).
      "/usr/sbin/iptables-save",
      "/usr/sbin/ip6tables-save",
    ],
    users: ["test"],
  },
  // A stranger process connecting to the agent's socket (tests/reliability_test.ts); frames
  // through a packet socket (tests/support/raw_frames.ts).
  "python3-minimal": { files: ["/usr/bin/python3"], users: ["test"] },
  // A throwaway PKI and a TLS server asking for client certificates (tests/support/kube_pki.ts).
  openssl: { files: ["/usr/bin/openssl"], users: ["test"] },
  systemd: { files: ["/usr/bin/systemd-analyze"], users: ["test"] },
  containerd: { files: ["/usr/bin/containerd", "/usr/bin/ctr"], users: ["test", "bench-cri"] },
  runc: { files: ["/usr/sbin/runc"], users: ["test", "bench-cri"] },
  "busybox-static": { files: ["/bin/busybox"], users: ["test", "bench-cri"] },
  podman: { files: ["/usr/bin/podman"], users: ["test"] },
  conmon: { files: ["/usr/bin/conmon"], users: ["test"] },
  "containernetworking-plugins": {
    files: [
      "/usr/lib/cni/host-device",
      "/usr/lib/cni/loopback",
      // The real node's pod network before enim is installed (tests/k8s_real_node_test.ts).
      "/usr/lib/cni/bridge",
      "/usr/lib/cni/host-local",
      "/usr/lib/cni/portmap",
      "/usr/lib/cni/sbr",
      "/usr/lib/cni/static",
      "/usr/lib/cni/tuning",
    ],
    users: ["test", "bench", "bench-cri"],
  },
  // libcni as a client (tests/libcni_test.ts), built in GOPATH mode.
  "golang-go": { files: ["/usr/bin/go"], users: ["test"] },
  "golang-github-appc-cni-dev": {
    files: ["/usr/share/gocode/src/github.com/containernetworking/cni/libcni/api.go"],
    users: ["test"],
  },
  // runc is built with cgo for the real node (tests/support/k8s/build.ts ensureNodeBinaries).
  gcc: { files: ["/usr/bin/gcc"], users: ["test"] },
  "libc6-dev": { files: ["/usr/include/stdio.h"], users: ["test"] },
  "libseccomp-dev": { files: ["/usr/include/seccomp.h"], users: ["test"] },
  // The plugin processes' peak RSS and CPU (bench/resources.ts).
  time: { files: ["/usr/bin/time"], users: ["bench"] },
} as const satisfies Record<string, AptPackage>;

/** The name of a package of {@linkcode APT_PACKAGES}. */
export type AptPackageName = keyof typeof APT_PACKAGES;

/** A file of a package of {@linkcode APT_PACKAGES}. */
export type AptFile = (typeof APT_PACKAGES)[AptPackageName]["files"][number];

const PACKAGES: Readonly<Record<string, AptPackage>> = APT_PACKAGES;

/** The package of {@linkcode APT_PACKAGES} that lists `file`, or null. */
export function packageOf(file: string): string | null {
  for (const [pkg, p] of Object.entries(PACKAGES)) {
    if (p.files.includes(file)) return pkg;
  }
  return null;
}

/** The named packages as needs for {@linkcode ensureApt}: one per listed file. */
export function aptNeeds(...pkgs: AptPackageName[]): AptNeed[] {
  return pkgs.flatMap((pkg) => PACKAGES[pkg].files.map((file) => ({ pkg, file })));
}

/** Every package `user` needs, as needs for {@linkcode ensureApt}. */
export function aptNeedsOf(user: AptUser): AptNeed[] {
  return Object.entries(PACKAGES)
    .filter(([, p]) => p.users.includes(user))
    .flatMap(([pkg, p]) => p.files.map((file) => ({ pkg, file })));
}

/**
 * A program of {@linkcode APT_PACKAGES} found on first use, not when a module loads: the demo,
 * the tests and the bench import their fixtures before they run {@linkcode ensureApt}, so a
 * path checked at module load would miss a package that step installs (issue 12: the demo
 * failed once on a machine without ping). The returned function checks the path on each call
 * until it exists and then keeps it; it throws, naming the path and its package, while it
 * does not. `exists` is for tests.
 *
 * @example
 * ```ts
 * const ping = lazyTool("/usr/bin/ping");
 * // nothing is looked up yet; after ensureApt(...):
 * const argv = [ping(), "-c1", "10.0.0.1"];
 * ```
 */
export function lazyTool(file: AptFile, exists: (path: string) => boolean = isFile): () => string {
  const pkg = packageOf(file);
  let found = false;
  return () => {
    if (found) return file;
    found = exists(file);
    if (!found) {
      const name = file.slice(file.lastIndexOf("/") + 1);
      throw new Error(`Cannot find ${name}: "${file}" does not exist (Debian package "${pkg}")`);
    }
    return file;
  };
}

function isFile(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

/** apt-get options that wait up to 5 minutes for dpkg's lock. */
const LOCK_WAIT = ["-o", "DPkg::Lock::Timeout=300"];
const APT_GET: AptFile = "/usr/bin/apt-get";
/** Whether this process has run `apt-get update` (at most once). */
let updated = false;

/** Whether this process runs as root. */
export function isRoot(): boolean {
  return Deno.uid() === 0;
}

/**
 * Installs the packages of `needs` that have a file missing, through apt. Returns the
 * packages it could not provide (not root, or apt failed), each once, so callers can skip
 * with a clear message.
 */
export async function ensureApt(
  needs: AptNeed[],
  log = (m: string) => console.error(m),
): Promise<string[]> {
  const missing = needs.filter((n) => !exists(n.file));
  const pkgs = [...new Set(missing.map((m) => m.pkg))];
  if (pkgs.length === 0 || !isRoot()) return pkgs;
  const t0 = performance.now();
  log(`installing through apt: ${pkgs.join(" ")}`);
  const env = { DEBIAN_FRONTEND: "noninteractive" };
  const run = (args: string[]) =>
    new Deno.Command(APT_GET, { args, env, stdout: "null", stderr: "piped" }).output();
  // Wait for dpkg's lock rather than fail when another install (another test module, the
  // machine's own apt) holds it.
  const install = ["install", "-y", "-qq", "--no-install-recommends", ...LOCK_WAIT, ...pkgs];
  let res = await run(install);
  if (!res.success && !updated) {
    // A fresh machine has no package lists yet; one update per process, then once more.
    updated = true;
    await run(["update", "-qq", ...LOCK_WAIT]);
    res = await run(install);
  }
  log(`apt install took ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  if (!res.success) log(new TextDecoder().decode(res.stderr).slice(-2000));
  return [...new Set(missing.filter((n) => !exists(n.file)).map((m) => m.pkg))];
}
