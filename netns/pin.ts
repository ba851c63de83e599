/**
 * Network namespace files: what a path names, and holding one open for the
 * length of an operation.
 *
 * A request's namespace is proven before anything is allocated, and then held:
 * {@linkcode pinNetns} opens the file once and every command of the operation
 * (the move, the configure, the lookups) goes through that open file,
 * `/proc/<agent pid>/fd/<n>`, which `ip` and `nsenter` accept. A path deleted
 * and re-created meanwhile cannot redirect the device into another namespace,
 * and the identity recorded is that of the namespace the device landed in.
 *
 * What is refused, each with the path and what it is (`DeviceError`,
 * `netns_invalid`, CNI code 103 / HTTP 400): a relative path or one with `..`,
 * a missing path, a regular file, a directory, a device or any other file that
 * is not on nsfs, another kind of namespace (`/proc/<pid>/ns/mnt`), a path
 * outside what enim may read, the agent's own network namespace (the node's),
 * and the host's initial one. Deno's own permission messages never reach a user.
 *
 * Paths under /proc (runtimes may pass `/proc/<pid>/ns/net`; cri-dockerd does)
 * cannot be opened by Deno short of `--allow-all`; they are checked with one
 * `stat -L` spawn and used by path. Such a pin does not keep the namespace alive
 * (`keepsAlive` false): once the process exits, its namespace may go and its PID
 * name another process's namespace. Callers therefore finish their work with such
 * a namespace before they answer, and never take a device there by its name alone
 * ({@linkcode namesOneNamespace}).
 *
 * @module
 */
import { closeSync, fstatSync, openSync } from "node:fs";
import { exec } from "./ip.ts";
import { DeviceError, type NetnsIdentity, type PinnedNetns } from "./types.ts";
import { quote } from "../lib/clip.ts";

export type { PinnedNetns };

/** `stat(1)`: reads what Deno's permission model keeps out of reach (anything under /proc). */
const STAT_BIN = "/usr/bin/stat";

/** Where enim may open namespace files itself (the permission set's read paths). */
const OPENABLE = ["/run/netns/", "/var/run/netns/"];

/** A namespace file's identity and kind, as `stat -L` or `fstat` tells it. */
interface FileFacts {
  dev: number;
  ino: number;
  /** `regular file`, `directory`, `character special file`, … */
  type: string;
}

/** The namespaces the agent must never move a device into, and the nsfs device number. */
interface System {
  nsfsDev: number;
  own: NetnsIdentity;
  init: NetnsIdentity | null;
}

let system: Promise<System> | undefined;

/** Reads the nsfs device and the agent's own and the initial namespace once per process. */
function systemFacts(): Promise<System> {
  system ??= (async () => {
    const [own, init] = await statMany(["/proc/self/ns/net", "/proc/1/ns/net"]);
    if (!isFacts(own)) throw new Error(`Cannot stat /proc/self/ns/net: ${own.error}`);
    return {
      nsfsDev: own.dev,
      own: { dev: own.dev, ino: own.ino },
      // Unreadable where PID 1 holds capabilities the agent lacks (some sandboxes).
      init: isFacts(init) ? { dev: init.dev, ino: init.ino } : null,
    };
  })().catch((err) => {
    system = undefined;
    throw err;
  });
  return system;
}

/** One `stat -L` spawn for several paths: each one's facts, or why stat could not tell. */
async function statMany(paths: string[]): Promise<(FileFacts | { error: string })[]> {
  // stat exits 1 when one path fails; what it printed for the others still counts.
  const { stdout, stderr } = await exec([STAT_BIN, "-L", "-c", "%n|%d|%i|%F", "--", ...paths]);
  const byPath = new Map<string, FileFacts>();
  for (const line of stdout.split("\n")) {
    const m = /^(.*)\|(\d+)\|(\d+)\|(.+)$/.exec(line);
    if (m) byPath.set(m[1], { dev: Number(m[2]), ino: Number(m[3]), type: m[4] });
  }
  return paths.map((p) => {
    const facts = byPath.get(p);
    if (facts) return facts;
    const line = stderr.split("\n").find((l) => l.includes(`'${p}'`)) ?? "";
    return {
      error: /Permission denied/i.test(line)
        ? "cannot be read by the agent (permission denied)"
        : "does not exist",
    };
  });
}

const isFacts = (f: FileFacts | { error: string }): f is FileFacts => "dev" in f;

const PROC_NS = /^\/proc\/(?:\d+|self|thread-self)(?:\/task\/\d+)?\/ns\/([a-z_]+)$/;

function invalid(
  path: string,
  what: string,
  reason: "netns_invalid" | "netns_node" = "netns_invalid",
) {
  return new DeviceError("netns", reason, `Netns ${quote(path, 200)} ${what}`);
}

/** The sentence for a file that is not a namespace. */
function notANamespace(path: string, type: string): DeviceError {
  const article = /^[aeiou]/.test(type) ? "an" : "a";
  return invalid(path, `is ${article} ${type}, not a network namespace`);
}

/** Refuses the agent's own namespace and the host's initial one. */
function refuseNode(path: string, id: NetnsIdentity, sys: System): void {
  const same = (o: NetnsIdentity | null) => o !== null && o.dev === id.dev && o.ino === id.ino;
  if (same(sys.own)) {
    throw invalid(
      path,
      "is the agent's own network namespace (the node's): a pod's namespace is needed",
      "netns_node",
    );
  }
  if (same(sys.init)) {
    throw invalid(
      path,
      "is the host's initial network namespace: a pod's namespace is needed",
      "netns_node",
    );
  }
}

/**
 * Proves that `path` names a network namespace other than the node's and holds
 * it open. Close the result when the operation ends.
 *
 * @throws {DeviceError} `netns_invalid` naming the path and what it is
 */
export async function pinNetns(path: string): Promise<PinnedNetns> {
  if (!path.startsWith("/") || path.split("/").some((p) => p === ".." || p === ".")) {
    throw invalid(path, "is not an absolute path without '.' or '..'");
  }
  const sys = await systemFacts();
  const proc = PROC_NS.exec(path);
  if (proc) {
    if (proc[1] !== "net") {
      throw invalid(path, `is a ${proc[1]} namespace, not a network namespace`);
    }
    const [st] = await statMany([path]);
    if (!isFacts(st)) throw invalid(path, st.error);
    if (st.dev !== sys.nsfsDev) throw notANamespace(path, st.type);
    const identity = { dev: st.dev, ino: st.ino };
    refuseNode(path, identity, sys);
    return { path, ref: path, identity, keepsAlive: false, close() {} };
  }
  if (path.startsWith("/proc/")) {
    throw invalid(path, "is under /proc but not a process's ns/net");
  }
  if (!OPENABLE.some((dir) => path.startsWith(dir))) {
    // Deno's permission set allows only these; anything else would only get its hint.
    let exists = true;
    try {
      Deno.lstatSync(path);
    } catch (err) {
      exists = !(err instanceof Deno.errors.NotFound);
    }
    throw invalid(
      path,
      `${exists ? "is" : "would be"} outside the places enim reads namespaces from ` +
        `(${OPENABLE.join(", ")} and /proc/<pid>/ns/net)`,
    );
  }
  let st: Deno.FileInfo;
  try {
    st = Deno.statSync(path);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) throw invalid(path, "does not exist");
    throw invalid(path, `cannot be read: ${err instanceof Error ? err.name : String(err)}`);
  }
  if (!st.isFile) {
    throw notANamespace(
      path,
      st.isDirectory ? "directory" : st.isSymlink ? "dangling symbolic link" : "special file",
    );
  }
  if (st.dev !== sys.nsfsDev) throw notANamespace(path, "regular file");
  // Only a regular nsfs file is opened (no FIFO can block the open). The descriptor is
  // what counts from here on: checked again, it may name another file than the stat did.
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (err) {
    throw invalid(path, `cannot be opened: ${err instanceof Error ? err.name : String(err)}`);
  }
  try {
    const f = fstatSync(fd);
    if (!f.isFile() || f.dev !== sys.nsfsDev) throw notANamespace(path, "regular file");
    const identity = { dev: f.dev, ino: f.ino };
    refuseNode(path, identity, sys);
    let open = true;
    return {
      path,
      ref: `/proc/${Deno.pid}/fd/${fd}`,
      identity,
      keepsAlive: true,
      close() {
        if (open) closeSync(fd);
        open = false;
      },
    };
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

/**
 * Whether `netns` names one namespace for the whole of an operation, so that a device
 * found there by the name enim gave it may be taken as the attachment's: a pin that
 * keeps its namespace alive, or a path a runtime made for one sandbox (a bind mount
 * such as /run/netns/cni-…). Not a `/proc/<pid>/ns/net` path, pinned or not: the PID
 * may have been reused by then, and its `eth0` be another pod's.
 */
export function namesOneNamespace(netns: string | PinnedNetns): boolean {
  return typeof netns === "string" ? !netns.startsWith("/proc/") : netns.keepsAlive;
}

/**
 * The identity (nsfs device and inode) of a namespace file at an absolute path;
 * null unless `path` is absolute, free of "..", exists and lives on nsfs (a bind
 * mount such as /run/netns/x, or /proc/<pid>/ns/net). Reads without holding it.
 *
 * The kernel reuses namespace inode numbers once a namespace is freed, so equal
 * identities taken far apart in time do not prove the same namespace; callers
 * also check that the device they put there (by MAC) is still there.
 */
export async function netnsIdentity(path: string): Promise<NetnsIdentity | null> {
  if (!path.startsWith("/") || path.split("/").includes("..")) return null;
  const sys = await systemFacts();
  let st: { dev: number; ino: number; isFile: boolean } | null = null;
  if (path.startsWith("/proc/")) {
    const [f] = await statMany([path]);
    st = isFacts(f) ? { dev: f.dev, ino: f.ino, isFile: /regular/.test(f.type) } : null;
  } else {
    try {
      const s = await Deno.stat(path);
      st = s.ino === null ? null : { dev: s.dev, ino: s.ino, isFile: s.isFile };
    } catch {
      st = null;
    }
  }
  if (!st || !st.isFile || st.dev !== sys.nsfsDev) return null;
  return { dev: st.dev, ino: st.ino };
}
