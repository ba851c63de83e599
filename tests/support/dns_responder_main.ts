/**
 * A node's resolver for the tests, as a process of its own in a network namespace
 * ({@linkcode DnsResponder} starts it with `ip netns exec`): a UDP DNS responder
 * (tests/support/dns.ts) on `address`:53 answering the A records of `table`, and a client
 * that asks any server from the same namespace.
 *
 * - first stdout line `{"event":"listening","address":…}`;
 * - every query it gets: `{"event":"query","name":…,"qtype":…,"from":…}`;
 * - `ask <server> <name>` on stdin: an A query for `name` sent to `server`:53, answered by
 *   `{"event":"asked","server":…,"name":…,"answered":bool,"rcode":…,"addresses":[…],"error":…}`
 *   (no answer in 3 s, or a send that fails: `answered` false);
 * - stdin closed: it exits.
 *
 * @module
 */
import { z } from "zod";
import { answer, buildQuery, parseDnsMessage } from "./dns.ts";
import { awaitOrKill, spawnDenoInNetns } from "./command.ts";
import { ROOT } from "../../scripts/_paths.ts";

/** What the process serves. */
export const DnsResponderSettingsSchema = z.object({
  /** The address to listen on (UDP port 53). */
  address: z.ipv4(),
  /** Lower-case names (no final dot) → IPv4 addresses. */
  table: z.record(z.string(), z.ipv4()),
});
/** What the process serves. */
export type DnsResponderSettings = z.infer<typeof DnsResponderSettingsSchema>;

/** A query the responder got. */
export const DnsQueryEventSchema = z.object({
  event: z.literal("query"),
  name: z.string(),
  qtype: z.int(),
  from: z.string(),
});
/** A query the responder got. */
export type DnsQueryEvent = z.infer<typeof DnsQueryEventSchema>;

/** The outcome of `ask`. */
export const AskedEventSchema = z.object({
  event: z.literal("asked"),
  server: z.string(),
  name: z.string(),
  answered: z.boolean(),
  rcode: z.optional(z.int()),
  addresses: z.array(z.string()),
  error: z.optional(z.string()),
});
/** The outcome of `ask`. */
export type AskedEvent = z.infer<typeof AskedEventSchema>;

const EventSchema = z.looseObject({ event: z.string() });

async function ask(server: string, name: string): Promise<AskedEvent> {
  const sock = Deno.listenDatagram({ transport: "udp", hostname: "0.0.0.0", port: 0 });
  const id = Math.floor(Math.random() * 0xffff);
  const base = { event: "asked" as const, server, name, addresses: [] };
  try {
    await sock.send(buildQuery(id, name), { transport: "udp", hostname: server, port: 53 });
    const timer = new Promise<null>((r) => setTimeout(() => r(null), 3000));
    for (;;) {
      const got = await Promise.race([sock.receive(), timer]);
      if (got === null) return { ...base, answered: false, error: "no answer in 3 s" };
      const msg = parseDnsMessage(got[0]);
      if (msg.id !== id || !msg.qr) continue;
      return { ...base, answered: true, rcode: msg.rcode, addresses: msg.addresses };
    }
  } catch (err) {
    return { ...base, answered: false, error: String((err as Error)?.message ?? err) };
  } finally {
    sock.close();
  }
}

async function main(): Promise<void> {
  const settings = DnsResponderSettingsSchema.parse(JSON.parse(Deno.args[0]));
  const print = (e: Record<string, unknown>) => console.log(JSON.stringify(e));
  const server = Deno.listenDatagram({ transport: "udp", hostname: settings.address, port: 53 });
  print({ event: "listening", address: settings.address });
  (async () => {
    for await (const [data, from] of server) {
      const peer = from as Deno.NetAddr;
      let query;
      try {
        query = parseDnsMessage(data);
      } catch (err) {
        print({ event: "bad-query", error: String(err), from: `${peer.hostname}:${peer.port}` });
        continue;
      }
      if (query.qr) continue;
      print({
        event: "query",
        name: query.name,
        qtype: query.qtype,
        from: `${peer.hostname}:${peer.port}`,
      });
      await server.send(answer(query, settings.table), peer);
    }
  })().catch(() => {});
  for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
    for (const line of chunk.split("\n").filter(Boolean)) {
      const [verb, target, name] = line.trim().split(/\s+/);
      if (verb === "ask" && target && name) print(await ask(target, name));
    }
  }
  server.close();
  Deno.exit(0);
}

/** The responder process (see the module doc). */
export class DnsResponder implements AsyncDisposable {
  readonly #child: Deno.ChildProcess;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;
  readonly #events: Record<string, unknown>[] = [];
  readonly #done: Promise<unknown>;
  #wake: (() => void) | null = null;
  #stderr = "";
  #ended = false;
  #closed = false;

  private constructor(child: Deno.ChildProcess) {
    this.#child = child;
    this.#stdin = child.stdin.getWriter();
    const out = (async () => {
      let buffer = "";
      for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
        buffer += chunk;
        let nl: number;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + 1);
          const ev = EventSchema.safeParse(JSON.parse(line));
          if (ev.success) this.#events.push(ev.data);
          this.#wake?.();
        }
      }
      this.#ended = true;
      this.#wake?.();
    })();
    const err = (async () => {
      for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
        this.#stderr += chunk;
      }
    })();
    this.#done = Promise.all([out, err, child.status]);
  }

  /** Starts it in network namespace `netns` (a name under /run/netns); waits until it listens. */
  static async start(netns: string, settings: DnsResponderSettings): Promise<DnsResponder> {
    const child = spawnDenoInNetns(
      netns,
      `${ROOT}/tests/support/dns_responder_main.ts`,
      [JSON.stringify(DnsResponderSettingsSchema.parse(settings))],
      {},
      ["--unstable-net"],
    );
    const r = new DnsResponder(child);
    if (!(await r.#next((e) => e.event === "listening", 30_000))) {
      await r.close();
      throw new Error(`The DNS responder did not start in ${netns}: ${r.#stderr}`);
    }
    return r;
  }

  async #next(
    match: (e: Record<string, unknown>) => boolean,
    ms: number,
  ): Promise<Record<string, unknown> | null> {
    const deadline = Date.now() + ms;
    for (;;) {
      const i = this.#events.findIndex(match);
      if (i >= 0) return this.#events.splice(i, 1)[0];
      if (this.#ended || Date.now() > deadline) return null;
      await new Promise<void>((r) => {
        this.#wake = r;
        setTimeout(r, 200);
      });
    }
  }

  /** The queries it has answered so far (each once: later calls return the later ones too). */
  queries(): DnsQueryEvent[] {
    return this.#events.filter((e) => e.event === "query").map((e) => DnsQueryEventSchema.parse(e));
  }

  /** Asks `server`:53 for `name`'s A record from the responder's namespace. */
  async ask(server: string, name: string): Promise<AskedEvent> {
    await this.#stdin.write(new TextEncoder().encode(`ask ${server} ${name}\n`));
    const ev = await this.#next((e) => e.event === "asked" && e.name === name, 10_000);
    if (!ev) throw new Error(`The DNS responder did not report its question to ${server}`);
    return AskedEventSchema.parse(ev);
  }

  /** Closes its stdin (it exits); kills it by PID if it does not. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#stdin.close().catch(() => {});
    await awaitOrKill(this.#child, this.#done);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

if (import.meta.main) await main();
