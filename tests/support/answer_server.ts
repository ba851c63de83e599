/**
 * A small server for the traffic tests (run by `traffic.ts` inside a namespace):
 * answers each TCP connection and each UDP datagram with one line, `<name> <peer
 * address>`, on every listener it is given, and exits after `seconds`. Sockets are
 * bound to `::` (both families; an IPv4 peer shows as `::ffff:a.b.c.d`) unless a
 * listener names an address; a UDP answer leaves from the source the kernel's route
 * prefers, as from a server bound to the wildcard address.
 *
 * Usage: `deno run --allow-net answer_server.ts '{"name":…,"seconds":…,"listen":[{"proto":"tcp","port":8080,"bind":"…"}]}'`.
 * Prints `ready` once every listener is bound.
 *
 * @module
 */
import * as z from "zod/mini";
import dgram from "node:dgram";

const ArgsSchema = z.object({
  name: z.string(),
  seconds: z.number(),
  listen: z.array(z.object({
    proto: z.enum(["tcp", "udp"]),
    port: z.number(),
    bind: z.optional(z.string()),
  })),
});

const args = ArgsSchema.parse(JSON.parse(Deno.args[0]));
const encoder = new TextEncoder();
const answer = (peer: string) => encoder.encode(`${args.name} ${peer}\n`);

for (const l of args.listen) {
  const hostname = l.bind ?? "::";
  if (l.proto === "tcp") {
    const listener = Deno.listen({ hostname, port: l.port });
    (async () => {
      for await (const conn of listener) {
        const peer = (conn.remoteAddr as Deno.NetAddr).hostname;
        conn.write(answer(peer)).catch(() => {}).finally(() => conn.close());
      }
    })();
  } else {
    const sock = dgram.createSocket({ type: hostname.includes(".") ? "udp4" : "udp6" });
    sock.on(
      "message",
      (_msg, rinfo) => sock.send(answer(rinfo.address), rinfo.port, rinfo.address),
    );
    await new Promise<void>((ok) => sock.bind(l.port, hostname, ok));
  }
}
console.log("ready");
setTimeout(() => Deno.exit(0), args.seconds * 1000);
