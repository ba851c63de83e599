/**
 * UDP sinks that record every datagram's source address, and a sender that sends from
 * any address a namespace holds (`udp_tool.ts`, Deno): what a source-check test counts
 * at the receiver, black-box. Every process is bounded in time and stopped by its PID;
 * every address is one of the test's own namespaces.
 *
 * @module
 */
import type { NetnsHandle } from "./vpc.ts";

const IP = "/usr/sbin/ip";
const TOOL = new URL("./udp_tool.ts", import.meta.url).pathname;
/** The product's config (it has zod), as `traffic.ts` uses it. */
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;

function argv(ns: NetnsHandle, args: string[]): [string, string[]] {
  return [IP, [
    "netns",
    "exec",
    ns.name,
    Deno.execPath(),
    "run",
    "--quiet",
    `--config=${CONFIG}`,
    "--allow-net",
    TOOL,
    ...args,
  ]];
}

/** One datagram a sink received. */
export interface Arrival {
  /** The source address it came from (an IPv4 one without `::ffff:`). */
  peer: string;
  /** Its payload: `<tag>#<i>`. */
  payload: string;
}

/** A running sink: what it has received so far. */
export interface Sink {
  readonly arrivals: Arrival[];
  /** The arrivals whose payload's tag is `tag`. */
  tagged(tag: string): Arrival[];
}

/** Sinks started by a test, stopped (by their PIDs) on dispose. */
export class UdpSinks implements AsyncDisposable {
  readonly #children: Deno.ChildProcess[] = [];
  readonly #reading: Promise<void>[] = [];

  /**
   * A sink on UDP `port` (both families) in `ns`, living at most `seconds` (with `echo`,
   * sending each datagram back: the flow is then established); resolves once bound.
   */
  async start(ns: NetnsHandle, port: number, seconds = 300, echo = false): Promise<Sink> {
    const [cmd, args] = argv(ns, ["listen", JSON.stringify({ port, seconds, echo })]);
    const child = new Deno.Command(cmd, {
      args,
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#children.push(child);
    const arrivals: Arrival[] = [];
    const bound = Promise.withResolvers<void>();
    this.#reading.push((async () => {
      let text = "";
      let isReady = false;
      for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
        text += chunk;
        let nl;
        while ((nl = text.indexOf("\n")) >= 0) {
          const line = text.slice(0, nl).trim();
          text = text.slice(nl + 1);
          if (line === "ready") {
            isReady = true;
            bound.resolve();
            continue;
          }
          const sp = line.indexOf(" ");
          if (sp > 0) arrivals.push({ peer: line.slice(0, sp), payload: line.slice(sp + 1) });
        }
      }
      if (!isReady) {
        bound.reject(new Error(`The UDP sink on port ${port} in ${ns.name} did not start`));
      }
    })());
    await bound.promise;
    return {
      arrivals,
      tagged: (tag) => arrivals.filter((a) => a.payload.split("#")[0] === tag),
    };
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const c of this.#children) {
      try {
        c.kill("SIGTERM");
      } catch { /* exited already */ }
    }
    await Promise.all(this.#children.map((c) => c.status));
    await Promise.all(this.#reading.map((r) => r.catch(() => {})));
    this.#children.length = 0;
  }
}

/** One burst of {@linkcode sendUdp}: `count` datagrams from `bind` to `to:port`, tagged. */
export interface Burst {
  bind: string;
  to: string;
  port: number;
  count: number;
  tag: string;
  /** The source port (default: the kernel's choice). */
  sport?: number;
}

/** Sends the bursts from `ns`, in order, in one process; returns how many the kernel took. */
export async function sendUdp(ns: NetnsHandle, bursts: Burst[]): Promise<number> {
  const [cmd, args] = argv(ns, ["send", JSON.stringify(bursts)]);
  const out = await new Deno.Command(cmd, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  const m = /sent (\d+)/.exec(text);
  if (out.code !== 0 || !m) {
    throw new Error(
      `The UDP sender in ${ns.name} failed (exit ${out.code}): ${text}${
        new TextDecoder().decode(out.stderr)
      }`,
    );
  }
  return Number(m[1]);
}
