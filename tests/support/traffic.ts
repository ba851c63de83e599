/**
 * Small TCP and UDP servers and clients in the simulated namespaces (issue 27), so
 * a test proves more than ping: servers are `answer_server.ts` (Deno), clients socat
 * (Debian's `socat`); every process bounded in time, every address one of the test's
 * own namespaces.
 *
 * A server answers each connection or datagram with one line: its name and the peer
 * address it saw, so a test tells which backend answered and whether the client's
 * address reached it. A UDP server is bound to the wildcard address: its answer leaves
 * from the source the kernel's route prefers.
 *
 * @module
 */
import { type AptNeed, aptNeeds, lazyTool } from "../../scripts/_deps.ts";
import { normalizeIp } from "../../lib/ip.ts";
import type { NetnsHandle } from "./vpc.ts";

/** What the traffic helpers need from Debian (scripts/_deps.ts). */
export const TRAFFIC_NEEDS: AptNeed[] = aptNeeds("socat", "coreutils");

const socat = lazyTool("/usr/bin/socat");
const TIMEOUT = "/usr/bin/timeout";
const IP = "/usr/sbin/ip";
const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** A transport and family. */
export type Proto = "tcp" | "udp";

function family(addr: string): 4 | 6 {
  return addr.includes(":") ? 6 : 4;
}

function bracket(addr: string): string {
  return addr.includes(":") ? `[${addr}]` : addr;
}

/**
 * Where a server or client runs: a namespace of the simulated VPC (`ip netns exec`), or
 * any command prefix that enters one (a containerd pod's namespace is seen only inside
 * the node's sandbox: `node.sandbox.wrap([nsenter, --net=PATH])`).
 */
export type Where = NetnsHandle | { label: string; argv: string[] };

function enter(w: Where): string[] {
  return "argv" in w ? w.argv : [IP, "netns", "exec", w.name];
}

function label(w: Where): string {
  return "argv" in w ? w.label : w.name;
}

/** What one server listens on. */
export interface Listener {
  proto: Proto;
  port: number;
  /** An address to bind (default `::`, both families). */
  bind?: string;
}

const SERVER = new URL("./answer_server.ts", import.meta.url).pathname;
/**
 * The product's config (root deno.json): the server needs only zod, and the demo, which runs
 * these servers, has installed the product's lockfile before it enters any namespace. The
 * tests' config would install its whole lockfile (fast-check, yaml, …) inside a namespace that
 * has no route to the registry: the demo on a fresh machine failed that way.
 */
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;

/** Servers started by a test, stopped (by their PIDs) on dispose. */
export class Servers implements AsyncDisposable {
  readonly #children: Deno.ChildProcess[] = [];

  /**
   * Starts a server in `ns` (`answer_server.ts`) answering `<name> <peer address>` on
   * every listener, living at most `seconds`; resolves once it is listening.
   */
  async start(ns: Where, name: string, listen: Listener[], seconds = 300): Promise<void> {
    const [cmd, ...pre] = enter(ns);
    const child = new Deno.Command(cmd, {
      args: [
        ...pre,
        Deno.execPath(),
        "run",
        "--quiet",
        `--config=${CONFIG}`,
        "--allow-net",
        SERVER,
        JSON.stringify({ name, seconds, listen }),
      ],
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#children.push(child);
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while (!text.includes("ready\n")) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`The server "${name}" in ${label(ns)} did not start`);
      text += value;
    }
    reader.releaseLock();
    // Nothing more is read: let its stdout drain to nowhere.
    child.stdout.pipeTo(new WritableStream()).catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const c of this.#children) {
      try {
        c.kill("SIGTERM");
      } catch { /* exited already */ }
    }
    await Promise.all(this.#children.map((c) => c.status));
    this.#children.length = 0;
  }
}

/** Options of {@linkcode ask}. */
export interface AskOptions {
  /**
   * The client's source port (socat's `sourceport`, with `reuseaddr`: a port an earlier
   * ask used may be taken again at once); default: one the kernel picks.
   */
  sourcePort?: number;
}

/**
 * Asks `addr:port` from `ns` over `proto` and returns the answer line ("" when none
 * came): a TCP connection (tried twice), or a UDP datagram (sent up to 3 times) — a
 * datapath that is wrong fails every try; a loaded machine may lose a first packet.
 */
export async function ask(
  ns: Where,
  proto: Proto,
  addr: string,
  port: number,
  opts: AskOptions = {},
): Promise<string> {
  const fam = family(addr);
  const source = opts.sourcePort === undefined ? "" : `,sourceport=${opts.sourcePort},reuseaddr`;
  const target = `${proto.toUpperCase()}${fam}:${bracket(addr)}:${port}${source}`;
  const [cmd, ...pre] = enter(ns);
  for (let attempt = 0; attempt < (proto === "udp" ? 3 : 2); attempt++) {
    const child = new Deno.Command(cmd, {
      args: [
        ...pre,
        TIMEOUT,
        "4",
        socat(),
        "-T2",
        "-",
        target,
      ],
      clearEnv: true,
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const w = child.stdin.getWriter();
    await w.write(encoder.encode(proto === "udp" ? "q\n" : ""));
    await w.close();
    const out = await child.output();
    const line = decoder.decode(out.stdout).trim();
    if (line !== "") return line;
    lastError = `${target} from ${label(ns)}: exit ${out.code} ${
      decoder.decode(out.stderr).trim()
    }`;
  }
  return "";
}

const CLIENT = new URL("./answer_client.ts", import.meta.url).pathname;

/**
 * {@linkcode ask} without socat (`answer_client.ts`, Deno; slower to start): for the
 * demo, which installs nothing new.
 */
export async function askWithDeno(
  ns: Where,
  proto: Proto,
  addr: string,
  port: number,
): Promise<string> {
  const [cmd, ...pre] = enter(ns);
  const out = await new Deno.Command(cmd, {
    args: [
      ...pre,
      Deno.execPath(),
      "run",
      "--quiet",
      "--no-config",
      "--no-lock",
      "--allow-net",
      CLIENT,
      proto,
      addr,
      String(port),
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const line = decoder.decode(out.stdout).trim();
  if (line === "") lastError = `${proto} ${addr}:${port} from ${label(ns)}: exit ${out.code}`;
  return line;
}

/** Why the last {@linkcode ask} got no answer (socat's words), for a test's failure message. */
export let lastError = "";

/**
 * An answer line as `"<name> <peer>"` with the peer address canonical (an IPv4 peer
 * of a dual-stack socket shows as `::ffff:a.b.c.d`), or "" when there was none.
 */
export function who(line: string): string {
  const m = /^(\S+) (?:::ffff:)?([0-9a-fA-F:.]+)$/.exec(line.trim());
  return m ? `${m[1]} ${normalizeIp(m[2])}` : line.trim();
}
