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

/**
 * What a pod with `NET_RAW` can send its node over its host link to configure it (issue
 * 48 point 4), through raw sockets on the pod end (`python3 -c`; arguments: the pod end,
 * its MAC, the node's IPv4 address, the node end's link-local address): a router
 * advertisement to all nodes (hop limit 255, a default route for 1800 s, prefix
 * `2001:db8:48::/64` on-link and for SLAAC), an ND redirect to the node end (destination
 * `2001:db8:49::1` via the pod end's link-local address), and an ICMP host redirect to the
 * node's address (destination `198.51.100.7` via `198.51.100.1`, quoting a datagram of the
 * node's).
 */
const HOST_LINK_SENDER = `
import socket, struct, sys
dev, mac, node4, node_ll = sys.argv[1:5]
idx = socket.if_nametoindex(dev)
def csum(b):
    if len(b) % 2:
        b += b"\\0"
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xffff)
    t += t >> 16
    return ~t & 0xffff
s6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s6.setsockopt(socket.SOL_SOCKET, 25, dev.encode())
s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
lladdr = bytes.fromhex(mac.replace(":", ""))
ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0)
ra += struct.pack("!BB6s", 1, 1, lladdr)
ra += struct.pack("!BBBBIII16s", 3, 4, 64, 0xc0, 86400, 14400, 0,
                  socket.inet_pton(socket.AF_INET6, "2001:db8:48::"))
s6.sendto(ra, ("ff02::1", 0, 0, idx))
ll = None
for line in open("/proc/net/if_inet6"):
    f = line.split()
    if f[5] == dev and f[0].startswith("fe80"):
        ll = bytes.fromhex(f[0])
assert ll is not None, "no link-local address on " + dev
rd = struct.pack("!BBHI16s16s", 137, 0, 0, 0, ll,
                 socket.inet_pton(socket.AF_INET6, "2001:db8:49::1"))
rd += struct.pack("!BB6s", 2, 1, lladdr)
s6.sendto(rd, (node_ll, 0, 0, idx))
s4 = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s4.setsockopt(socket.SOL_SOCKET, 25, dev.encode())
inner = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 1, 0, 64, 17, 0,
                    socket.inet_aton(node4), socket.inet_aton("198.51.100.7"))
inner = inner[:10] + struct.pack("!H", csum(inner)) + inner[12:]
inner += struct.pack("!HHHH", 40000, 53, 8, 0)
icmp = struct.pack("!BBH4s", 5, 1, 0, socket.inet_aton("198.51.100.1")) + inner
icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
s4.sendto(icmp, (node4, 0))
print("sent 3")
`;

/** What the pod end sends its node to configure it ({@linkcode HOST_LINK_SENDER}'s doc). */
export interface HostLinkMessages {
  /** The pod end (`host0`). */
  dev: string;
  /** Its MAC (the advertisement's source link-layer option). */
  mac: string;
  /** The node's IPv4 address (the redirect's destination and the quoted datagram's source). */
  node4: string;
  /** The node end's link-local address (the ND redirect's destination). */
  nodeLinkLocal: string;
}

/** The argv that sends {@linkcode HostLinkMessages} (run it inside the pod's namespace). */
export function hostLinkMessagesArgv(m: HostLinkMessages): string[] {
  return [PYTHON, "-c", HOST_LINK_SENDER, m.dev, m.mac, m.node4, m.nodeLinkLocal];
}
