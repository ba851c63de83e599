/**
 * A private /run/enim for each test node, so tests run enim with exactly the
 * production permission set and default paths.
 *
 * Deno grants unix sockets by exact path only, and the `enim` permission set
 * allows just `/run/enim/enim.sock`. Rather than widening the set for tests, each
 * sandbox is a mount namespace (persisted to a file) in which a private
 * directory is bind-mounted over /run/enim, joined, when given, with the node's
 * network namespace. The agent and every plugin call run inside it through
 * `nsenter --mount=… --net=…`, the same single exec `ip netns exec` costs, and
 * see a node of their own: `/run/enim/enim.sock`, `/run/enim/enim.db`.
 *
 * From the test process the same files are at {@linkcode EnimSandbox.host}.
 *
 * With `kubelet: true` the sandbox also has kubelet's device-plugin folder at its
 * production path, `/var/lib/kubelet/device-plugins` (a private directory bind-mounted
 * over `/var/lib` inside it), which the test process reaches at
 * {@linkcode EnimSandbox.kubeletDir}: the agent's device plugin runs with the
 * production permission set, and nothing on the machine's own /var/lib is touched.
 * Mounts under /run/netns propagate into the sandbox (it is a slave), so pod
 * namespaces created later are visible to the agent.
 *
 * With `cniNetD: true` the sandbox's `/etc/cni/net.d` is a private directory too (bind-mounted
 * over the machine's, which podman's package creates), reached from the test process at
 * {@linkcode EnimSandbox.netdDir}: the agent writes the node's conflist there at its
 * production path, and the machine's own folder is not touched.
 *
 * @module
 */
import { enimArgv } from "./enim.ts";

const NSENTER = "/usr/bin/nsenter";
const UNSHARE = "/usr/bin/unshare";
const MOUNT = "/usr/bin/mount";
const UMOUNT = "/usr/bin/umount";
/** The runtime's CNI config folder, inside the sandbox (with `cniNetD`). */
const NETD = "/etc/cni/net.d";
/** Where /run/enim is, inside the sandbox. */
export const INNER = "/run/enim";

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(
      `${cmd} ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr).trim()}`,
    );
  }
}

/** A private /run/enim (and optionally a network namespace) for enim processes. */
export class EnimSandbox implements AsyncDisposable {
  /** The sandbox's base directory, seen from the test process. */
  readonly base: string;
  /** The network namespace path processes join, or null for the current one. */
  readonly netns: string | null;
  #closed = false;

  private constructor(base: string, netns: string | null) {
    this.base = base;
    this.netns = netns;
  }

  /** The sandbox's `/etc/cni/net.d` as the test process sees it (with `cniNetD: true`). */
  get netdDir(): string {
    return `${this.base}/netd`;
  }

  /** The sandbox's kubelet folder as the test process sees it (with `kubelet: true`). */
  get kubeletDir(): string {
    return `${this.base}/varlib/kubelet/device-plugins`;
  }

  /**
   * Creates the sandbox; `netns` is a path such as /run/netns/<node>; `kubelet`
   * gives it kubelet's device-plugin folder (see the module doc).
   */
  static async create(
    netns: string | null = null,
    opts: { kubelet?: boolean; cniNetD?: boolean } = {},
  ): Promise<EnimSandbox> {
    const base = `/tmp/enim-sbx-${crypto.randomUUID().slice(0, 8)}`;
    const sb = new EnimSandbox(base, netns);
    await Deno.mkdir(`${base}/run`, { recursive: true, mode: 0o700 });
    try {
      // The file a mount namespace is pinned to must not be on a shared mount.
      await run(MOUNT, ["--bind", base, base]);
      await run(MOUNT, ["--make-private", base]);
      await Deno.mkdir(INNER, { recursive: true, mode: 0o755 });
      await Deno.writeTextFile(`${base}/mnt`, "");
      await run(UNSHARE, [
        `--mount=${base}/mnt`,
        "--propagation",
        "slave",
        MOUNT,
        "--bind",
        `${base}/run`,
        INNER,
      ]);
      if (opts.kubelet) {
        await Deno.mkdir(sb.kubeletDir, { recursive: true, mode: 0o755 });
        const inside = [`--mount=${base}/mnt`, "--", MOUNT, "--bind", `${base}/varlib`, "/var/lib"];
        await run(NSENTER, inside);
      }
      if (opts.cniNetD) {
        if (!(await Deno.stat(NETD).then((s) => s.isDirectory, () => false))) {
          throw new Error(`${NETD} does not exist on this machine (podman's package makes it)`);
        }
        await Deno.mkdir(sb.netdDir, { mode: 0o755 });
        await run(NSENTER, [`--mount=${base}/mnt`, "--", MOUNT, "--bind", sb.netdDir, NETD]);
      }
    } catch (err) {
      await sb.close().catch(() => {});
      throw err;
    }
    return sb;
  }

  /** A path inside the sandbox's /run/enim, as the test process sees it. */
  host(rel = ""): string {
    return rel ? `${this.base}/run/${rel}` : `${this.base}/run`;
  }

  /** The same path as enim processes inside the sandbox see it. */
  inner(rel = ""): string {
    return rel ? `${INNER}/${rel}` : INNER;
  }

  /** The argv that runs `argv` inside the sandbox. */
  wrap(argv: string[]): string[] {
    return [
      NSENTER,
      `--mount=${this.base}/mnt`,
      ...(this.netns ? [`--net=${this.netns}`] : []),
      "--",
      ...argv,
    ];
  }

  /**
   * The argv that runs enim (main.ts with the enim permission set) inside the sandbox;
   * `prefix` runs another build (an earlier release: `tests/support/releases.ts`).
   */
  enim(args: string[], prefix: string[] = enimArgv()): string[] {
    return this.wrap([...prefix, ...args]);
  }

  /** Releases the mount namespace and removes the directory; idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await run(UMOUNT, [`${this.base}/mnt`]).catch(() => {});
    await run(UMOUNT, [this.base]).catch(() => {});
    await Deno.remove(this.base, { recursive: true }).catch(() => {});
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
