/**
 * The client side of `answer_server.ts`, for where socat is not installed (the demo):
 * one TCP connection or one UDP datagram (sent up to 3 times, a second apart) to an
 * address, the answer line printed on stdout (nothing when none came in 4 s).
 *
 * Usage: `deno run --allow-net answer_client.ts tcp|udp ADDRESS PORT`.
 *
 * @module
 */
import dgram from "node:dgram";

const [proto, address, portText] = Deno.args;
const port = Number(portText);
const decoder = new TextDecoder();
const deadline = setTimeout(() => Deno.exit(1), 4000);

if (proto === "tcp") {
  const conn = await Deno.connect({ hostname: address, port });
  let text = "";
  for await (const chunk of conn.readable) text += decoder.decode(chunk);
  console.log(text.trim());
} else {
  const sock = dgram.createSocket(address.includes(":") ? "udp6" : "udp4");
  const answer = new Promise<string>((ok) => sock.on("message", (msg) => ok(decoder.decode(msg))));
  const send = () => sock.send("q\n", port, address);
  send();
  const retry = setInterval(send, 1000);
  console.log((await answer).trim());
  clearInterval(retry);
  sock.close();
}
clearTimeout(deadline);
