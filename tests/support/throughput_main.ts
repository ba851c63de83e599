/**
 * One bounded TCP transfer, run inside a test namespace by `./throughput.ts`
 * (`ip netns exec NS deno run --allow-net throughput_main.ts …`):
 *
 * - `recv ADDRESS PORT MAX_BYTES MAX_SECONDS`: accepts one connection, reads until
 *   the sender closes, MAX_BYTES arrived or MAX_SECONDS passed, and prints
 *   `{"bytes": N, "seconds": S}` (S from the first byte to the last);
 * - `send ADDRESS PORT BYTES MAX_SECONDS`: connects (retrying for 5 s while the
 *   receiver starts), writes BYTES or for MAX_SECONDS, whichever ends first, and
 *   closes.
 *
 * Both give up by themselves: the receiver MAX_SECONDS + 5 s after it started.
 *
 * @module
 */
const [mode, hostname, portText, bytesText, secondsText] = Deno.args;
const port = Number(portText),
  limit = Number(bytesText),
  limitMs = Number(secondsText) * 1000;
if (
  !["recv", "send"].includes(mode) ||
  ![port, limit, limitMs].every(Number.isFinite)
) {
  console.error("usage: recv|send ADDRESS PORT BYTES SECONDS");
  Deno.exit(2);
}

if (mode === "recv") {
  const listener = Deno.listen({ hostname, port, transport: "tcp" });
  const watchdog = setTimeout(() => {
    console.log(JSON.stringify({ error: "no transfer in time" }));
    Deno.exit(3);
  }, limitMs + 5000);
  const conn = await listener.accept();
  listener.close();
  const buf = new Uint8Array(256 * 1024);
  const started = performance.now();
  let bytes = 0, first = 0, last = 0;
  while (bytes < limit && performance.now() - started < limitMs) {
    const n = await conn.read(buf);
    if (n === null) break;
    last = performance.now();
    if (bytes === 0) first = last;
    bytes += n;
  }
  conn.close();
  clearTimeout(watchdog);
  console.log(JSON.stringify({ bytes, seconds: (last - first) / 1000 }));
} else {
  const deadline = performance.now() + 5000;
  let conn: Deno.TcpConn | undefined;
  while (!conn) {
    try {
      conn = await Deno.connect({ hostname, port });
    } catch (err) {
      if (performance.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  const chunk = new Uint8Array(64 * 1024);
  const started = performance.now();
  let sent = 0;
  try {
    while (sent < limit && performance.now() - started < limitMs) {
      sent += await conn.write(
        chunk.subarray(0, Math.min(chunk.length, limit - sent)),
      );
    }
  } catch {
    // The receiver stopped reading (its own limit): the transfer is over.
  }
  conn.close();
}
