/**
 * One control-plane process of a test cluster: started with its flags, its output
 * appended to a log file in the cluster's folder (the last 64 KiB also kept in memory
 * for error messages), stopped by its PID (SIGTERM, then SIGKILL after a grace).
 *
 * @module
 */

/** A running component. */
export class ComponentProcess {
  readonly name: string;
  readonly pid: number;
  readonly logPath: string;
  readonly #child: Deno.ChildProcess;
  readonly #drained: Promise<void>;
  #tail = "";
  #exited: Deno.CommandStatus | null = null;
  readonly status: Promise<Deno.CommandStatus>;

  private constructor(name: string, child: Deno.ChildProcess, logPath: string, log: Deno.FsFile) {
    this.name = name;
    this.#child = child;
    this.pid = child.pid;
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

  /** Starts `path` with `args`, its environment `env` only (plus PATH). */
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
    const argv = [...wrap, path, ...args];
    const child = new Deno.Command(argv[0], {
      args: argv.slice(1),
      clearEnv: true,
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", ...env },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    return new ComponentProcess(name, child, logPath, log);
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
    if (this.#exited === null) {
      try {
        Deno.kill(this.pid, "SIGTERM");
      } catch { /* gone already */ }
    }
    const timer = setTimeout(() => {
      try {
        Deno.kill(this.pid, "SIGKILL");
      } catch { /* gone */ }
    }, graceMs);
    try {
      const s = await this.status;
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
