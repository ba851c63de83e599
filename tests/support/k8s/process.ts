/**
 * One control-plane process of a test cluster: started with its flags, its output
 * appended to a log file in the cluster's folder (the last 64 KiB also kept in memory
 * for error messages), stopped by its PID (SIGTERM, then SIGKILL after a grace).
 *
 * Each component runs under a small `/bin/sh` watchdog whose stdin is a pipe from this
 * process: when this process goes (a test run killed, Ctrl-C), the pipe closes and the
 * watchdog sends the component SIGTERM, so no etcd or API server outlives the test that
 * started it. The watchdog writes the component's PID to a file first; `stop()` signals
 * that PID.
 *
 * @module
 */

/** The watchdog: `$1` the PID file, the rest the command. */
const WATCHDOG = [
  'pidfile="$1"; shift',
  // An asynchronous list's stdin is /dev/null unless redirected: keep the pipe as fd 3.
  "exec 3<&0",
  '"$@" </dev/null 3<&- & c=$!',
  'echo "$c" > "$pidfile"',
  // The test process gone (its pipe closed): stop the component.
  '{ cat <&3 >/dev/null; kill -TERM "$c" 2>/dev/null; } & w=$!',
  "trap 'kill -TERM \"$c\" 2>/dev/null' TERM INT",
  'while kill -0 "$c" 2>/dev/null; do wait "$c"; s=$?; done',
  'kill "$w" 2>/dev/null',
  'exit "${s:-0}"',
].join("\n");

/** A running component. */
export class ComponentProcess {
  readonly name: string;
  /** The component's own PID (not the watchdog's). */
  readonly pid: number;
  readonly logPath: string;
  readonly #child: Deno.ChildProcess;
  readonly #drained: Promise<void>;
  #tail = "";
  #exited: Deno.CommandStatus | null = null;
  readonly status: Promise<Deno.CommandStatus>;

  private constructor(
    name: string,
    child: Deno.ChildProcess,
    pid: number,
    logPath: string,
    log: Deno.FsFile,
  ) {
    this.name = name;
    this.#child = child;
    this.pid = pid;
    this.logPath = logPath;
    const dec = new TextDecoder();
    const pump = async (s: ReadableStream<Uint8Array>) => {
      for await (const chunk of s) {
        this.#tail = (this.#tail + dec.decode(chunk, { stream: true })).slice(-65536);
        await log.write(chunk);
      }
    };
    this.#drained = Promise.all([pump(child.stdout), pump(child.stderr)])
      .then(() => {}, () => {})
      .finally(() => log.close());
    this.status = child.status.then((s) => (this.#exited = s));
  }

  /**
   * Starts `path` with `args` under the watchdog (its environment `env` only, plus PATH),
   * `wrap` before it (`ip netns exec <ns>`); resolves once its PID is known.
   */
  static async start(
    name: string,
    path: string,
    args: string[],
    logPath: string,
    env: Record<string, string> = {},
    wrap: string[] = [],
  ): Promise<ComponentProcess> {
    const log = await Deno.open(logPath, { write: true, create: true, append: true });
    await log.write(new TextEncoder().encode(`$ ${[...wrap, path, ...args].join(" ")}\n`));
    const pidFile = `${logPath}.pid`;
    await Deno.remove(pidFile).catch(() => {});
    const child = new Deno.Command("/bin/sh", {
      args: ["-c", WATCHDOG, "sh", pidFile, ...wrap, path, ...args],
      clearEnv: true,
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", ...env },
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    let pid: number | null = null;
    for (let i = 0; i < 500 && pid === null; i++) {
      const text = await Deno.readTextFile(pidFile).catch(() => "");
      if (/^\d+\n$/.test(text)) pid = Number(text);
      else await new Promise((r) => setTimeout(r, 10));
    }
    if (pid === null) {
      child.kill("SIGKILL");
      await child.status;
      log.close();
      throw new Error(`${name} did not start (no PID in "${pidFile}")`);
    }
    return new ComponentProcess(name, child, pid, logPath, log);
  }

  /** Its exit status, if it exited. */
  get exited(): Deno.CommandStatus | null {
    return this.#exited;
  }

  /** The end of its output. */
  tail(chars = 4000): string {
    return this.#tail.slice(-chars);
  }

  /** SIGTERM by its PID, SIGKILL after `graceMs`; waits for the exit and the log. */
  async stop(graceMs = 10_000): Promise<Deno.CommandStatus> {
    const signal = (sig: Deno.Signal) => {
      if (this.#exited !== null) return;
      try {
        Deno.kill(this.pid, sig);
      } catch { /* gone already */ }
    };
    signal("SIGTERM");
    const timer = setTimeout(() => signal("SIGKILL"), graceMs);
    try {
      const s = await this.status;
      await this.#child.stdin.close().catch(() => {});
      await this.#drained;
      return s;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A free TCP port on 127.0.0.1 (bound and released; the caller binds it next). */
export function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}
