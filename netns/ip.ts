/**
 * The one place that spawns `ip` (and `nsenter` for namespaces given by path).
 *
 * Commands are argument arrays handed to Deno.Command (never a shell), with
 * absolute binary paths. JSON output (`ip -j`) is parsed with zod; several
 * commands can go to one `ip -batch FILE` to save spawns.
 *
 * Every run spawns its child (so it has a PID to kill) and reads both of its output
 * streams to their end here, never leaving one to the garbage collector: a spawned
 * child's stream objects left unread keep ~100 KB of native memory each until a
 * major GC, which a long-lived agent with a small heap seldom runs (measured: +0.6 MB
 * of RSS per ADD/DEL cycle, 77 → 259 MB over 300 cycles); read to their end they cost
 * what `Deno.Command.output()` costs (measured over 4000 runs of `ip -V`; the
 * ChildProcess's own `output()` costs 10 times more). A batch is written to a file in
 * a private scratch directory ({@linkcode DEFAULT_SCRATCH_DIR}, 0700) rather than
 * piped to `ip -batch -`, and removed after the run. The one exception is
 * {@linkcode startFed}: a process started before its batch is known (the pod's
 * configure, which starts while the device moves) is fed through its stdin, which is
 * written to its end here too (the bench's 1000-cycle soak checks the agent's RSS
 * stays flat).
 *
 * Every child has a deadline ({@linkcode setCommandTimeout}; the agent's
 * `timeouts.commandSeconds`, default 10 s): one that has not exited and closed its
 * output by then (a kernel stuck on the rtnl lock, a wedged `nsenter`) gets SIGTERM,
 * then SIGKILL after a short grace ({@linkcode KILL_GRACE_MS}), always by its own
 * PID, and the call fails with a {@linkcode CommandTimeoutError} naming the command
 * and the deadline, so the operation that waited for it ends and frees its locks.
 * For {@linkcode startFed} the deadline runs from the feed.
 *
 * A namespace reference ({@linkcode NetnsRef}) is either absent (the current
 * process's namespace), a name under /run/netns (`ip -n NAME`), or an absolute
 * path; /run/netns/NAME and /var/run/netns/NAME become `ip -n NAME` (one exec),
 * any other path goes through `nsenter --net=PATH ip …` (two execs).
 *
 * `./tc.ts` runs iproute2's `tc` the same way, with the helpers exported here.
 *
 * @module
 */
import * as z from "zod/mini";
import "../lib/zod_locale.ts";
import { clip } from "../lib/clip.ts";

/** The `ip` binary (iproute2). */
export const IP_BIN = "/usr/sbin/ip";
/** The `nsenter` binary (util-linux), for namespaces given by an arbitrary path. */
export const NSENTER_BIN = "/usr/bin/nsenter";
/** The `nft` binary (nftables): enim's table on the node and in each pod with a host link. */
export const NFT_BIN = "/usr/sbin/nft";
/** The shell that runs the host link's pod-side policy (one process in the pod's namespace). */
export const SH_BIN = "/bin/sh";

/** A network namespace: undefined/null for the current one, a name under /run/netns, or an absolute path. */
export type NetnsRef = string | null | undefined;

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
  const words = argv.map((a, i) => {
    if (SHORT.has(a) || (i === 0 && a.startsWith("/"))) return a.split("/").at(-1)!;
    const one = a.replace(/\s+/g, " ").trim();
    return one === a ? clip(a, 60) : clip(one, 24);
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

const NAMED = /^(?:\/var)?\/run\/netns\/([^/]+)$/;

/** Whether `s` is a bare namespace name usable with `ip -n` (no slash, not "." or ".."). */
function isName(s: string): boolean {
  return s.length > 0 && !s.includes("/") && s !== "." && s !== "..";
}

/** The argv (binary first) that runs `ip <args>` in `netns`. */
export function ipArgv(args: string[], netns?: NetnsRef): string[] {
  return iprouteArgv(IP_BIN, args, netns);
}

/**
 * The argv that runs an iproute2 program (`ip`, `tc`: both take `-n NAME`) with
 * `args` in `netns`: `-n` for a named namespace, `nsenter --net=PATH` for a path.
 */
export function iprouteArgv(bin: string, args: string[], netns?: NetnsRef): string[] {
  if (netns === undefined || netns === null) return [bin, ...args];
  const named = netns.match(NAMED)?.[1];
  if (named !== undefined && isName(named)) return [bin, "-n", named, ...args];
  if (isName(netns)) return [bin, "-n", netns, ...args];
  if (!netns.startsWith("/")) throw new TypeError(`Invalid netns reference "${netns}"`);
  return [NSENTER_BIN, `--net=${netns}`, bin, ...args];
}

/** The path of a namespace reference for `ip link set … netns PATH` (names map to /run/netns). */
export function netnsPath(netns: string): string {
  return netns.startsWith("/") ? netns : `/run/netns/${netns}`;
}

/** Options for {@linkcode runIp}. */
export interface RunOptions {
  netns?: NetnsRef;
}

/** What a successful run printed. */
export interface RunOutput {
  stdout: string;
  stderr: string;
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

/**
 * Runs any argv (binary first) once, counting the spawn, and returns its exit code and
 * output; throws {@linkcode CommandTimeoutError} when it misses its deadline.
 */
export function exec(argv: string[], limits: CommandLimits = {}): Promise<ExecOutput> {
  const [bin, ...args] = argv;
  spawnCounter.count++;
  const child = new Deno.Command(bin, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    clearEnv: true,
    env: CHILD_ENV,
  }).spawn();
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
  const [bin, ...args] = argv;
  spawnCounter.count++;
  const child = new Deno.Command(bin, {
    args,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
    clearEnv: true,
    env: CHILD_ENV,
  }).spawn();
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
  const [bin, ...args] = argv;
  spawnCounter.count++;
  const child = new Deno.Command(bin, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    clearEnv: true,
    env: CHILD_ENV,
  }).spawn();
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

/** Runs any argv (binary first) once; throws {@linkcode IpError} on a non-zero exit. */
export async function spawn(argv: string[]): Promise<RunOutput> {
  const { code, stdout, stderr } = await exec(argv);
  if (code !== 0) throw new IpError(argv, code, stderr, { stdout });
  return { stdout, stderr };
}

/** Where batch files go unless a caller names another directory: the agent's runtime dir. */
export const DEFAULT_SCRATCH_DIR = "/run/enim/ip";

let seq = 0;
const madeDirs = new Set<string>();

/** Writes `text` to a new file in `dir` (created 0700 once) and returns its path. */
export async function scratchFile(dir: string, text: string): Promise<string> {
  if (!madeDirs.has(dir)) {
    await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
    madeDirs.add(dir);
  }
  const path = `${dir}/${Deno.pid}-${++seq}.batch`;
  await Deno.writeFile(path, encoder.encode(text), { mode: 0o600 });
  return path;
}

/** Writes `text` to a new file in `dir` (created 0700 once), runs `fn` with its path, removes it. */
export async function withScratchFile<T>(
  dir: string,
  text: string,
  fn: (path: string) => Promise<T>,
): Promise<T> {
  const path = await scratchFile(dir, text);
  try {
    return await fn(path);
  } finally {
    await Deno.remove(path).catch(() => {});
  }
}

/**
 * The argv (binary first) that runs `argv` (an absolute binary and its arguments) in
 * `netns`: as it is in the current namespace, else through `nsenter --net=PATH` (a
 * name becomes /run/netns/NAME).
 */
export function inNetnsArgv(argv: string[], netns?: NetnsRef): string[] {
  if (netns === undefined || netns === null) return argv;
  if (!netns.startsWith("/") && !isName(netns)) {
    throw new TypeError(`Invalid netns reference "${netns}"`);
  }
  return [NSENTER_BIN, `--net=${netnsPath(netns)}`, ...argv];
}

/** Loads an nftables ruleset (`nft -f FILE`) in `netns`. */
export async function nftApply(
  ruleset: string,
  opts: { netns?: NetnsRef; scratchDir?: string } = {},
): Promise<void> {
  await withScratchFile(
    opts.scratchDir ?? DEFAULT_SCRATCH_DIR,
    ruleset,
    (file) => spawn(inNetnsArgv([NFT_BIN, "-f", file], opts.netns)),
  );
}

/** Runs `ip <args>` in a namespace. */
export function runIp(args: string[], opts: RunOptions = {}): Promise<RunOutput> {
  return spawn(ipArgv(args, opts.netns));
}

/** Parses the output of `ip -j`: one JSON value per line (batch mode prints one per show command). */
export function parseJsonLines(stdout: string): unknown[] {
  return stdout.split("\n").map((l) => l.trim()).filter((l) => l !== "").map((l, i) => {
    try {
      return JSON.parse(l);
    } catch (err) {
      throw new Error(
        `Cannot parse line ${i + 1} of "ip -j" output as JSON: "${l.slice(0, 200)}"`,
        {
          cause: err,
        },
      );
    }
  });
}

/** Runs `ip -j <args>` and parses its output with `schema`. */
export async function ipJson<T extends z.core.$ZodType>(
  schema: T,
  args: string[],
  opts: RunOptions = {},
): Promise<z.infer<T>> {
  const { stdout } = await runIp(["-j", ...args], opts);
  const values = parseJsonLines(stdout);
  return z.parse(schema, values.length === 0 ? [] : values[0]);
}

/** A batch line's word must not break the line apart or start a comment. */
const WORD = /^[^\s"'#\\]+$/;

/** Checks that every word of a batch command is safe to put on one `ip -batch` line. */
export function batchLine(words: (string | number)[]): string {
  for (const w of words) {
    if (!WORD.test(String(w))) throw new TypeError(`Unsafe word "${w}" in an ip batch command`);
  }
  return words.join(" ");
}

/** Options for {@linkcode ipBatch}. */
export interface BatchOptions {
  netns?: NetnsRef;
  /** Set `-j` and return the output of every show command. */
  json?: boolean;
  /** Where the batch file goes (default {@linkcode DEFAULT_SCRATCH_DIR}). */
  scratchDir?: string;
  /**
   * `-force`: run every line even after one failed (the exit code still says one
   * did; `IpError.stderr` names each failed line, `IpError.stdout` has the output).
   */
  force?: boolean;
}

/**
 * Runs several `ip` commands (each an argument array, without the leading `ip`)
 * in one `ip -batch FILE`, stopping at the first failure. With `json`, `-j` is
 * set and the output of every show command is returned, in order. A single
 * command runs as plain arguments, without a file.
 */
export async function ipBatch(
  commands: (string | number)[][],
  opts: BatchOptions = {},
): Promise<unknown[]> {
  if (commands.length === 0) return [];
  const lines = commands.map(batchLine);
  const flags = [...(opts.json ? ["-j"] : []), ...(opts.force ? ["-force"] : [])];
  if (commands.length === 1) {
    const { stdout } = await runIp([...flags, ...commands[0].map(String)], opts);
    return opts.json ? parseJsonLines(stdout) : [];
  }
  return await withScratchFile(
    opts.scratchDir ?? DEFAULT_SCRATCH_DIR,
    lines.join("\n") + "\n",
    async (file) => {
      const { stdout } = await runIp([...flags, "-batch", file], opts);
      return opts.json ? parseJsonLines(stdout) : [];
    },
  );
}

/** Runs a program inside a named namespace (`ip netns exec NAME argv…`); never throws on a non-zero exit. */
export function netnsExec(
  name: string,
  argv: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  if (!isName(name)) throw new TypeError(`Invalid netns name "${name}"`);
  return exec([IP_BIN, "netns", "exec", name, ...argv]);
}

/** `ip -j addr show` entries: a link with its addresses. */
export const AddrInfoSchema = z.looseObject({
  family: z.string(),
  local: z.string(),
  prefixlen: z.number().check(z.int()),
  scope: z.optional(z.string()),
});
/** One address of `ip -j addr show`. */
export type AddrInfo = z.infer<typeof AddrInfoSchema>;

/** `ip -j route show` entries. */
export const RouteEntrySchema = z.looseObject({
  dst: z.string(),
  gateway: z.optional(z.string()),
  dev: z.optional(z.string()),
  table: z.optional(z.string()),
  type: z.optional(z.string()),
  protocol: z.optional(z.string()),
  prefsrc: z.optional(z.string()),
});
/** One route of `ip -j route show`. */
export type RouteEntry = z.infer<typeof RouteEntrySchema>;
