/**
 * Every child process enim starts: `ip`, `tc`, `nft`, `nsenter`, `stat` and the host
 * link's pod-side shell, all through `./ip.ts` and `./tc.ts`, which build the commands.
 *
 * Every run spawns its child (so it has a PID to kill) and reads both of its output
 * streams to their end here, never leaving one to the garbage collector: a spawned
 * child's stream objects left unread keep ~100 KB of native memory each until a
 * major GC, which a long-lived agent with a small heap seldom runs (measured: +0.6 MB
 * of RSS per ADD/DEL cycle, 77 → 259 MB over 300 cycles); read to their end they cost
 * what `Deno.Command.output()` costs (measured over 4000 runs of `ip -V`; the
 * ChildProcess's own `output()` costs 10 times more). So input goes in a file where
 * it can: {@linkcode startFed}, a process started before its input is known (the
 * pod's configure, which starts while the device moves), is fed through its stdin,
 * written to its end here too (the bench's 1000-cycle soak checks the agent's RSS
 * stays flat).
 *
 * Every child has a deadline ({@linkcode setCommandTimeout}; the agent's
 * `timeouts.commandSeconds`, default 10 s): one that has not exited and closed its
 * output by then (a kernel stuck on the rtnl lock, a wedged `nsenter`) gets SIGTERM,
 * then SIGKILL after a short grace ({@linkcode KILL_GRACE_MS}), always by its own
 * PID, and the call fails with a {@linkcode CommandTimeoutError} naming the command
 * and the deadline, so the operation that waited for it ends and frees its locks.
 * For {@linkcode startFed} the deadline runs from the feed. The one child without a
 * deadline is a watch ({@linkcode startWatch}: `ip monitor`), which runs until its
 * owner closes it, by its PID.
 *
 * @module
 */
import { clip } from "../lib/clip.ts";

/** Counts every process this module spawns (for the bench and the perf tests). */
export const spawnCounter: { count: number } = { count: 0 };

/** A failed `ip` (or `nsenter`) run: the command line, its exit code and stderr. */
export class IpError extends Error {
  /** The full argv that was run, binary first. */
  readonly argv: string[];
  readonly code: number;
  readonly stderr: string;
  /** What it printed before failing (`ip -batch -force` goes on past a failed line). */
  readonly stdout: string;
  constructor(
    argv: string[],
    code: number,
    stderr: string,
    options?: { cause?: unknown; stdout?: string },
  ) {
    super(
      `Command "${argv.join(" ")}" failed with exit code ${code}: ${stderr.trim() || "no output"}`,
      options,
    );
    this.name = "IpError";
    this.argv = argv;
    this.code = code;
    this.stderr = stderr.trim();
    this.stdout = options?.stdout ?? "";
  }
}

/** The default deadline of every child process: `timeouts.commandSeconds` of the agent. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 10_000;
/**
 * How long a child past its deadline gets after SIGTERM before SIGKILL, and after
 * SIGKILL before it is given up on (a process in uninterruptible sleep dies only when
 * the kernel lets it).
 */
export const KILL_GRACE_MS = 1_000;

/** The deadline of one run and the grace of its kill. */
export interface CommandLimits {
  /** How long the child may take, from its start (from its feed for {@linkcode startFed}). */
  timeoutMs?: number;
  /** Between SIGTERM and SIGKILL, and after SIGKILL (default {@linkcode KILL_GRACE_MS}). */
  graceMs?: number;
}

let commandTimeoutMs = DEFAULT_COMMAND_TIMEOUT_MS;

/**
 * Sets the deadline of every child this module starts from now on (the agent sets its
 * `timeouts.commandSeconds` once at start); a call's own `timeoutMs` still wins.
 */
export function setCommandTimeout(ms: number): void {
  if (!Number.isFinite(ms) || ms <= 0) {
    throw new RangeError(`Invalid command deadline "${ms}" ms: expected a positive number`);
  }
  commandTimeoutMs = ms;
}

/** The deadline every child gets unless its call names another. */
export function commandTimeout(): number {
  return commandTimeoutMs;
}

/** A deadline for a message: `10 s`, `0.25 s`. */
function seconds(ms: number): string {
  return `${Number((ms / 1000).toFixed(3))} s`;
}

/** The known binaries, shown by their names in messages. */
const SHORT = new Set([
  "/usr/sbin/ip",
  "/usr/bin/nsenter",
  "/usr/sbin/nft",
  "/bin/sh",
  "/usr/sbin/tc",
  "/usr/bin/stat",
]);

/**
 * A command line for a message: the known binaries by name, each argument on one line
 * and clipped (a shell script shows its head), the whole clipped.
 */
export function commandLabel(argv: string[]): string {
  const head = (text: string, n: number) => text.length > n ? `${text.slice(0, n)}…` : text;
  const words = argv.map((a, i) => {
    if (SHORT.has(a) || (i === 0 && a.startsWith("/"))) return a.split("/").at(-1)!;
    const one = a.replace(/\s+/g, " ").trim();
    return one === a ? head(a, 60) : head(one, 24);
  });
  return clip(words.join(" "), 200);
}

/** How a child past its deadline ended: see {@linkcode CommandTimeoutError.outcome}. */
export type TimeoutOutcome = "killed" | "unkillable" | "output_open";

/**
 * A child that did not finish within its deadline. An {@linkcode IpError} (with empty
 * stderr and output), so whatever handles a failed `ip` (rolling back a move, a host
 * link) handles it alike.
 */
export class CommandTimeoutError extends IpError {
  /** The deadline it missed. */
  readonly timeoutMs: number;
  /**
   * `killed`: it was sent SIGTERM (then SIGKILL) by its PID and exited; `unkillable`: it
   * had not exited even after SIGKILL (stuck in the kernel); `output_open`: it had
   * exited, but something it left behind still held its output open.
   */
  readonly outcome: TimeoutOutcome;
  constructor(argv: string[], timeoutMs: number, outcome: TimeoutOutcome, code: number) {
    super(argv, code, "");
    this.name = "CommandTimeoutError";
    this.timeoutMs = timeoutMs;
    this.outcome = outcome;
    const tail = {
      killed: "killed",
      unkillable: "sent SIGKILL, but it has not exited yet",
      output_open: "it exited, but a process it started still holds its output",
    }[outcome];
    this.message = `Cannot run "${commandLabel(argv)}": no answer within ${
      seconds(timeoutMs)
    }; ${tail}`;
  }
}

const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** The environment of every process this module starts: nothing of the agent's but a PATH. */
const CHILD_ENV = { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", LC_ALL: "C" };

/** What a finished child printed, and its exit code. */
export interface ExecOutput {
  code: number;
  stdout: string;
  stderr: string;
}

/** A stream being read to its end as text, which can be cut short. */
interface Drain {
  text: Promise<string>;
  cancel(): void;
}

/** Reads a byte stream to its end as text (or to {@linkcode Drain.cancel}), decoded once. */
function drain(stream: ReadableStream<Uint8Array>): Drain {
  const reader = stream.getReader();
  const text = (async () => {
    const parts: Uint8Array[] = [];
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        parts.push(value);
      }
    } catch {
      // Cancelled, or the pipe broke: what came so far is what it printed.
    } finally {
      reader.releaseLock();
    }
    if (parts.length === 0) return "";
    if (parts.length === 1) return decoder.decode(parts[0]);
    const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) (all.set(p, at), at += p.length);
    return decoder.decode(all);
  })();
  return { text, cancel: () => void reader.cancel().catch(() => {}) };
}

/** Resolves `true` when `p` settles within `ms`, else `false`; no timer outlives it. */
async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<false>((r) => (timer = setTimeout(() => r(false), ms)));
  try {
    return await Promise.race([p.then(() => true, () => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Sends `signal` to the child by its PID; false when it had exited already. */
function signal(child: Deno.ChildProcess, sig: Deno.Signal): boolean {
  try {
    child.kill(sig);
    return true;
  } catch {
    return false;
  }
}

/**
 * Waits for a started child: its exit, both output streams to their end and `input`
 * (its stdin being written), all within `timeoutMs`. Past it, the child gets SIGTERM,
 * then SIGKILL after `graceMs`, by its PID; whatever still holds its output open (a
 * process it left behind) is cut off, and {@linkcode CommandTimeoutError} is thrown.
 */
async function settle(
  child: Deno.ChildProcess,
  argv: string[],
  out: Drain,
  err: Drain,
  input: Promise<void>,
  limits: CommandLimits,
): Promise<ExecOutput> {
  const timeoutMs = limits.timeoutMs ?? commandTimeoutMs;
  const graceMs = limits.graceMs ?? KILL_GRACE_MS;
  const all = Promise.all([child.status, out.text, err.text, input]);
  if (await within(all, timeoutMs)) {
    const [status, stdout, stderr] = await all;
    return { code: status.code, stdout, stderr };
  }
  const before = await within(child.status, 0);
  let exited = before;
  if (!exited && signal(child, "SIGTERM")) exited = await within(child.status, graceMs);
  if (!exited && signal(child, "SIGKILL")) exited = await within(child.status, graceMs);
  exited ||= await within(child.status, 0);
  out.cancel();
  err.cancel();
  if (exited) {
    await Promise.all([out.text, err.text, input]);
    const { code } = await child.status;
    throw new CommandTimeoutError(argv, timeoutMs, before ? "output_open" : "killed", code);
  }
  // Stuck in the kernel: reaped whenever it dies; nothing here waits for it.
  all.catch(() => {});
  throw new CommandTimeoutError(argv, timeoutMs, "unkillable", -1);
}

/** Starts `argv` (binary first) with piped output and the children's environment, counting the spawn. */
function spawnChild(argv: string[], stdin: "null" | "piped"): Deno.ChildProcess {
  const [bin, ...args] = argv;
  spawnCounter.count++;
  return new Deno.Command(bin, {
    args,
    stdin,
    stdout: "piped",
    stderr: "piped",
    clearEnv: true,
    env: CHILD_ENV,
  }).spawn();
}

/**
 * Runs any argv (binary first) once, counting the spawn, and returns its exit code and
 * output; throws {@linkcode CommandTimeoutError} when it misses its deadline.
 */
export function exec(argv: string[], limits: CommandLimits = {}): Promise<ExecOutput> {
  const child = spawnChild(argv, "null");
  return settle(child, argv, drain(child.stdout), drain(child.stderr), Promise.resolve(), limits);
}

/** A process started by {@linkcode startFed}, waiting for its stdin. */
export interface FedProcess {
  /**
   * Writes `text` as the whole of its stdin, closes it, and waits for the exit (once;
   * later calls return the first call's outcome). A process that exited without
   * reading its stdin is no error here: its code and stderr say what happened. One
   * that has not exited within its deadline (counted from this call) is killed and
   * {@linkcode CommandTimeoutError} is thrown.
   */
  feed(text: string): Promise<ExecOutput>;
  /** Whether {@linkcode feed} was called. */
  readonly fed: boolean;
}

/** Writes `text` to a child's stdin and closes it; a child that exited without reading it is no error. */
async function write(stdin: WritableStream<Uint8Array>, text: string): Promise<void> {
  const w = stdin.getWriter();
  try {
    if (text !== "") await w.write(encoder.encode(text));
    await w.close();
  } catch {
    // It exited without reading (a failed step before it, a kill): its code says so.
    await w.abort().catch(() => {});
  }
}

/**
 * Starts `argv` (binary first) now, with the environment of {@linkcode exec}, to be
 * fed its stdin later: the exec of the program (and of `nsenter`) overlaps whatever
 * the caller does meanwhile. Counts as one spawn. A caller that has nothing to feed
 * feeds "" (the process reads end-of-file at once), so every started process is
 * waited for. Its deadline starts with the feed.
 */
export function startFed(argv: string[], limits: CommandLimits = {}): FedProcess {
  const child = spawnChild(argv, "piped");
  const stdout = drain(child.stdout);
  const stderr = drain(child.stderr);
  let outcome: Promise<ExecOutput> | null = null;
  return {
    get fed() {
      return outcome !== null;
    },
    feed(text: string) {
      outcome ??= settle(child, argv, stdout, stderr, write(child.stdin, text), limits);
      return outcome;
    },
  };
}

/** A long-lived child started by {@linkcode startWatch}. */
export interface Watch {
  /** Settles when it has ended (by itself, or by {@linkcode Watch.close}): its code and stderr. */
  readonly ended: Promise<{ code: number; stderr: string }>;
  /** Ends it by its PID (SIGTERM, then SIGKILL after the grace) and waits for it. */
  close(): Promise<void>;
}

/**
 * Starts `argv` (binary first) to run until the caller closes it (`ip monitor`), handing
 * each line of its stdout to `onLine`. The one kind of child without a deadline: it
 * is meant to run for the agent's life, and {@linkcode Watch.close} ends it by its PID;
 * the caller watches {@linkcode Watch.ended} to start it again should it end by itself.
 */
export function startWatch(
  argv: string[],
  onLine: (line: string) => void,
  limits: Pick<CommandLimits, "graceMs"> = {},
): Watch {
  const child = spawnChild(argv, "null");
  const err = drain(child.stderr);
  const lines = (async () => {
    let rest = "";
    const td = new TextDecoder();
    for await (const chunk of child.stdout) {
      const parts = (rest + td.decode(chunk, { stream: true })).split("\n");
      rest = parts.pop()!;
      for (const line of parts) if (line !== "") onLine(line);
    }
    rest += td.decode();
    if (rest !== "") onLine(rest);
  })();
  const ended = Promise.all([child.status, err.text, lines]).then(([status, stderr]) => ({
    code: status.code,
    stderr: clip(stderr.trim(), 1000),
  }));
  const graceMs = limits.graceMs ?? KILL_GRACE_MS;
  return {
    ended,
    async close() {
      if (!(await within(child.status, 0))) {
        if (signal(child, "SIGTERM") && !(await within(child.status, graceMs))) {
          if (signal(child, "SIGKILL")) await within(child.status, graceMs);
        }
      }
      await within(ended, graceMs);
    },
  };
}
