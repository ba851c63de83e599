/**
 * The one place that builds and runs `ip` commands (and `nsenter` for namespaces
 * given by path); every child process itself is started by `./child.ts`, whose
 * deadline and kill apply to each of them.
 *
 * Commands are argument arrays handed to Deno.Command (never a shell), with
 * absolute binary paths. JSON output (`ip -j`) is parsed with zod; several
 * commands can go to one `ip -batch FILE` to save spawns. A batch is written to a
 * file in a private scratch directory ({@linkcode DEFAULT_SCRATCH_DIR}, 0700)
 * rather than piped to `ip -batch -` (see `./child.ts` for why), and removed after
 * the run; the one exception is `startFed`'s process (the pod's configure).
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
import { exec, IpError } from "./child.ts";

export {
  commandLabel,
  type CommandLimits,
  commandTimeout,
  CommandTimeoutError,
  DEFAULT_COMMAND_TIMEOUT_MS,
  exec,
  type ExecOutput,
  type FedProcess,
  IpError,
  KILL_GRACE_MS,
  setCommandTimeout,
  spawnCounter,
  startFed,
  startWatch,
  type TimeoutOutcome,
  type Watch,
} from "./child.ts";

const encoder = new TextEncoder();

/** The `ip` binary (iproute2). */
export const IP_BIN = "/usr/sbin/ip";
/** The `nsenter` binary (util-linux), for namespaces given by an arbitrary path. */
export const NSENTER_BIN = "/usr/bin/nsenter";
/** The `nft` binary (nftables): enim's table on the node and in each pod with a host link. */
export const NFT_BIN = "/usr/sbin/nft";
/** The shell that runs the host link's pod-side policy (one process in the pod's namespace). */
export const SH_BIN = "/bin/sh";
/** The `conntrack` binary (conntrack-tools): a freed address's connections go with it. */
export const CONNTRACK_BIN = "/usr/sbin/conntrack";

/** A network namespace: undefined/null for the current one, a name under /run/netns, or an absolute path. */
export type NetnsRef = string | null | undefined;

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

/**
 * Writes `text` to a new file in `dir` (created 0700 once) and returns its path. It
 * writes synchronously (a small file on the runtime dir's tmpfs): a spawn that reads it
 * starts in the caller's own task, so that the caller's next work overlaps the child's
 * (the plug computes the pod's policy while the device moves).
 */
export function scratchFile(dir: string, text: string): string {
  if (!madeDirs.has(dir)) {
    Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
    madeDirs.add(dir);
  }
  const path = `${dir}/${Deno.pid}-${++seq}.batch`;
  Deno.writeFileSync(path, encoder.encode(text), { mode: 0o600 });
  return path;
}

/**
 * Writes `text` to a new file in `dir` (created 0700 once), runs `fn` with its path
 * (in the caller's task: {@linkcode scratchFile}), removes it.
 */
export async function withScratchFile<T>(
  dir: string,
  text: string,
  fn: (path: string) => Promise<T>,
): Promise<T> {
  const path = scratchFile(dir, text);
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
  opts: { netns?: NetnsRef; scratchDir?: string; json?: boolean; check?: boolean } = {},
): Promise<void> {
  const flags = [...(opts.json ? ["-j"] : []), ...(opts.check ? ["-c"] : [])];
  await withScratchFile(
    opts.scratchDir ?? DEFAULT_SCRATCH_DIR,
    ruleset,
    (file) => spawn(inNetnsArgv([NFT_BIN, ...flags, "-f", file], opts.netns)),
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
  /** `-6`: the lines are IPv6 commands that cannot say so themselves (`ip rule`). */
  family?: 6;
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
  const flags = [
    ...(opts.family ? ["-6"] : []),
    ...(opts.json ? ["-j"] : []),
    ...(opts.force ? ["-force"] : []),
  ];
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

/** `ip -j rule list` entries: `iif_detached` is present (null) when the rule's input device does not exist. */
export const RuleEntrySchema = z.looseObject({
  priority: z.number().check(z.int()),
  src: z.optional(z.string()),
  dst: z.optional(z.string()),
  iif: z.optional(z.string()),
  iif_detached: z.optional(z.unknown()),
  fwmark: z.optional(z.string()),
  table: z.optional(z.string()),
});
/** One rule of `ip -j rule list`. */
export type RuleEntry = z.infer<typeof RuleEntrySchema>;

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
