/**
 * `IpDeviceLayer.flushConntrack` on the real kernel: the connections tracked in a
 * namespace for the addresses asked go, in either direction and family, and nothing else;
 * with `listedOnly` the same outcome, reading the namespace's `/proc/net/nf_conntrack`
 * first (IPv6 listed there in full), and an address that is a prefix of a tracked one
 * (10.250.0.1 against 10.250.0.12) takes nothing.
 */
import { assertEquals } from "../lib/assert.ts";
import { IpDeviceLayer } from "./mod.ts";
import { createNetns, deleteNetns, uniqueName } from "./sim.ts";
import { lazyTool } from "../scripts/_deps.ts";

const root = Deno.uid() === 0;
const CONNTRACK = lazyTool("/usr/sbin/conntrack");

async function inNs(ns: string, argv: string[]): Promise<{ code: number; out: string }> {
  const o = await new Deno.Command("/usr/sbin/ip", {
    args: ["netns", "exec", ns, ...argv],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: o.code, out: dec.decode(o.stdout) + dec.decode(o.stderr) };
}

/** A tracked UDP flow `src:1000 → dst:53` and its reply, put straight into the table. */
async function track(ns: string, src: string, dst: string): Promise<void> {
  const r = await inNs(ns, [
    CONNTRACK(),
    "-I",
    "-s",
    src,
    "-d",
    dst,
    "-r",
    dst,
    "-q",
    src,
    "-p",
    "udp",
    "--sport",
    "1000",
    "--dport",
    "53",
    "--reply-port-src",
    "53",
    "--reply-port-dst",
    "1000",
    "-t",
    "120",
  ]);
  assertEquals(r.code, 0, r.out);
}

/** The tracked flows' original sources and destinations, sorted. */
async function tracked(ns: string): Promise<string[]> {
  const out: string[] = [];
  for (const fam of ["ipv4", "ipv6"]) {
    const r = await inNs(ns, [CONNTRACK(), "-L", "-f", fam, "-o", "extended"]);
    for (const m of r.out.matchAll(/src=(\S+) dst=(\S+) sport=1000/g)) {
      out.push(`${m[1]} ${m[2]}`);
    }
  }
  return out.sort();
}

for (const listedOnly of [false, true]) {
  Deno.test({
    name: `flushConntrack${
      listedOnly ? " (listedOnly)" : ""
    }: the asked addresses' flows go, from and to them, IPv4 and IPv6; the others stay`,
    ignore: !root,
    async fn() {
      const ns = uniqueName("enim-ct");
      await createNetns(ns);
      try {
        // A rule that uses conntrack, so that the namespace tracks (and lists) flows.
        const nft = await inNs(ns, [
          "/usr/sbin/nft",
          "add table inet t; add chain inet t c { type filter hook input priority 0; }; add rule inet t c ct state new accept",
        ]);
        assertEquals(nft.code, 0, nft.out);
        await track(ns, "10.250.0.1", "10.250.0.9");
        await track(ns, "10.250.0.8", "10.250.0.1");
        await track(ns, "10.250.0.12", "10.250.0.9");
        await track(ns, "fd00:250::1", "fd00:250::9");
        await track(ns, "fd00:250::7", "fd00:250::9");
        const devices = new IpDeviceLayer({ node: ns });
        // Nothing tracked for 10.250.0.99: with listedOnly no conntrack runs for it.
        await devices.flushConntrack(`/run/netns/${ns}`, [
          "10.250.0.1",
          "fd00:250:0::1",
          "10.250.0.99",
        ], {
          listedOnly,
        });
        assertEquals(await tracked(ns), [
          "10.250.0.12 10.250.0.9",
          "fd00:250::7 fd00:250::9",
        ]);
        await devices.flushConntrack(null, ["10.250.0.12"], { listedOnly });
        assertEquals(await tracked(ns), ["fd00:250::7 fd00:250::9"]);
      } finally {
        await deleteNetns(ns);
      }
    },
  });
}
