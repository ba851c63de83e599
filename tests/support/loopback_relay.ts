/**
 * A loopback relay between network namespaces, for tests with several simulated
 * nodes: each node's agent reaches the one fake BCE server at 127.0.0.1 of its
 * own namespace, as it would reach the cloud's endpoint, without any address or
 * route added to the node.
 *
 * A unix socket is a file, so it connects across network namespaces: the fake
 * listens on one (besides its TCP port), and this process, started inside a
 * node's namespace (`ip netns exec <node> deno run … loopback_relay.ts <path>`),
 * listens on 127.0.0.1 there and copies each connection to that socket, both
 * ways. It prints `{"event":"listening","port":N}` first and exits when its
 * stdin closes.
 *
 * @module
 */
import { awaitOrKill, spawnDenoInNetns } from "./command.ts";
import { splice } from "./splice.ts";

async function main(): Promise<void> {
  const path = Deno.args[0];
  const listener = Deno.listen({ hostname: Deno.args[1] ?? "127.0.0.1", port: 0 });
  console.log(JSON.stringify({ event: "listening", port: (listener.addr as Deno.NetAddr).port }));
  const conns = new Set<Deno.Conn>();
  const serve = (async () => {
    for await (const conn of listener) {
      splice(conn, () => Deno.connect({ transport: "unix", path }), conns);
    }
  })();
  // EOF on stdin ends the relay.
  for await (const _ of Deno.stdin.readable) { /* nothing to read */ }
  listener.close();
  for (const c of conns) {
    try {
      c.close();
    } catch { /* closed already */ }
  }
  await serve.catch(() => {});
}

if (import.meta.main) await main();

/** A relay process inside a node namespace, driven from the test. */
export class LoopbackRelay implements AsyncDisposable {
  /** The port the relay listens on, at 127.0.0.1 of the node's namespace. */
  readonly port: number;
  readonly #child: Deno.ChildProcess;
  readonly #done: Promise<unknown>;

  private constructor(child: Deno.ChildProcess, port: number, done: Promise<unknown>) {
    this.#child = child;
    this.port = port;
    this.#done = done;
  }

  /**
   * Starts a relay in `netns` (a name under /run/netns) to the unix socket `socket`,
   * listening on `hostname` there (default 127.0.0.1).
   */
  static async start(netns: string, socket: string, hostname?: string): Promise<LoopbackRelay> {
    const child = spawnDenoInNetns(
      netns,
      import.meta.filename!,
      hostname ? [socket, hostname] : [socket],
    );
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let port: number | null = null;
    while (port === null) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      const nl = buffer.indexOf("\n");
      if (nl >= 0) port = Number(JSON.parse(buffer.slice(0, nl)).port);
    }
    const rest = (async () => {
      try {
        while (!(await reader.read()).done) { /* drain */ }
      } catch { /* closed */ }
    })();
    const stderr = new Response(child.stderr).text();
    const done = Promise.all([rest, stderr, child.status]);
    if (port === null) {
      child.stdin.close();
      await done;
      throw new Error(`The loopback relay did not start: ${await stderr}`);
    }
    return new LoopbackRelay(child, port, done);
  }

  /** Closes its stdin (it exits); kills it by PID if it does not. */
  async close(): Promise<void> {
    await this.#child.stdin.close().catch(() => {});
    await awaitOrKill(this.#child, this.#done);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
