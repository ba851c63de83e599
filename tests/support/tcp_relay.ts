/**
 * A TCP relay on 127.0.0.1 in front of a server (the test API server, or the real
 * kube-apiserver as clients reach it), which a test can cut (every open connection closed,
 * as a network failure does), blackhole (open connections go silent, no FIN, no RST), take
 * down (connections refused) and bring back on the same port.
 *
 * @module
 */
import { type Gate, splice } from "./splice.ts";

/** A relay from its own port on 127.0.0.1 (or another loopback address) to `127.0.0.1:<backend>`. */
export class TcpRelay implements AsyncDisposable {
  /** The relay's port on {@linkcode TcpRelay.hostname}. */
  readonly port: number;
  /** The address it listens on (default 127.0.0.1). */
  readonly hostname: string;
  readonly #backend: number;
  #listener: Deno.TcpListener | null = null;
  #accepting: Promise<void> = Promise.resolve();
  readonly #conns = new Set<Deno.Conn>();
  readonly #pipes = new Set<Promise<void>>();
  readonly #gates = new Set<Gate>();

  private constructor(port: number, backend: number, hostname: string) {
    this.port = port;
    this.#backend = backend;
    this.hostname = hostname;
  }

  /** Listens on a free port of `hostname` (default 127.0.0.1) and relays to `backend`. */
  static start(backend: number, hostname = "127.0.0.1"): TcpRelay {
    const listener = Deno.listen({ hostname, port: 0 });
    const relay = new TcpRelay(listener.addr.port, backend, hostname);
    relay.#serve(listener);
    return relay;
  }

  /** Whether it accepts connections now. */
  get isUp(): boolean {
    return this.#listener !== null;
  }

  /** The connections open now (each relayed connection counts twice: both ends). */
  get open(): number {
    return this.#conns.size;
  }

  #serve(listener: Deno.TcpListener): void {
    this.#listener = listener;
    this.#accepting = (async () => {
      try {
        for await (const conn of listener) this.#relay(conn);
      } catch { /* the listener closed */ }
    })();
  }

  #relay(conn: Deno.TcpConn): void {
    // Without it each small write waits for the peer's delayed ACK (~40 ms a request).
    conn.setNoDelay(true);
    const gate: Gate = { dropping: false };
    this.#gates.add(gate);
    const pipe = splice(
      conn,
      async () => {
        const up = await Deno.connect({ hostname: "127.0.0.1", port: this.#backend });
        up.setNoDelay(true);
        return up;
      },
      this.#conns,
      gate,
    );
    this.#pipes.add(pipe);
    pipe.finally(() => {
      this.#pipes.delete(pipe);
      this.#gates.delete(gate);
    });
  }

  /**
   * Every relayed connection open now stops carrying bytes, both ways, and stays open
   * (no FIN, no RST); new connections are relayed as before. Returns how many went silent.
   */
  blackhole(): number {
    for (const g of this.#gates) g.dropping = true;
    return this.#gates.size;
  }

  /** Closes every relayed connection (both ends), as a network failure would. */
  async cut(): Promise<void> {
    for (const c of [...this.#conns]) {
      try {
        c.close();
      } catch { /* already closed */ }
    }
    this.#conns.clear();
    await Promise.all([...this.#pipes]);
  }

  /** Stops accepting (connections are refused) and cuts the open ones. */
  async down(): Promise<void> {
    this.#listener?.close();
    this.#listener = null;
    await this.#accepting;
    await this.cut();
  }

  /** Accepts again on the same port. */
  up(): void {
    if (this.#listener !== null) return;
    this.#serve(Deno.listen({ hostname: this.hostname, port: this.port }));
  }

  /** Stops for good. */
  close(): Promise<void> {
    return this.down();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
