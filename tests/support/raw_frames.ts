/**
 * Frames sent past the IP stack (issue 48): an `AF_PACKET` socket on a device of a
 * namespace, what a pod holding `CAP_NET_RAW` can open, writing whole Ethernet frames (an
 * IPv4 UDP datagram to a given MAC and address), with or without `PACKET_QDISC_BYPASS`
 * (straight to the driver, past the queueing disciplines). Deno has no packet sockets:
 * Debian's `python3` (python3-minimal, declared in scripts/_deps.ts) sends them, with
 * `socket` and `struct` only.
 *
 * @module
 */
import { type AptNeed, aptNeeds } from "../../scripts/_deps.ts";

/** What the sender needs installed. */
export const RAW_FRAMES_NEEDS: AptNeed[] = aptNeeds("python3-minimal");

/** The sender, `python3 -c` (arguments: device, MAC, source, destination, port, count, bypass). */
const SENDER = `
import socket, struct, sys
dev, mac, src, dst, port, count, bypass = sys.argv[1:8]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
if bypass == "1":
    s.setsockopt(263, 20, struct.pack("i", 1))  # SOL_PACKET, PACKET_QDISC_BYPASS
s.bind((dev, 0))
payload = b"enim-raw-frame"
udp = struct.pack("!HHHH", 40000, int(port), 8 + len(payload), 0) + payload
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xffff)
    t += t >> 16
    return ~t & 0xffff
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                 socket.inet_aton(src), socket.inet_aton(dst))
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
frame = bytes.fromhex(mac.replace(":", "")) + s.getsockname()[4] + b"\\x08\\x00" + ip + udp
sent = refused = 0
for _ in range(int(count)):
    try:
        s.send(frame)
        sent += 1
    except OSError:
        refused += 1
print("sent %d refused %d" % (sent, refused))
`;

/** The python interpreter the sender runs on. */
export const PYTHON = "/usr/bin/python3";

/** What to send: `count` UDP datagrams from `src` to `dst:port`, framed to `mac`. */
export interface RawUdp {
  /** The device the packet socket writes to (the pod's ENI: `eth0`). */
  dev: string;
  /** The destination MAC (the peer's ENI). */
  mac: string;
  src: string;
  dst: string;
  port: number;
  count: number;
  /** Set `PACKET_QDISC_BYPASS` on the socket. */
  bypass: boolean;
}

/** The argv that sends {@linkcode RawUdp} (run it inside the sender's namespace). */
export function rawUdpArgv(r: RawUdp): string[] {
  return [
    PYTHON,
    "-c",
    SENDER,
    r.dev,
    r.mac,
    r.src,
    r.dst,
    String(r.port),
    String(r.count),
    r.bypass ? "1" : "0",
  ];
}

/** The sender's report: frames the kernel took, and those it refused (ENOBUFS: dropped at the hook). */
export function parseRawReport(stdout: string): { sent: number; refused: number } {
  const m = /sent (\d+) refused (\d+)/.exec(stdout);
  if (!m) throw new Error(`Unexpected output of the raw-frame sender: "${stdout.trim()}"`);
  return { sent: Number(m[1]), refused: Number(m[2]) };
}
