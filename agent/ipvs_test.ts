import { assert, assertEquals, assertRejects, assertStringIncludes } from "../lib/assert.ts";
import { Logger } from "../lib/log.ts";
import { poll } from "../lib/async.ts";
import { ApiError } from "../api/schema.ts";
import type { Link } from "../netns/types.ts";
import type { PolicyHook, PolicyPod, RestoredPolicyPod } from "../manager/types.ts";
import { ipvsServices, IpvsWatch, refusingUnderIpvs } from "./ipvs.ts";

const HEADER = "IP Virtual Server version 1.2.1 (size=4096)\n" +
  "Prot LocalAddress:Port Scheduler Flags\n" +
  "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n";
const SERVICES = HEADER +
  "TCP  0A600001:01BB rr\n" +
  "  -> 0A630002:192B      Masq    1      0          0\n" +
  "UDP  [FD00:0030:0000:0000:0000:0000:0000:000A]:0035 rr\n" +
  "  -> [FD00:0099:0000:0000:0000:0000:0000:0002]:0035      Masq    1      0          0\n" +
  "FWM  00000001 rr\n";

const link = (ifname: string): Link => ({ ifindex: 7, ifname, flags: [] });

/** Fake links the test changes, and a log it reads. */
class Scene implements AsyncDisposable {
  links: Link[] = [link("lo"), link("eth0")];
  failLinks: string | null = null;
  readonly lines: { level: string; msg: string }[] = [];
  readonly log = new Logger((l) => this.lines.push(JSON.parse(l)), "info");
  readonly devices = {
    nodeLinks: () =>
      this.failLinks
        ? Promise.reject(new Error(this.failLinks))
        : Promise.resolve(structuredClone(this.links)),
  };
  readonly dir = Deno.makeTempDirSync({ prefix: "enim-ipvs-" });
  readonly proc = `${this.dir}/ip_vs`;
  readonly watches: IpvsWatch[] = [];

  async watch(intervalMs = 60_000): Promise<IpvsWatch> {
    const w = await IpvsWatch.start({
      devices: this.devices,
      log: this.log,
      procFile: this.proc,
      intervalMs,
    });
    this.watches.push(w);
    return w;
  }

  async [Symbol.asyncDispose]() {
    for (const w of this.watches) await w.close();
    await Deno.remove(this.dir, { recursive: true });
  }
}

Deno.test("ipvsServices() counts the virtual services of /proc/net/ip_vs, not its headers or real servers", () => {
  assertEquals(ipvsServices(SERVICES), 3);
  assertEquals(ipvsServices(HEADER), 0);
  assertEquals(ipvsServices(""), 0);
});

Deno.test("the watch refuses while kube-ipvs0 or an IPVS service is there, and says so once per change", async (t) => {
  await using s = new Scene();
  const w = await s.watch();
  await t.step("neither (no file: no ip_vs module): not refusing, logged once at start", () => {
    assertEquals(w.refusing, false);
    assertEquals(w.status().reason, "none found");
    assertEquals(w.status().link, false);
    assertEquals(w.status().services, 0);
    assertEquals(s.lines.map((l) => l.level), ["info"]);
  });
  await t.step("a kube-ipvs0 link (at the next look): refusing, an error line", async () => {
    s.links.push(link("kube-ipvs0"));
    await w.check();
    assert(w.refusing);
    assertEquals(w.status().reason, 'link "kube-ipvs0"');
    assertEquals(s.lines.at(-1)?.level, "error");
    assertStringIncludes(s.lines.at(-1)!.msg, "NetworkPolicy cannot be enforced on this node");
    await w.check();
    assertEquals(s.lines.length, 2, "no new line without a change");
  });
  await t.step(
    "the link gone, IPVS services in the file: refusing",
    async () => {
      s.links = s.links.filter((l) => l.ifname !== "kube-ipvs0");
      await w.check();
      assertEquals(w.refusing, false);
      assertEquals(s.lines.at(-1)?.level, "info");
      await Deno.writeTextFile(s.proc, SERVICES);
      await w.check();
      assert(w.refusing);
      assertStringIncludes(w.status().reason, "3 IPVS services in");
    },
  );
  await t.step("the file's services gone (its header stays): not refusing", async () => {
    await Deno.writeTextFile(s.proc, HEADER);
    await w.check();
    assertEquals(w.refusing, false);
  });
  await t.step("a file that cannot be read: not ruled out, refusing", async () => {
    await Deno.remove(s.proc);
    await Deno.mkdir(s.proc);
    await w.check();
    assert(w.refusing);
    assertStringIncludes(w.status().reason, "IPVS mode cannot be ruled out: cannot read");
    await Deno.remove(s.proc);
    await w.check();
    assertEquals(w.refusing, false);
  });
  await t.step("links that cannot be listed after a look: the last answer stands", async () => {
    s.failLinks = "ip is gone";
    await w.check();
    assertEquals(w.refusing, false);
    assert(s.lines.some((l) => l.level === "warn"), "a warning");
    s.failLinks = null;
  });
});

Deno.test("a watch whose first look cannot list the links refuses until a look can", async () => {
  await using s = new Scene();
  s.failLinks = "no ip";
  const w = await s.watch(20);
  assert(w.refusing);
  assertEquals(w.status().link, null);
  assertStringIncludes(w.status().reason, "cannot list the node's links: no ip");
  s.failLinks = null;
  assert(
    await poll(() => Promise.resolve(!w.refusing || null), { timeoutMs: 5000, intervalMs: 10 }),
  );
});

Deno.test("the periodic look notices kube-proxy switching to IPVS and back", async () => {
  await using s = new Scene();
  const w = await s.watch(20);
  assertEquals(w.refusing, false);
  s.links.push(link("kube-ipvs0"));
  assert(
    await poll(() => Promise.resolve(w.refusing || null), { timeoutMs: 5000, intervalMs: 10 }),
  );
  s.links.pop();
  assert(
    await poll(() => Promise.resolve(!w.refusing || null), { timeoutMs: 5000, intervalMs: 10 }),
  );
});

Deno.test("refusingUnderIpvs() fails prepare with policy_unenforceable while refusing, and passes every call on otherwise", async () => {
  await using s = new Scene();
  const w = await s.watch();
  const calls: string[] = [];
  const hook: PolicyHook = {
    whenSynced: () => null,
    reuseWait: () => null,
    prepare: (p) => {
      calls.push(`prepare ${p.pod}`);
      return Promise.resolve(null);
    },
    committed: (k, n) => {
      calls.push(`committed ${k} ${n}`);
      return Promise.resolve();
    },
    removed: (k) => {
      calls.push(`removed ${k}`);
      return Promise.resolve();
    },
    restore: (pods: RestoredPolicyPod[]) => void calls.push(`restore ${pods.length}`),
  };
  const guarded = refusingUnderIpvs(hook, w);
  const pod: PolicyPod = {
    pod: "shop/db",
    key: "c1/eth0",
    addresses: { ipv4: "10.99.0.2" },
    eniIfName: "eth0",
    nodeIfName: "enimh0000000001",
    nodeAddresses: [],
  };
  assertEquals(await guarded.prepare(pod), null);
  await Deno.writeTextFile(s.proc, SERVICES);
  await w.check();
  const err = await assertRejects(() => guarded.prepare(pod), ApiError);
  assertEquals(err.code, "policy_unenforceable");
  assertStringIncludes(err.message, "kube-proxy runs in IPVS mode (3 IPVS services in");
  assertStringIncludes(err.message, '"shop/db"');
  assertEquals(w.status().refusedAdds, 1);
  await guarded.committed("c1/eth0", "/run/netns/p");
  await guarded.removed("c1/eth0");
  guarded.restore([]);
  assertEquals(calls, [
    "prepare shop/db",
    "committed c1/eth0 /run/netns/p",
    "removed c1/eth0",
    "restore 0",
  ]);
});

Deno.test("the watch reads the file through the device layer when the layer can (the node's namespace), and never itself then", async () => {
  const files = new Map<string, string>();
  const asked: string[] = [];
  const log = new Logger(() => {}, "error");
  const w = await IpvsWatch.start({
    devices: {
      nodeLinks: () => Promise.resolve([link("eth0")]),
      readNodeFile: (path) => {
        asked.push(path);
        return Promise.resolve(files.get(path) ?? null);
      },
    },
    log,
    procFile: "/proc/net/ip_vs",
  });
  try {
    assertEquals(w.refusing, false);
    files.set("/proc/net/ip_vs", SERVICES);
    await w.check();
    assert(w.refusing);
    assertEquals(asked, ["/proc/net/ip_vs", "/proc/net/ip_vs"]);
  } finally {
    await w.close();
  }
});
