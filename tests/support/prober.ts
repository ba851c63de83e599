/**
 * Reachability probes in bulk, for the NetworkPolicy tests: one long-lived process per
 * namespace (this module run inside it) that takes a batch of probes on stdin, runs
 * them all at once, and answers each: `open <answer line>` (a server of
 * `answer_server.ts` answered), `refused` (a TCP reset: the packet got through, nothing
 * listens) or `timeout` (nothing came back: dropped). A TCP probe is one connection; a
 * UDP probe one datagram from a source port no earlier probe used, sent again halfway
 * through its time.
 *
 * Protocol: a line `{"id":N,"timeoutMs":T,"probes":[{"proto":"tcp","addr":…,"port":…}]}`
 * in, a line `{"id":N,"results":[…]}` out, in the same order.
 *
 * {@linkcode Prober} drives one from the test.
 *
 * @module
 */
import dgram from "node:dgram";
import { awaitOrKill, spawnDenoInNetns, spawnDenoWith } from "./command.ts";

/** One probe: a TCP connection or a UDP datagram to `addr:port`. */
export interface Probe {
  proto: "tcp" | "udp";
  addr: string;
  port: number;
}

/** What a probe saw. */
export type ProbeResult = `open ${string}` | "refused" | "timeout";

/** Whether a probe's packets got through (an answer or a TCP reset). */
export const passed = (r: ProbeResult) => r !== "timeout";

const decoder = new TextDecoder();

async function tcp(p: Probe, ms: number): Promise<ProbeResult> {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), ms);
  let conn: Deno.TcpConn | null = null;
  try {
    conn = await Deno.connect({ hostname: p.addr, port: p.port, signal: abort.signal });
    let text = "";
    const reader = conn.readable.getReader();
    const stop = () => reader.cancel().catch(() => {});
    abort.signal.addEventListener("abort", stop, { once: true });
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value);
    }
    abort.signal.removeEventListener("abort", stop);
    return abort.signal.aborted && text === "" ? "timeout" : `open ${text.trim()}`;
  } catch (err) {
    return err instanceof Deno.errors.ConnectionRefused ? "refused" : "timeout";
  } finally {
    clearTimeout(timer);
    try {
      conn?.close();
    } catch { /* closed with its stream */ }
  }
}

/**
 * The next UDP source port: each probe of a prober gets its own (20000-59999, in turn), so
 * no probe ever reuses the 5-tuple of an earlier one, whose conntrack entry (an allowed
 * flow of an earlier policy) would pass it as a reply.
 */
let nextPort = 20000;
const sourcePort = () => {
  const p = nextPort;
  nextPort = nextPort >= 59999 ? 20000 : nextPort + 1;
  return p;
};

function udp(p: Probe, ms: number): Promise<ProbeResult> {
  return new Promise((resolve) => {
    const sock = dgram.createSocket(p.addr.includes(":") ? "udp6" : "udp4");
    let done = false;
    const finish = (r: ProbeResult) => {
      if (done) return;
      done = true;
      clearTimeout(again);
      clearTimeout(end);
      sock.close();
      resolve(r);
    };
    sock.on("message", (msg) => finish(`open ${decoder.decode(msg).trim()}`));
    sock.on("error", () => finish("timeout"));
    const send = () => {
      if (!done) sock.send("q\n", p.port, p.addr, () => {});
    };
    let again: ReturnType<typeof setTimeout> | undefined;
    const end = setTimeout(() => finish("timeout"), ms);
    sock.bind(sourcePort(), () => {
      send();
      again = setTimeout(send, ms / 2);
    });
  });
}

async function main(): Promise<void> {
  const lines = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const nl = buffer.indexOf("\n");
    if (nl < 0) {
      const { value, done } = await lines.read();
      if (done) return;
      buffer += value;
      continue;
    }
    const req = JSON.parse(buffer.slice(0, nl)) as {
      id: number;
      timeoutMs: number;
      probes: Probe[];
    };
    buffer = buffer.slice(nl + 1);
    const results = await Promise.all(
      req.probes.map((p) => p.proto === "tcp" ? tcp(p, req.timeoutMs) : udp(p, req.timeoutMs)),
    );
    console.log(JSON.stringify({ id: req.id, results }));
  }
}

if (import.meta.main) await main();

/** A prober process in a namespace, driven from the test. */
export class Prober implements AsyncDisposable {
  /** The namespace it probes from (a name under /run/netns). */
  readonly netns: string;
  readonly #child: Deno.ChildProcess;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #reader: ReadableStreamDefaultReader<string>;
  readonly #stderr: Promise<string>;
  #buffer = "";
  #id = 0;
  #busy: Promise<unknown> = Promise.resolve();

  private constructor(netns: string, enter?: string[]) {
    this.netns = netns;
    this.#child = enter
      ? spawnDenoWith(enter, import.meta.filename!, [])
      : spawnDenoInNetns(netns, import.meta.filename!, []);
    this.#writer = this.#child.stdin.getWriter();
    this.#reader = this.#child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    this.#stderr = new Response(this.#child.stderr).text();
  }

  /** Starts a prober in `netns` and waits until it answers. */
  static async start(netns: string): Promise<Prober> {
    const p = new Prober(netns);
    await p.probe([], 10);
    return p;
  }

  /**
   * Starts a prober under `enter` (an argv that runs its rest in the namespace, e.g.
   * `nsenter --net=/proc/<pid>/ns/net --`), named `label`; waits until it answers.
   */
  static async startWith(label: string, enter: string[]): Promise<Prober> {
    const p = new Prober(label, enter);
    await p.probe([], 10);
    return p;
  }

  /** Runs `probes` at once, each given `timeoutMs`; the results in their order. */
  probe(probes: Probe[], timeoutMs: number): Promise<ProbeResult[]> {
    const run = this.#busy.then(() => this.#probe(probes, timeoutMs));
    this.#busy = run.catch(() => {});
    return run;
  }

  async #probe(probes: Probe[], timeoutMs: number): Promise<ProbeResult[]> {
    const id = ++this.#id;
    await this.#writer.write(
      new TextEncoder().encode(JSON.stringify({ id, timeoutMs, probes }) + "\n"),
    );
    for (;;) {
      const nl = this.#buffer.indexOf("\n");
      if (nl >= 0) {
        const line = this.#buffer.slice(0, nl);
        this.#buffer = this.#buffer.slice(nl + 1);
        const res = JSON.parse(line) as { id: number; results: ProbeResult[] };
        if (res.id === id) return res.results;
        continue;
      }
      const { value, done } = await this.#reader.read();
      if (done) throw new Error(`The prober in ${this.netns} ended: ${await this.#stderr}`);
      this.#buffer += value;
    }
  }

  /** Ends it (stdin closed), killed by its PID if it lingers. */
  async close(): Promise<void> {
    await this.#writer.close().catch(() => {});
    const rest = (async () => {
      try {
        while (!(await this.#reader.read()).done) { /* drain */ }
      } catch { /* closed */ }
    })();
    await awaitOrKill(this.#child, Promise.all([rest, this.#stderr, this.#child.status]));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
