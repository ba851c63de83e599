import { assert, assertEquals } from "../lib/assert.ts";
import { Logger } from "../lib/log.ts";
import type {
  AddressEvent,
  AddressWatch,
  HostLinkNodeSide,
  HostLinkNodeState,
  NodeAddresses,
} from "../netns/types.ts";
import { parseAddressEvent } from "../netns/commands.ts";
import { KeyedMutex } from "./mutex.ts";
import { linkMacs } from "./host_link.ts";
import {
  type KeeperContext,
  NodeRouteKeeper,
  nodeSidesToRepair,
  wantedNodeSides,
} from "./node_routes.ts";
import type { AttachmentRow } from "./state.ts";

const PRIMARY = { ipv4: "10.99.0.250", ipv6: "fd00:99::fa" };

/** A row of an attachment with a host link `enimh<n>` and the pod addresses given. */
function row(
  n: number,
  ips: string[],
  state: AttachmentRow["state"] = "ready",
): AttachmentRow {
  const k = { containerId: `c${n}`, ifName: "eth0" };
  return {
    ...k,
    pod: `default/p${n}`,
    podUid: null,
    network: "enim-test",
    netns: `/run/netns/p${n}`,
    netnsDev: null,
    netnsIno: null,
    mode: "interface",
    state,
    eniId: `eni-${n}`,
    mac: `02:00:00:00:00:0${n}`,
    nodeName: `en${n}`,
    ifindex: 2,
    result: JSON.stringify({
      eniId: `eni-${n}`,
      mac: `02:00:00:00:00:0${n}`,
      ifindex: 2,
      nodeName: `en${n}`,
      ips: ips.map((a) => ({ address: a, gateway: a.includes(":") ? "fd00:99::1" : "10.99.0.1" })),
      routes: [],
    }),
    recycleSince: null,
    gcFailures: 0,
    lastError: null,
    createdAt: 0,
    updatedAt: 0,
    profile: "default",
    sticky: false,
    holdUntil: null,
    parkUntil: null,
    hostLink: JSON.stringify({ nodeIfName: `enimh${n}`, podIfName: "host0", serviceCidrs: [] }),
  };
}

/** The kernel's node side when every route and neighbour of `rows` is in place. */
function whole(rows: AttachmentRow[]): HostLinkNodeState {
  const sides = wantedNodeSides(rows, PRIMARY);
  return {
    nodeEnds: sides.map((s) => s.side.nodeIfName),
    routes: sides.flatMap(({ side }) =>
      Object.entries(side.podAddresses).map(([fam, a]) => ({
        dst: a!.includes(":") ? a! : `${a}/32`,
        dev: side.nodeIfName,
        prefsrc: side.nodeSource[fam as "ipv4" | "ipv6"],
      }))
    ),
    neighbours: sides.flatMap(({ side }) =>
      Object.values(side.podAddresses).map((a) => ({
        dst: a!,
        dev: side.nodeIfName,
        lladdr: side.podMac,
      }))
    ),
  };
}

Deno.test("wantedNodeSides() takes ready and recycling attachments with a host link, their addresses and the node's primary as source", () => {
  const rows = [
    row(1, ["10.99.0.2/24", "fd00:99:0:0::2/64"]),
    row(2, ["10.99.0.3/24"], "recycling"),
    row(3, ["10.99.0.4/24"], "adding"),
    row(4, ["10.99.0.5/24"], "held"),
    { ...row(5, ["10.99.0.6/24"]), hostLink: null },
  ];
  const sides = wantedNodeSides(rows, PRIMARY);
  assertEquals(sides.map((s) => s.key), ["c1/eth0", "c2/eth0"]);
  assertEquals(sides[0].side, {
    nodeIfName: "enimh1",
    podMac: linkMacs({ containerId: "c1", ifName: "eth0" }).podMac,
    podAddresses: { ipv4: "10.99.0.2", ipv6: "fd00:99::2" },
    nodeSource: PRIMARY,
  });
});

Deno.test("nodeSidesToRepair() finds what the kernel dropped or changed, and only that", async (t) => {
  const rows = [row(1, ["10.99.0.2/24", "fd00:99::2/64"]), row(2, ["10.99.0.3/24"])];
  const wanted = wantedNodeSides(rows, PRIMARY);
  const keys = (live: HostLinkNodeState) => nodeSidesToRepair(wanted, live).map((w) => w.key);
  await t.step("all in place: nothing", () => assertEquals(keys(whole(rows)), []));
  await t.step("the IPv4 route flushed with the address", () => {
    const live = whole(rows);
    live.routes = live.routes.filter((r) => r.dst !== "10.99.0.2/32");
    assertEquals(keys(live), ["c1/eth0"]);
  });
  await t.step("the IPv6 route left without its source", () => {
    const live = whole(rows);
    live.routes = live.routes.map((r) => r.dst.includes(":") ? { dst: r.dst, dev: r.dev } : r);
    assertEquals(keys(live), ["c1/eth0"]);
  });
  await t.step("a route from an older source address", () => {
    const live = whole(rows);
    live.routes = live.routes.map((r) =>
      r.dst === "10.99.0.3/32" ? { ...r, prefsrc: "10.99.0.249" } : r
    );
    assertEquals(keys(live), ["c2/eth0"]);
  });
  await t.step("a neighbour gone, or at another MAC", () => {
    const live = whole(rows);
    live.neighbours = live.neighbours.filter((n) => n.dst !== "10.99.0.3");
    assertEquals(keys(live), ["c2/eth0"]);
    const other = whole(rows);
    other.neighbours = other.neighbours.map((n) =>
      n.dst === "fd00:99::2" ? { ...n, lladdr: "0a:00:00:00:00:99" } : n
    );
    assertEquals(keys(other), ["c1/eth0"]);
  });
  await t.step("a node end that is gone is not repaired here", () => {
    const live = whole(rows);
    live.nodeEnds = ["enimh2"];
    live.routes = live.routes.filter((r) => r.dev !== "enimh1");
    assertEquals(keys(live), []);
  });
  await t.step("a node without an address of a family: any source will do", () => {
    const none = wantedNodeSides(rows, { ipv6: PRIMARY.ipv6 });
    const live = whole(rows);
    live.routes = live.routes.map((r) => r.dst.includes(":") ? r : { dst: r.dst, dev: r.dev });
    assertEquals(nodeSidesToRepair(none, live), []);
  });
});

Deno.test("parseAddressEvent() reads ip -o monitor address lines", () => {
  assertEquals(
    parseAddressEvent(
      "2: eth0    inet 10.99.0.250/24 brd 10.99.0.255 scope global eth0\\       valid_lft forever preferred_lft forever",
    ),
    { deleted: false, ifName: "eth0", family: 4, address: "10.99.0.250", scope: "global" },
  );
  assertEquals(
    parseAddressEvent(
      "Deleted 2: eth0    inet6 fd00:99:0::fa/64 scope global nodad \\       valid_lft forever preferred_lft forever",
    ),
    { deleted: true, ifName: "eth0", family: 6, address: "fd00:99::fa", scope: "global" },
  );
  assertEquals(
    parseAddressEvent(
      "4: enimh0    inet6 fe80::b0e6:d9ff:fe66:d173/64 scope link \\       valid_lft forever",
    )?.scope,
    "link",
  );
  assertEquals(parseAddressEvent("Deleted 2: eth0    link/ether 02:00:00:00:00:01"), null);
  assertEquals(parseAddressEvent(""), null);
});

/** A device layer that plays the kernel's node side and the address watch. */
class Kernel {
  live: HostLinkNodeState = { nodeEnds: [], routes: [], neighbours: [] };
  restored: HostLinkNodeSide[][] = [];
  listings = 0;
  watches = 0;
  emit: ((e: AddressEvent) => void) | null = null;
  #end: ((why: string) => void) | null = null;
  closed = 0;

  hostLinkNodeState() {
    this.listings++;
    return Promise.resolve(structuredClone(this.live));
  }
  restoreHostLinkNodeSide(sides: HostLinkNodeSide[]) {
    this.restored.push(structuredClone(sides));
    return Promise.resolve([]);
  }
  watchNodeAddresses(onEvent: (e: AddressEvent) => void): AddressWatch {
    this.watches++;
    this.emit = onEvent;
    const ended = new Promise<string>((r) => (this.#end = r));
    return {
      ended,
      close: () => {
        this.closed++;
        this.#end?.("closed");
        return Promise.resolve();
      },
    };
  }
  /** The watch's process ends by itself. */
  die(): void {
    this.#end?.("exited with code 1");
  }
}

const addr = (deleted: boolean, address = PRIMARY.ipv4): AddressEvent => ({
  deleted,
  ifName: "eth0",
  family: address.includes(":") ? 6 : 4,
  address,
  scope: "global",
});

async function settle(ms = 60): Promise<void> {
  await new Promise((r) => setTimeout(r, ms));
}

Deno.test("the keeper restores what an address change dropped, once changes settle, and ignores renewals", async () => {
  const rows = [row(1, ["10.99.0.2/24"]), row(2, ["10.99.0.3/24"])];
  const kernel = new Kernel();
  kernel.live = whole(rows);
  let forgotten = 0;
  const ctx: KeeperContext = {
    state: { all: () => rows },
    devices: kernel,
    locks: new KeyedMutex(),
    log: new Logger(() => {}, "error"),
    hostLinks: {
      nodeAddresses: () => Promise.resolve({ addresses: [], primary: PRIMARY } as NodeAddresses),
      forgetNodeAddresses: () => void forgotten++,
    },
  };
  const keeper = new NodeRouteKeeper(ctx, { settleMs: 20, restartMs: 20 });
  try {
    keeper.start();
    await settle();
    assertEquals(kernel.listings, 1, "a pass when the watch starts");
    assertEquals(kernel.restored.length, 0, "nothing was missing");
    // The address goes and comes back: the kernel flushed c1's route meanwhile.
    kernel.live.routes = kernel.live.routes.filter((r) => r.dst !== "10.99.0.2/32");
    kernel.emit!(addr(true));
    kernel.emit!(addr(false));
    await settle();
    assertEquals(kernel.listings, 2, "one pass for the burst");
    assertEquals(kernel.restored.map((s) => s.map((x) => x.nodeIfName)), [["enimh1"]]);
    assertEquals(kernel.restored[0][0].nodeSource, PRIMARY);
    assert(forgotten >= 2, "ADD's cache of the node's addresses was dropped");
    // A renewal of a known address (DHCP, a router advertisement): no pass.
    kernel.emit!(addr(false));
    // Link-scope addresses (a new node end's fe80::) never count.
    kernel.emit!({ ...addr(false, "fe80::1"), scope: "link" });
    // Nor do kube-ipvs0's (kube-proxy's IPVS mode binds each ClusterIP there).
    kernel.emit!({ ...addr(false, "172.30.0.10"), ifName: "kube-ipvs0" });
    kernel.emit!({ ...addr(true, "172.30.0.11"), ifName: "kube-ipvs0" });
    await settle();
    assertEquals(kernel.listings, 2);
    // The watch's process dies: it is started again, and a pass looks at what it missed.
    kernel.die();
    await settle(100);
    assertEquals(kernel.watches, 2);
    assertEquals(kernel.listings, 3);
  } finally {
    await keeper.close();
  }
  assertEquals(kernel.closed, 1, "close ended the watch");
});

Deno.test("a pass lists nothing when no attachment has a host link", async () => {
  const kernel = new Kernel();
  const keeper = new NodeRouteKeeper({
    state: { all: () => [{ ...row(1, ["10.99.0.2/24"]), hostLink: null }] },
    devices: kernel,
    locks: new KeyedMutex(),
    log: new Logger(() => {}, "error"),
    hostLinks: {
      nodeAddresses: () => Promise.resolve({ addresses: [], primary: PRIMARY }),
      forgetNodeAddresses: () => {},
    },
  });
  assertEquals(await keeper.pass(), 0);
  assertEquals(kernel.listings, 0);
  await keeper.close();
});
