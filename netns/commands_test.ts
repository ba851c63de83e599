import { assertEquals } from "../lib/assert.ts";
import { altnameOf, pickDevice } from "./commands.ts";
import type { Link } from "./types.ts";

const link = (l: Partial<Link> & { ifname: string }): Link => ({
  ifindex: 1,
  flags: [],
  ...l,
});

Deno.test("pickDevice() finds by MAC, then by enim's alias, then by the pod name", () => {
  const mac = "02:e1:0a:00:00:01";
  const byMac = link({ ifname: "eth0", address: mac.toUpperCase() });
  assertEquals(pickDevice([byMac], mac, "en1")?.ifname, "eth0");
  // A chained plugin changed the MAC: the alias enim set still names it.
  const aliased = link({ ifname: "net1", address: "02:aa:00:00:00:01", ifalias: "en1" });
  assertEquals(pickDevice([aliased], mac, "en1")?.ifname, "net1");
  // MAC and alias both changed: the pod name, when given, with nothing marking another ENI.
  const bare = link({ ifname: "eth0", address: "02:aa:00:00:00:01" });
  assertEquals(pickDevice([bare], mac, "en1"), null);
  assertEquals(pickDevice([bare], mac, "en1", "eth0")?.ifname, "eth0");
  const ownAlt = link({ ifname: "eth0", address: "02:aa:00:00:00:01", altnames: [altnameOf(mac)] });
  assertEquals(pickDevice([ownAlt], mac, "en1", "eth0")?.ifname, "eth0");
});

Deno.test("pickDevice() never takes by name a device that carries another ENI's marks", () => {
  const mac = "02:e1:0a:00:00:01";
  // The newer container's eth0 in a namespace re-created at the same path (same inode).
  const other = "02:e1:0a:00:00:02";
  const theirs = link({ ifname: "eth0", address: other, ifalias: "en2" });
  assertEquals(pickDevice([theirs], mac, "en1", "eth0"), null);
  const theirsAlt = link({ ifname: "eth0", address: other, altnames: [altnameOf(other)] });
  assertEquals(pickDevice([theirsAlt], mac, "en1", "eth0"), null);
});
