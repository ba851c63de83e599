/**
 * The real Kubernetes components for the tests, built from their own Go modules and
 * cached per machine: kube-apiserver, kube-controller-manager, kube-scheduler and
 * kube-proxy from `k8s.io/kubernetes` (tests/k8s/kubernetes: a module of the tests'
 * own that requires it and replaces each staging module `k8s.io/<name>` with its
 * published `v0.<minor>.<patch>`), and etcd from `go.etcd.io/etcd/server/v3`
 * (tests/k8s/etcd, a module of its own: its dependencies are pinned apart from
 * Kubernetes', as etcd's own release builds them). No Kubernetes source is in the
 * repository: only those modules' go.mod, go.sum and the `tool` lines naming the commands.
 *
 * {@linkcode ensureK8sBinaries} builds them on first use into
 * `$XDG_CACHE_HOME/enim/k8s/<key>/bin` (`~/.cache/…` without it), `<key>` naming the
 * versions and a hash of the modules, the Go version and the build flags, with a progress
 * line to stderr; a warm run reads one small file. `ENIM_K8S_VERSION` (`1.34.4`, or
 * `1.34` for the newest 1.34 the Go proxy serves) selects another release: its module is
 * generated from the same template (the staging modules that release's own go.mod names,
 * each replaced by its `v0.x.y`) and tidied with `go mod tidy` into the cache, once. Go is
 * `/usr/local/go/bin/go` (never one found on PATH); without it {@linkcode goMissing} says
 * why the tests skip.
 *
 * @module
 */
import { z } from "zod";
import { ROOT } from "../../../scripts/_paths.ts";

/** The Go toolchain the components are built with. */
export const GO = "/usr/local/go/bin/go";
/** The Kubernetes release `deno task test` runs. */
export const PINNED_K8S_VERSION = "1.37.2";
/** The etcd release (the newest v3.6 the Go proxy serves when it was pinned). */
export const ETCD_VERSION = "3.6.16";
/** etcd's main package (server/main.go of the etcd repository). */
export const ETCD_PACKAGE = "go.etcd.io/etcd/server/v3";
/** The commands built from k8s.io/kubernetes (each `k8s.io/kubernetes/cmd/<name>`). */
export const K8S_COMMANDS = [
  "kube-apiserver",
  "kube-controller-manager",
  "kube-scheduler",
  "kube-proxy",
] as const;
/** One of {@linkcode K8S_COMMANDS}, or etcd. */
export type Component = (typeof K8S_COMMANDS)[number] | "etcd";

/** The tests' two Go modules, in the repository. */
export const MODULE_DIRS = {
  kubernetes: `${ROOT}/tests/k8s/kubernetes`,
  etcd: `${ROOT}/tests/k8s/etcd`,
};

/** The built components of one release. */
export interface K8sBinaries {
  /** The Kubernetes release, `1.37.2`. */
  version: string;
  /** The etcd release, `3.6.16`. */
  etcdVersion: string;
  /** The Go that built them, `go1.26.8`. */
  goVersion: string;
  /** The folder holding `bin/`. */
  dir: string;
  /** Each component's executable. */
  paths: Record<Component, string>;
  /** Seconds the build took (on the run that built them). */
  buildSeconds: number;
  /** Whether this call built them (false: found in the cache). */
  built: boolean;
}

/** The stamp written once a build is complete (the warm run reads only this). */
const StampSchema = z.object({
  version: z.string(),
  etcdVersion: z.string(),
  goVersion: z.string(),
  buildSeconds: z.number(),
  builtAt: z.string(),
});

/** Why the real components cannot be built here (null: Go is there). */
export function goMissing(): string | null {
  try {
    const st = Deno.statSync(GO);
    if (!st.isFile) return `${GO} is not a file`;
    return null;
  } catch {
    return `Go is not installed at ${GO} (the real Kubernetes components are built with it)`;
  }
}

/** The Go release at {@linkcode GO} (`go1.26.8`), from its VERSION file (no process). */
export function goVersion(): string {
  const text = Deno.readTextFileSync("/usr/local/go/VERSION");
  const v = text.split("\n")[0].trim();
  if (!/^go\d+\.\d+(\.\d+)?/.test(v)) {
    throw new Error(`Cannot tell the Go version from "/usr/local/go/VERSION": "${v}"`);
  }
  return v;
}

/** The release `ENIM_K8S_VERSION` asks for (default the pinned one), validated. */
export function requestedVersion(env = Deno.env.get("ENIM_K8S_VERSION")): string {
  const v = (env ?? "").trim().replace(/^v/, "");
  if (v === "") return PINNED_K8S_VERSION;
  if (!/^1\.\d{2}(\.\d+)?$/.test(v)) {
    throw new Error(
      `ENIM_K8S_VERSION "${env}" is not a Kubernetes release: give 1.<minor>.<patch> ` +
        `(1.34.4) or 1.<minor> (the newest patch the Go proxy serves)`,
    );
  }
  return v;
}

/** The linker flags: stripped, and the release's version where `--version` and /version read it. */
function ldflags(version: string): string {
  const [major, minor] = version.split(".");
  const vars = {
    gitVersion: `v${version}`,
    gitMajor: major,
    gitMinor: minor,
    gitTreeState: "clean",
    buildDate: "1970-01-01T00:00:00Z",
  };
  const x = Object.entries(vars).flatMap(([k, v]) => [
    `-X k8s.io/component-base/version.${k}=${v}`,
    `-X k8s.io/client-go/pkg/version.${k}=${v}`,
  ]);
  return ["-s", "-w", ...x].join(" ");
}

/** The environment of every go command: this process's, no toolchain download, static. */
function goEnv(cgo = false): Record<string, string> {
  return {
    ...Deno.env.toObject(),
    GOTOOLCHAIN: "local",
    CGO_ENABLED: cgo ? "1" : "0",
    GOFLAGS: "-buildvcs=false",
  };
}

/** Runs go; throws with the end of its output when it fails. */
async function go(args: string[], cwd: string, log?: string, cgo = false): Promise<string> {
  const out = await new Deno.Command(GO, {
    args,
    cwd,
    env: goEnv(cgo),
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  const text = dec.decode(out.stdout) + dec.decode(out.stderr);
  if (log) await Deno.writeTextFile(log, `$ go ${args.join(" ")}\n${text}\n`, { append: true });
  if (!out.success) {
    throw new Error(`go ${args.join(" ")} failed in "${cwd}":\n${text.slice(-4000)}`);
  }
  return dec.decode(out.stdout);
}

/** The cache's root: `$XDG_CACHE_HOME/enim/k8s`, else `$HOME/.cache/enim/k8s`. */
export function cacheRoot(): string {
  const xdg = Deno.env.get("XDG_CACHE_HOME");
  const home = Deno.env.get("HOME") ?? "/root";
  return `${xdg && xdg.startsWith("/") ? xdg : `${home}/.cache`}/enim/k8s`;
}

/** A go.mod's text without its comments and blank lines (a comment does not change a build). */
function meaningful(goMod: string): string {
  return goMod.split("\n").map((l) => l.replace(/\/\/.*$/, "").trimEnd()).filter(Boolean).join(
    "\n",
  );
}

async function sha256(parts: string[]): Promise<string> {
  const data = new TextEncoder().encode(parts.join("\0"));
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", data));
  return [...d].map((b) => b.toString(16).padStart(2, "0")).join("").slice(0, 16);
}

const GoModSchema = z.object({ GoMod: z.string() });

/**
 * The go.mod (before `go mod tidy`) of the tests' module for Kubernetes `version`: it
 * requires `k8s.io/kubernetes v<version>`, replaces every staging module that release's
 * own go.mod points at `./staging/src/…` with its published `v0.<minor>.<patch>`, and
 * names the commands as tools. Deterministic: the same release gives the same text.
 */
export async function kubernetesGoMod(
  version: string,
  work: string,
  commands: readonly string[] = K8S_COMMANDS,
  header = [
    "// The tests' module for the real Kubernetes components, written by tests/support/k8s/build.ts",
    "// (`pin`) and pinned by go mod tidy. No Kubernetes source is committed: Go fetches it.",
    "module enim.test/k8s/kubernetes",
  ],
): Promise<string> {
  const json = await go(["mod", "download", "-json", `k8s.io/kubernetes@v${version}`], work);
  const { GoMod } = GoModSchema.parse(JSON.parse(json));
  const upstream = await Deno.readTextFile(GoMod);
  const staging = [...upstream.matchAll(/^\s*(k8s\.io\/[a-z0-9-]+)\s+=>\s+\.\/staging\//gm)]
    .map((m) => m[1]);
  if (staging.length < 10) {
    throw new Error(
      `k8s.io/kubernetes v${version}'s go.mod names ${staging.length} staging modules; ` +
        "expected its ./staging/src replacements",
    );
  }
  const goLine = /^go (\S+)$/m.exec(upstream)?.[1] ?? "1.24.0";
  const staged = `0.${version.split(".").slice(1).join(".")}`;
  return [
    ...header,
    "",
    `go ${goLine}`,
    "",
    `require k8s.io/kubernetes v${version}`,
    "",
    "replace (",
    ...[...new Set(staging)].sort().map((m) => `\t${m} => ${m} v${staged}`),
    ")",
    "",
    ...commands.map((c) => `tool k8s.io/kubernetes/cmd/${c}`),
    "",
  ].join("\n");
}

/** The newest `1.<minor>.<patch>` the Go proxy serves for `1.<minor>`. */
async function newestPatch(minor: string, work: string): Promise<string> {
  const out = await go(["list", "-m", "-versions", "k8s.io/kubernetes"], work);
  const all = out.trim().split(/\s+/).slice(1)
    .filter((v) => new RegExp(`^v${minor.replace(".", "\\.")}\\.\\d+$`).test(v))
    .map((v) => v.slice(1));
  all.sort((a, b) => Number(a.split(".")[2]) - Number(b.split(".")[2]));
  const v = all.at(-1);
  if (!v) throw new Error(`The Go proxy serves no k8s.io/kubernetes release ${minor}.x`);
  return v;
}

/** What to build: each module's go.mod and go.sum text, and the cache key. */
interface Plan {
  version: string;
  key: string;
  /** The pinned release's committed module, or null: generate and tidy it. */
  kubernetes: { mod: string; sum: string | null };
  etcd: { mod: string; sum: string };
}

async function plan(version: string, goVer: string): Promise<Plan> {
  const read = (p: string) => Deno.readTextFile(p);
  const etcd = {
    mod: await read(`${MODULE_DIRS.etcd}/go.mod`),
    sum: await read(`${MODULE_DIRS.etcd}/go.sum`),
  };
  let kubernetes: Plan["kubernetes"];
  if (version === PINNED_K8S_VERSION) {
    kubernetes = {
      mod: await read(`${MODULE_DIRS.kubernetes}/go.mod`),
      sum: await read(`${MODULE_DIRS.kubernetes}/go.sum`),
    };
  } else {
    const tmp = await Deno.makeTempDir({ prefix: "enim-k8s-gomod-" });
    try {
      kubernetes = { mod: await kubernetesGoMod(version, tmp), sum: null };
    } finally {
      await Deno.remove(tmp, { recursive: true });
    }
  }
  const hash = await sha256([
    version,
    goVer,
    ldflags(version),
    JSON.stringify(goEnv().CGO_ENABLED),
    meaningful(kubernetes.mod),
    kubernetes.sum ?? "(tidied)",
    meaningful(etcd.mod),
    etcd.sum,
  ]);
  return { version, key: `v${version}-etcd-v${ETCD_VERSION}-${hash}`, kubernetes, etcd };
}

/** Removes the cache's older builds of `version` (another key: the modules changed since). */
async function removeStale(dir: string, version: string): Promise<void> {
  const root = cacheRoot();
  const mine = dir.slice(root.length + 1);
  for await (const e of Deno.readDir(root)) {
    const key = e.name.replace(/\.lock$/, "");
    if (key === mine || !key.startsWith(`v${version}-etcd-`)) continue;
    await Deno.remove(`${root}/${e.name}`, { recursive: true }).catch(() => {});
  }
}

function paths(dir: string): Record<Component, string> {
  const bin = `${dir}/bin`;
  return {
    etcd: `${bin}/etcd`,
    "kube-apiserver": `${bin}/kube-apiserver`,
    "kube-controller-manager": `${bin}/kube-controller-manager`,
    "kube-scheduler": `${bin}/kube-scheduler`,
    "kube-proxy": `${bin}/kube-proxy`,
  };
}

/** The built components found in `dir`, or null (no stamp, or a binary missing). */
function found(dir: string): K8sBinaries | null {
  let stamp: z.infer<typeof StampSchema>;
  try {
    stamp = StampSchema.parse(JSON.parse(Deno.readTextFileSync(`${dir}/built.json`)));
  } catch {
    return null;
  }
  const p = paths(dir);
  for (const f of Object.values(p)) {
    try {
      if (!Deno.statSync(f).isFile) return null;
    } catch {
      return null;
    }
  }
  return { ...stamp, dir, paths: p, built: false };
}

/** Options for {@linkcode ensureK8sBinaries}. */
export interface EnsureOptions {
  /** The Kubernetes release (default {@linkcode requestedVersion}). */
  version?: string;
  /** Where progress lines go (default stderr). */
  progress?: (line: string) => void;
}

/**
 * The built components of the release asked for: from the cache when there (a read of
 * one stamp file and a stat of each binary), else built now (minutes; progress lines to
 * stderr, the go commands' output in `<dir>/build.log`). Concurrent callers on one
 * machine build once: the build holds an exclusive lock on `<root>/<key>.lock`.
 */
export async function ensureK8sBinaries(o: EnsureOptions = {}): Promise<K8sBinaries> {
  const why = goMissing();
  if (why) throw new Error(why);
  const say = o.progress ?? ((l: string) => console.error(l));
  const goVer = goVersion();
  let version = o.version ?? requestedVersion();
  if (/^1\.\d+$/.test(version)) version = await newestPatch(version, cacheRoot0());
  const p = await plan(version, goVer);
  return await cachedBuild(p.key, found, (dir) => build(p, dir, goVer, say));
}

/**
 * What is cached under `key` in {@linkcode cacheRoot}: `found(dir)` when it is there, else
 * `make(dir)` under an exclusive lock on `<root>/<key>.lock` (a caller that waited for the
 * lock finds what the other one built).
 */
async function cachedBuild<T>(
  key: string,
  found: (dir: string) => T | null,
  make: (dir: string) => Promise<T>,
): Promise<T> {
  const root = cacheRoot();
  const dir = `${root}/${key}`;
  const warm = found(dir);
  if (warm) return warm;
  await Deno.mkdir(root, { recursive: true });
  const lock = await Deno.open(`${root}/${key}.lock`, { create: true, write: true });
  try {
    await lock.lock(true);
    const other = found(dir);
    if (other) return other;
    return await make(dir);
  } finally {
    lock.close();
  }
}

/** A folder go can run `go list`/`go mod download` from (outside any module). */
function cacheRoot0(): string {
  Deno.mkdirSync(cacheRoot(), { recursive: true });
  return cacheRoot();
}

async function build(
  p: Plan,
  dir: string,
  goVer: string,
  say: (line: string) => void,
): Promise<K8sBinaries> {
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  const modK8s = `${dir}/mod-kubernetes`, modEtcd = `${dir}/mod-etcd`;
  await Deno.mkdir(`${dir}/bin`, { recursive: true });
  await Deno.mkdir(modK8s);
  await Deno.mkdir(modEtcd);
  const log = `${dir}/build.log`;
  const t0 = performance.now();
  const secs = () => Math.round((performance.now() - t0) / 1000);
  say(
    `k8s: building Kubernetes v${p.version} (${K8S_COMMANDS.join(", ")}) and etcd ` +
      `v${ETCD_VERSION} with ${goVer} into ${dir} — the first build on a machine takes ` +
      "15 to 25 minutes on two busy cores with empty Go caches; later runs find it there",
  );
  const beat = setInterval(() => say(`k8s: still building (${secs()} s)`), 60_000);
  try {
    await Deno.writeTextFile(`${modEtcd}/go.mod`, p.etcd.mod);
    await Deno.writeTextFile(`${modEtcd}/go.sum`, p.etcd.sum);
    await Deno.writeTextFile(`${modK8s}/go.mod`, p.kubernetes.mod);
    if (p.kubernetes.sum !== null) {
      await Deno.writeTextFile(`${modK8s}/go.sum`, p.kubernetes.sum);
    } else {
      say(`k8s: resolving the module of v${p.version} (go mod tidy)`);
      await go(["mod", "tidy"], modK8s, log);
    }
    await go(
      ["build", "-trimpath", "-ldflags=-s -w", "-o", `${dir}/bin/etcd`, ETCD_PACKAGE],
      modEtcd,
      log,
    );
    say(`k8s: etcd built (${secs()} s)`);
    await go(
      [
        "build",
        "-trimpath",
        `-ldflags=${ldflags(p.version)}`,
        "-o",
        `${dir}/bin/`,
        ...K8S_COMMANDS.map((c) => `k8s.io/kubernetes/cmd/${c}`),
      ],
      modK8s,
      log,
    );
  } catch (err) {
    throw new Error(`Cannot build the Kubernetes components (log: ${log}): ${err}`, {
      cause: err,
    });
  } finally {
    clearInterval(beat);
  }
  const buildSeconds = secs();
  const stamp: z.infer<typeof StampSchema> = {
    version: p.version,
    etcdVersion: ETCD_VERSION,
    goVersion: goVer,
    buildSeconds,
    builtAt: new Date().toISOString(),
  };
  await Deno.writeTextFile(`${dir}/built.json`, JSON.stringify(stamp, null, 2) + "\n");
  say(`k8s: built in ${buildSeconds} s`);
  await removeStale(dir, p.version);
  return { ...stamp, dir, paths: paths(dir), built: true };
}

// ---------------------------------------------------------------------------------------
// The real node: kubelet, containerd 2.x (its runc shim, ctr) and runc.

/** The containerd release the real node runs (github.com/containerd/containerd/v2). */
export const CONTAINERD_VERSION = "2.4.2";
/** The runc release the real node runs (github.com/opencontainers/runc; built with cgo). */
export const RUNC_VERSION = "1.5.3";
/** The commands built from github.com/containerd/containerd/v2 (each `cmd/<name>`). */
export const CONTAINERD_COMMANDS = ["containerd", "containerd-shim-runc-v2", "ctr"] as const;
/** One of the real node's executables. */
export type NodeComponent = "kubelet" | (typeof CONTAINERD_COMMANDS)[number] | "runc";

/** The tests' modules of the real node, in the repository. */
export const NODE_MODULE_DIRS = {
  kubelet: `${ROOT}/tests/k8s/kubelet`,
  containerd: `${ROOT}/tests/k8s/containerd`,
  runc: `${ROOT}/tests/k8s/runc`,
};

/**
 * containerd's build tags: no btrfs, devmapper or zfs snapshotters (the node uses overlayfs;
 * btrfs' needs cgo and its headers).
 */
const CONTAINERD_TAGS = "no_btrfs,no_devmapper,no_zfs";
/**
 * runc's build tags: its Makefile's defaults without libpathrs (a Rust library). seccomp
 * (libseccomp-dev) is needed: containerd gives every pod sandbox the runtime's default
 * seccomp profile, and a runc without it refuses to start one.
 */
const RUNC_TAGS = "seccomp urfave_cli_no_docs";

/** The built node components of one release. */
export interface NodeBinaries {
  /** The Kubernetes release of kubelet, `1.37.2`. */
  version: string;
  containerdVersion: string;
  runcVersion: string;
  goVersion: string;
  /** The folder holding `bin/`. */
  dir: string;
  /** Each executable (containerd finds the shim on its PATH: put `dir/bin` there). */
  paths: Record<NodeComponent, string>;
  buildSeconds: number;
  built: boolean;
}

const NodeStampSchema = z.object({
  version: z.string(),
  containerdVersion: z.string(),
  runcVersion: z.string(),
  goVersion: z.string(),
  buildSeconds: z.number(),
  builtAt: z.string(),
});

/** Why the real node cannot be built here (null: Go and a C compiler are there). */
export function nodeBuildMissing(): string | null {
  const go = goMissing();
  if (go) return go;
  if (!existsFile("/usr/bin/gcc")) {
    return "gcc is not installed at /usr/bin/gcc (runc is built with cgo)";
  }
  if (!existsFile("/usr/include/stdio.h")) {
    return "the C library's headers are not installed (/usr/include/stdio.h: libc6-dev; runc is built with cgo)";
  }
  if (!existsFile("/usr/include/seccomp.h")) {
    return "libseccomp's headers are not installed (/usr/include/seccomp.h: libseccomp-dev; runc is built with seccomp)";
  }
  return null;
}

function existsFile(p: string): boolean {
  try {
    return Deno.statSync(p).isFile;
  } catch {
    return false;
  }
}

function nodePaths(dir: string): Record<NodeComponent, string> {
  const bin = `${dir}/bin`;
  return {
    kubelet: `${bin}/kubelet`,
    containerd: `${bin}/containerd`,
    "containerd-shim-runc-v2": `${bin}/containerd-shim-runc-v2`,
    ctr: `${bin}/ctr`,
    runc: `${bin}/runc`,
  };
}

function nodeFound(dir: string): NodeBinaries | null {
  let stamp: z.infer<typeof NodeStampSchema>;
  try {
    stamp = NodeStampSchema.parse(JSON.parse(Deno.readTextFileSync(`${dir}/built.json`)));
  } catch {
    return null;
  }
  const p = nodePaths(dir);
  if (!Object.values(p).every(existsFile)) return null;
  return { ...stamp, dir, paths: p, built: false };
}

interface NodePlan {
  version: string;
  key: string;
  kubelet: { mod: string; sum: string | null };
  containerd: { mod: string; sum: string };
  runc: { mod: string; sum: string };
}

async function nodePlan(version: string, goVer: string): Promise<NodePlan> {
  const read = (p: string) => Deno.readTextFile(p);
  const mod = async (dir: string) => ({
    mod: await read(`${dir}/go.mod`),
    sum: await read(`${dir}/go.sum`),
  });
  const containerd = await mod(NODE_MODULE_DIRS.containerd);
  const runc = await mod(NODE_MODULE_DIRS.runc);
  let kubelet: NodePlan["kubelet"];
  if (version === PINNED_K8S_VERSION) {
    kubelet = await mod(NODE_MODULE_DIRS.kubelet);
  } else {
    const tmp = await Deno.makeTempDir({ prefix: "enim-k8s-gomod-" });
    try {
      kubelet = {
        mod: await kubernetesGoMod(version, tmp, ["kubelet"], ["module enim.test/k8s/kubelet"]),
        sum: null,
      };
    } finally {
      await Deno.remove(tmp, { recursive: true });
    }
  }
  const hash = await sha256([
    version,
    goVer,
    ldflags(version),
    CONTAINERD_TAGS,
    RUNC_TAGS,
    meaningful(kubelet.mod),
    kubelet.sum ?? "(tidied)",
    meaningful(containerd.mod),
    containerd.sum,
    meaningful(runc.mod),
    runc.sum,
  ]);
  return {
    version,
    key: `node-v${version}-containerd-v${CONTAINERD_VERSION}-runc-v${RUNC_VERSION}-${hash}`,
    kubelet,
    containerd,
    runc,
  };
}

/**
 * kubelet of the release asked for, containerd {@linkcode CONTAINERD_VERSION} (with its
 * runc shim and ctr) and runc {@linkcode RUNC_VERSION}, from the cache or built now, as
 * {@linkcode ensureK8sBinaries} does for the control plane: their own key
 * (`node-v<k8s>-containerd-v<x>-runc-v<y>-<hash>`) and stamp beside the control plane's,
 * whose key they leave alone; the same lock scheme and progress lines.
 */
export async function ensureNodeBinaries(o: EnsureOptions = {}): Promise<NodeBinaries> {
  const why = nodeBuildMissing();
  if (why) throw new Error(why);
  const say = o.progress ?? ((l: string) => console.error(l));
  const goVer = goVersion();
  let version = o.version ?? requestedVersion();
  if (/^1\.\d+$/.test(version)) version = await newestPatch(version, cacheRoot0());
  const p = await nodePlan(version, goVer);
  return await cachedBuild(p.key, nodeFound, (dir) => buildNode(p, dir, goVer, say));
}

async function buildNode(
  p: NodePlan,
  dir: string,
  goVer: string,
  say: (line: string) => void,
): Promise<NodeBinaries> {
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  const mods = {
    kubelet: `${dir}/mod-kubelet`,
    containerd: `${dir}/mod-containerd`,
    runc: `${dir}/mod-runc`,
  };
  await Deno.mkdir(`${dir}/bin`, { recursive: true });
  for (const m of Object.values(mods)) await Deno.mkdir(m);
  const log = `${dir}/build.log`;
  const t0 = performance.now();
  const secs = () => Math.round((performance.now() - t0) / 1000);
  say(
    `k8s: building kubelet v${p.version}, containerd v${CONTAINERD_VERSION} ` +
      `(${CONTAINERD_COMMANDS.join(", ")}) and runc v${RUNC_VERSION} with ${goVer} into ${dir}` +
      " — the first build on a machine takes 5 to 15 minutes on two busy cores after the " +
      "control plane's; later runs find it there",
  );
  const beat = setInterval(() => say(`k8s: still building the node (${secs()} s)`), 60_000);
  const bin = `${dir}/bin`;
  try {
    await Deno.writeTextFile(`${mods.kubelet}/go.mod`, p.kubelet.mod);
    if (p.kubelet.sum !== null) {
      await Deno.writeTextFile(`${mods.kubelet}/go.sum`, p.kubelet.sum);
    } else {
      say(`k8s: resolving kubelet's module of v${p.version} (go mod tidy)`);
      await go(["mod", "tidy"], mods.kubelet, log);
    }
    for (const m of ["containerd", "runc"] as const) {
      await Deno.writeTextFile(`${mods[m]}/go.mod`, p[m].mod);
      await Deno.writeTextFile(`${mods[m]}/go.sum`, p[m].sum);
    }
    await go(
      [
        "build",
        "-trimpath",
        "-tags",
        RUNC_TAGS,
        `-ldflags=-s -w -X main.version=${RUNC_VERSION}`,
        "-o",
        `${bin}/runc`,
        "github.com/opencontainers/runc",
      ],
      mods.runc,
      log,
      true,
    );
    say(`k8s: runc built (${secs()} s)`);
    const cdVersion =
      `-X github.com/containerd/containerd/v2/version.Version=v${CONTAINERD_VERSION}`;
    await go(
      [
        "build",
        "-trimpath",
        "-tags",
        CONTAINERD_TAGS,
        `-ldflags=-s -w ${cdVersion}`,
        "-o",
        `${bin}/`,
        ...CONTAINERD_COMMANDS.map((c) => `github.com/containerd/containerd/v2/cmd/${c}`),
      ],
      mods.containerd,
      log,
    );
    say(`k8s: containerd built (${secs()} s)`);
    await go(
      [
        "build",
        "-trimpath",
        `-ldflags=${ldflags(p.version)}`,
        "-o",
        `${bin}/kubelet`,
        "k8s.io/kubernetes/cmd/kubelet",
      ],
      mods.kubelet,
      log,
    );
  } catch (err) {
    throw new Error(`Cannot build the node's components (log: ${log}): ${err}`, { cause: err });
  } finally {
    clearInterval(beat);
  }
  const buildSeconds = secs();
  const stamp: z.infer<typeof NodeStampSchema> = {
    version: p.version,
    containerdVersion: CONTAINERD_VERSION,
    runcVersion: RUNC_VERSION,
    goVersion: goVer,
    buildSeconds,
    builtAt: new Date().toISOString(),
  };
  await Deno.writeTextFile(`${dir}/built.json`, JSON.stringify(stamp, null, 2) + "\n");
  say(`k8s: node built in ${buildSeconds} s`);
  // Older builds of this release's node (another key: the modules changed since).
  const root = cacheRoot();
  for await (const e of Deno.readDir(root)) {
    const key = e.name.replace(/\.lock$/, "");
    if (key === p.key || !key.startsWith(`node-v${p.version}-`)) continue;
    await Deno.remove(`${root}/${e.name}`, { recursive: true }).catch(() => {});
  }
  return { ...stamp, dir, paths: nodePaths(dir), built: true };
}

/**
 * `deno run -A tests/support/k8s/build.ts pin <version>`: writes tests/k8s/kubernetes's
 * go.mod for `<version>` and tidies it (go.sum), for moving the pinned release; and
 * `deno run -A tests/support/k8s/build.ts` builds (or finds) the components and prints
 * where they are.
 */
if (import.meta.main) {
  if (Deno.args[0] === "pin") {
    const version = requestedVersion(Deno.args[1] ?? PINNED_K8S_VERSION);
    const dir = MODULE_DIRS.kubernetes;
    await Deno.mkdir(dir, { recursive: true });
    await Deno.writeTextFile(`${dir}/go.mod`, await kubernetesGoMod(version, cacheRoot0()));
    await go(["mod", "tidy"], dir);
    console.log(`wrote ${dir}/go.mod and go.sum for v${version}`);
  } else if (Deno.args[0] === "node") {
    console.log(JSON.stringify(await ensureNodeBinaries(), null, 2));
  } else {
    const b = await ensureK8sBinaries();
    console.log(JSON.stringify(b, null, 2));
  }
}
