/**
 * A UDP sink and a UDP sender for the source-check tests (run by `udp_probe.ts` inside a
 * namespace), so a test can count what arrived and from which source address:
 *
 * - `listen '{"port":5353,"seconds":120}'`: a socket bound to `::` (both families; with
 *   `"echo":true` each datagram is sent back to its sender),
 *   printing `ready` once bound, then one line per datagram, `<peer address> <payload>`;
 *   exits after `seconds`.
 * - `send '[{"bind":"10.99.0.7","to":"172.30.0.20","port":53,"count":20,"tag":"x"}]'`:
 *   for each item in order, `count` datagrams from `bind` (port `sport`, else chosen by the kernel) to
 *   `to:port`, payload `<tag>#<i>`; prints `sent <n>` and exits. A send the kernel refuses
 *   is counted out, not fatal: what matters is what arrives.
 *
 * @module
 */
import * as z from "zod/mini";
import dgram from "node:dgram";

const ListenSchema = z.object({
  port: z.number(),
  seconds: z.number(),
  echo: z.optional(z.boolean()),
});
const SendSchema = z.array(z.object({
  bind: z.string(),
  to: z.string(),
  port: z.number(),
  count: z.number(),
  tag: z.string(),
  sport: z.optional(z.number()),
}));

const [mode, arg] = Deno.args;
if (mode === "listen") {
  const o = z.parse(ListenSchema, JSON.parse(arg));
  const sock = dgram.createSocket({ type: "udp6" });
  sock.on("message", (msg, rinfo) => {
    const peer = rinfo.address.replace(/^::ffff:/, "");
    console.log(`${peer} ${new TextDecoder().decode(msg).trim()}`);
    // An answer makes the flow one conntrack tracks as established (both directions seen).
    if (o.echo) sock.send(msg, rinfo.port, rinfo.address);
  });
  await new Promise<void>((ok) => sock.bind(o.port, "::", ok));
  console.log("ready");
  setTimeout(() => Deno.exit(0), o.seconds * 1000);
} else if (mode === "send") {
  let sent = 0;
  for (const item of z.parse(SendSchema, JSON.parse(arg))) {
    const sock = dgram.createSocket({ type: item.bind.includes(":") ? "udp6" : "udp4" });
    await new Promise<void>((ok) => sock.bind(item.sport ?? 0, item.bind, ok));
    for (let i = 0; i < item.count; i++) {
      const ok = await new Promise<boolean>((done) =>
        sock.send(`${item.tag}#${i}`, item.port, item.to, (err) => done(!err))
      );
      if (ok) sent++;
    }
    await new Promise<void>((done) => sock.close(() => done()));
  }
  console.log(`sent ${sent}`);
} else {
  console.error(`Unknown mode "${mode}": expected "listen" or "send"`);
  Deno.exit(2);
}
