/**
 * A TCP relay on 127.0.0.1 in front of a real component (the API server, as clients reach
 * it), which a test can cut (every open connection closed, as a network failure does),
 * take down (connections refused) and bring back on the same port.
 *
 * @module
 */
import { splice } from "../splice.ts";

/** A relay from its own port to `127.0.0.1:<backend>`. */
export class TcpRelay implements AsyncDisposable {
  /** The relay's port on 127.0.0.1. */
  readonly port: number;
  readonly #backend: number;
  #listener: Deno.TcpListener | null = null;
  #accepting: Promise<void> = Promise.resolve();
  readonly #conns = new Set<Deno.Conn>();
  readonly #pipes = new Set<Promise<void>>();

  private constructor(port: number, backend: number) {
    this.port = port;
    this.#backend = backend;
  }

  /** Listens on a free port of 127.0.0.1 and relays to `backend`. */
  static start(backend: number): TcpRelay {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const relay = new TcpRelay(listener.addr.port, backend);
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
        for await (const conn of listener) {
          conn.setNoDelay(true);
          const pipe = splice(conn, async () => {
            const up = await Deno.connect({ hostname: "127.0.0.1", port: this.#backend });
            up.setNoDelay(true);
            return up;
          }, this.#conns);
          this.#pipes.add(pipe);
          pipe.finally(() => this.#pipes.delete(pipe));
        }
      } catch { /* the listener closed */ }
    })();
  }

  /** Closes every relayed connection, both ends. */
  async cut(): Promise<void> {
    for (const c of [...this.#conns]) {
      try {
        c.close();
      } catch { /* closed already */ }
    }
    this.#conns.clear();
    await Promise.all([...this.#pipes]);
  }

  /** Refuses connections from now on, and cuts the open ones. */
  async down(): Promise<void> {
    this.#listener?.close();
    this.#listener = null;
    await this.#accepting;
    await this.cut();
  }

  /** Accepts again, on the same port. */
  up(): void {
    if (this.#listener !== null) return;
    this.#serve(Deno.listen({ hostname: "127.0.0.1", port: this.port }));
  }

  /** Stops for good. */
  close(): Promise<void> {
    return this.down();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
