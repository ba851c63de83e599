/**
 * Measures the throughput of one bounded TCP transfer between two test
 * namespaces (`./throughput_main.ts` in each, through `ip netns exec`): what a
 * bandwidth test compares with a pod's limit. Only addresses inside the test
 * namespaces are used; every transfer is bounded in bytes and in seconds.
 *
 * The figure is the receiver's: payload bytes from its first byte to its last, so
 * process start-up is not in it. A shaper counts whole frames (Ethernet, IP and
 * TCP headers too), so payload through a 10 Mbit/s bucket reads about 4% under it.
 *
 * @module
 */
import { IP_BIN } from "../../netns/ip.ts";

const MAIN = new URL("./throughput_main.ts", import.meta.url).pathname;
const decoder = new TextDecoder();

/** One transfer: from the `from` namespace to `to`'s address. */
export interface TransferSpec {
  /** The sender's namespace (a name under /run/netns). */
  from: string;
  /** The receiver's namespace. */
  to: string;
  /** The receiver's address (it listens on it, the sender connects to it). */
  address: string;
  /** Bytes to send (default 5 MB: 4 s at 10 Mbit/s). */
  bytes?: number;
  /** The longest the transfer may run (default 12 s). */
  seconds?: number;
  /** TCP port (default 5201). */
  port?: number;
}

/** What the receiver saw. */
export interface TransferResult {
  bytes: number;
  seconds: number;
  /** Payload bits per second. */
  bitsPerSecond: number;
}

function argv(
  netns: string,
  role: "recv" | "send",
  s: Required<TransferSpec>,
): string[] {
  return [
    IP_BIN,
    "netns",
    "exec",
    netns,
    Deno.execPath(),
    "run",
    "--quiet",
    "--no-config",
    `--allow-net=${s.address.includes(":") ? `[${s.address}]` : s.address}:${s.port}`,
    MAIN,
    role,
    s.address,
    String(s.port),
    String(s.bytes),
    String(s.seconds),
  ];
}

/** Runs one transfer and returns the receiver's measure; throws when it did not complete. */
export async function measureTransfer(
  spec: TransferSpec,
): Promise<TransferResult> {
  const s: Required<TransferSpec> = {
    bytes: 5_000_000,
    seconds: 12,
    port: 5201,
    ...spec,
  };
  const [rcmd, ...rargs] = argv(s.to, "recv", s);
  const receiver = new Deno.Command(rcmd, {
    args: rargs,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  try {
    const [scmd, ...sargs] = argv(s.from, "send", s);
    const sender = await new Deno.Command(scmd, {
      args: sargs,
      stdin: "null",
      stderr: "piped",
    })
      .output();
    const received = await receiver.output();
    const text = decoder.decode(received.stdout).trim();
    if (!sender.success || !received.success) {
      throw new Error(
        `The transfer from ${s.from} to ${s.address} in ${s.to} failed: sender exit ${sender.code} ${
          decoder.decode(sender.stderr)
        }; receiver exit ${received.code} ${text} ${decoder.decode(received.stderr)}`,
      );
    }
    const r = JSON.parse(text) as { bytes: number; seconds: number };
    if (r.bytes < s.bytes || r.seconds <= 0) {
      throw new Error(`The transfer to ${s.address} ended early: ${text}`);
    }
    return { ...r, bitsPerSecond: r.bytes * 8 / r.seconds };
  } catch (err) {
    try {
      receiver.kill("SIGKILL");
      await receiver.output();
    } catch { /* it has ended already */ }
    throw err;
  }
}
