/**
 * The one place that spawns `ip` (and `nsenter` for namespaces given by path).
 *
 * Commands are argument arrays handed to Deno.Command (never a shell), with
 * absolute binary paths. JSON output (`ip -j`) is parsed with zod; several
 * commands can go to one `ip -batch -` on stdin to save spawns.
 *
 * A namespace reference ({@linkcode NetnsRef}) is either absent (the current
 * process's namespace), a name under /run/netns (`ip -n NAME`), or an absolute
 * path; /run/netns/NAME and /var/run/netns/NAME become `ip -n NAME` (one exec),
 * any other path goes through `nsenter --net=PATH ip …` (two execs).
 *
 * @module
 */
import { z } from "zod";

/** The `ip` binary (iproute2). */
export const IP_BIN = "/usr/sbin/ip";
/** The `nsenter` binary (util-linux), for namespaces given by an arbitrary path. */
export const NSENTER_BIN = "/usr/bin/nsenter";

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
  constructor(argv: string[], code: number, stderr: string, options?: { cause?: unknown }) {
    super(
      `Command "${argv.join(" ")}" failed with exit code ${code}: ${stderr.trim() || "no output"}`,
      options,
    );
    this.name = "IpError";
    this.argv = argv;
    this.code = code;
    this.stderr = stderr.trim();
  }
}

const NAMED = /^(?:\/var)?\/run\/netns\/([^/]+)$/;

/** Whether `s` is a bare namespace name usable with `ip -n` (no slash, not "." or ".."). */
function isName(s: string): boolean {
  return s.length > 0 && !s.includes("/") && s !== "." && s !== "..";
}

/** The argv (binary first) that runs `ip <args>` in `netns`. */
export function ipArgv(args: string[], netns?: NetnsRef): string[] {
  if (netns === undefined || netns === null) return [IP_BIN, ...args];
  const named = netns.match(NAMED)?.[1];
  if (named !== undefined && isName(named)) return [IP_BIN, "-n", named, ...args];
  if (isName(netns)) return [IP_BIN, "-n", netns, ...args];
  if (!netns.startsWith("/")) throw new TypeError(`Invalid netns reference "${netns}"`);
  return [NSENTER_BIN, `--net=${netns}`, IP_BIN, ...args];
}

/** The path of a namespace reference for `ip link set … netns PATH` (names map to /run/netns). */
export function netnsPath(netns: string): string {
  return netns.startsWith("/") ? netns : `/run/netns/${netns}`;
}

/** Options for {@linkcode runIp}. */
export interface RunOptions {
  netns?: NetnsRef;
  /** Text for stdin (batch commands). */
  stdin?: string;
}

/** What a successful run printed. */
export interface RunOutput {
  stdout: string;
  stderr: string;
}

const decoder = new TextDecoder();

/** Runs any argv (binary first) once, counting the spawn, and returns its exit code and output. */
async function exec(
  argv: string[],
  stdin?: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const [bin, ...args] = argv;
  spawnCounter.count++;
  const child = new Deno.Command(bin, {
    args,
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    clearEnv: true,
    env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin", LC_ALL: "C" },
  }).spawn();
  if (stdin !== undefined) {
    const w = child.stdin.getWriter();
    try {
      await w.write(new TextEncoder().encode(stdin));
    } finally {
      await w.close().catch(() => {});
    }
  }
  const out = await child.output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/** Runs any argv (binary first) once; throws {@linkcode IpError} on a non-zero exit. */
export async function spawn(argv: string[], stdin?: string): Promise<RunOutput> {
  const { code, stdout, stderr } = await exec(argv, stdin);
  if (code !== 0) throw new IpError(argv, code, stderr);
  return { stdout, stderr };
}

/** Runs `ip <args>` in a namespace. */
export function runIp(args: string[], opts: RunOptions = {}): Promise<RunOutput> {
  return spawn(ipArgv(args, opts.netns), opts.stdin);
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
export async function ipJson<T extends z.ZodType>(
  schema: T,
  args: string[],
  opts: RunOptions = {},
): Promise<z.infer<T>> {
  const { stdout } = await runIp(["-j", ...args], opts);
  const values = parseJsonLines(stdout);
  return schema.parse(values.length === 0 ? [] : values[0]);
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

/**
 * Runs several `ip` commands (each an argument array, without the leading `ip`)
 * in one `ip -batch -`, stopping at the first failure. With `json`, `-j` is set
 * and the output of every show command is returned, in order.
 */
export async function ipBatch(
  commands: (string | number)[][],
  opts: { netns?: NetnsRef; json?: boolean } = {},
): Promise<unknown[]> {
  if (commands.length === 0) return [];
  const stdin = commands.map(batchLine).join("\n") + "\n";
  const args = [...(opts.json ? ["-j"] : []), "-batch", "-"];
  const { stdout } = await runIp(args, { netns: opts.netns, stdin });
  return opts.json ? parseJsonLines(stdout) : [];
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
  prefixlen: z.number().int(),
  scope: z.string().optional(),
});
/** One address of `ip -j addr show`. */
export type AddrInfo = z.infer<typeof AddrInfoSchema>;

/** `ip -j route show` entries. */
export const RouteEntrySchema = z.looseObject({
  dst: z.string(),
  gateway: z.string().optional(),
  dev: z.string().optional(),
  table: z.string().optional(),
  type: z.string().optional(),
  protocol: z.string().optional(),
});
/** One route of `ip -j route show`. */
export type RouteEntry = z.infer<typeof RouteEntrySchema>;
