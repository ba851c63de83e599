/**
 * The rollout test's client outside the node (tests/k8s_rollout_test.ts): run in the
 * simulated VPC's namespace (`nsenter --net=…`), it sends HTTP/1.0 GETs round-robin to its
 * `http` targets (the pods by their ENIs' addresses, and the Service's NodePort on the
 * node), and holds one TCP connection open to each of its `hold` targets (an echo server
 * in each pod, and through the NodePort), writing a line to each every second and reading
 * it back. A request that fails or is not answered `200`, and a held connection that
 * breaks (an error, end of stream, a line not echoed within the timeout), is printed at
 * once as a JSON line on stdout; when stdin closes it prints its totals and exits.
 *
 * Usage: `deno run --allow-net rollout_client.ts '<JSON of ClientArgs>'`
 *
 * @module
 */
import { z } from "zod";

export const ClientArgsSchema = z.object({
  http: z.array(z.string()).check(z.minLength(1)),
  hold: z.array(z.string()),
  /** Requests in flight at once. */
  concurrency: z.number().check(z.int(), z.positive()),
  /** The pause after each request of one worker (ms). */
  pauseMs: z.number().check(z.nonnegative()),
  timeoutMs: z.number().check(z.positive()),
});
export type ClientArgs = z.infer<typeof ClientArgsSchema>;

export const ClientLineSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("ready"), held: z.number() }),
  z.object({ kind: z.literal("fail"), at: z.number(), target: z.string(), error: z.string() }),
  z.object({ kind: z.literal("broken"), at: z.number(), target: z.string(), error: z.string() }),
  z.object({
    kind: z.literal("summary"),
    sent: z.number(),
    ok: z.number(),
    failed: z.number(),
    held: z.number(),
    broken: z.number(),
    echoes: z.number(),
    /** Requests sent to each target. */
    perTarget: z.record(z.string(), z.number()),
  }),
]);
export type ClientLine = z.infer<typeof ClientLineSchema>;

function hostPort(t: string): { hostname: string; port: number } {
  const i = t.lastIndexOf(":");
  return { hostname: t.slice(0, i), port: Number(t.slice(i + 1)) };
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    p,
    new Promise<T>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

async function readAll(conn: Deno.Conn): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  const buf = new Uint8Array(4096);
  for (;;) {
    const n = await conn.read(buf);
    if (n === null) break;
    chunks.push(buf.slice(0, n));
  }
  const out = new Uint8Array(chunks.reduce((a, c) => a + c.length, 0));
  let o = 0;
  for (const c of chunks) {
    out.set(c, o);
    o += c.length;
  }
  return out;
}

async function get(target: string, timeoutMs: number): Promise<void> {
  const conn = await withTimeout(Deno.connect(hostPort(target)), timeoutMs, "connect");
  try {
    await conn.write(new TextEncoder().encode("GET / HTTP/1.0\r\n\r\n"));
    const body = new TextDecoder().decode(await withTimeout(readAll(conn), timeoutMs, "read"));
    if (!/^HTTP\/1\.[01] 200/.test(body)) {
      throw new Error(`answered ${JSON.stringify(body.slice(0, 60))}`);
    }
  } finally {
    try {
      conn.close();
    } catch { /* closed */ }
  }
}

if (import.meta.main) {
  const args = ClientArgsSchema.parse(JSON.parse(Deno.args[0]));
  const emit = (l: ClientLine) => console.log(JSON.stringify(l));
  const message = (e: unknown) => e instanceof Error ? e.message : String(e);
  let stop = false;
  let sent = 0, ok = 0, failed = 0, broken = 0, echoes = 0;
  const perTarget: Record<string, number> = {};
  let next = 0;

  // The held connections, each with a reader that checks the echo of every line.
  const held: { target: string; conn: Deno.Conn; alive: boolean }[] = [];
  for (const target of args.hold) {
    const conn = await withTimeout(Deno.connect(hostPort(target)), args.timeoutMs, "connect");
    held.push({ target, conn, alive: true });
  }
  emit({ kind: "ready", held: held.length });
  const holders = held.map(async (h) => {
    const enc = new TextEncoder();
    const dec = new TextDecoder();
    const buf = new Uint8Array(256);
    for (let i = 0; !stop; i++) {
      const line = `${i}\n`;
      try {
        await withTimeout(h.conn.write(enc.encode(line)), args.timeoutMs, "write");
        let got = "";
        while (got.length < line.length) {
          const n = await withTimeout(h.conn.read(buf), args.timeoutMs, "echo");
          if (n === null) throw new Error("closed by the other end");
          got += dec.decode(buf.subarray(0, n));
        }
        if (got !== line) throw new Error(`echoed ${JSON.stringify(got)} for ${i}`);
        echoes++;
      } catch (err) {
        broken++;
        h.alive = false;
        emit({ kind: "broken", at: Date.now(), target: h.target, error: message(err) });
        return;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  });
  const workers = Array.from({ length: args.concurrency }, async () => {
    while (!stop) {
      const target = args.http[next++ % args.http.length];
      sent++;
      perTarget[target] = (perTarget[target] ?? 0) + 1;
      try {
        await get(target, args.timeoutMs);
        ok++;
      } catch (err) {
        failed++;
        emit({ kind: "fail", at: Date.now(), target, error: message(err) });
      }
      if (args.pauseMs > 0) await new Promise((r) => setTimeout(r, args.pauseMs));
    }
  });
  // Until stdin closes.
  const sink = new Uint8Array(64);
  while ((await Deno.stdin.read(sink)) !== null) { /* nothing to read */ }
  stop = true;
  await Promise.all([...workers, ...holders]);
  for (const h of held) {
    try {
      h.conn.close();
    } catch { /* closed */ }
  }
  emit({
    kind: "summary",
    sent,
    ok,
    failed,
    held: held.length,
    broken,
    echoes,
    perTarget,
  });
}
