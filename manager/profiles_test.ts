/**
 * Per-pod ENI profiles in the manager, over the mock cloud and fake devices:
 * the operator's rules, profile pools, inline groups, fixed IPs, sticky holds,
 * the shared node limit and the cloud descriptions.
 */
import {
  add,
  delReq,
  type Node,
  type NodeOptions,
  withNode,
} from "../tests/support/manager_fixtures.ts";
import { ApiError } from "../api/schema.ts";
import { NODE } from "../netns/fake.ts";
import { assert, assertEquals, assertNotEquals, assertRejects } from "../lib/assert.ts";

const PROFILES = {
  subnets: { ipv4: { cidr: "10.99.0.0/24" } },
  enis: 2,
  profiles: {
    b: {
      subnets: { ipv4: { cidr: "10.98.0.0/24" } },
      enis: 2,
      securityGroupIds: ["g-bbbb"],
      namespaces: ["team-b", "default"],
      allowedSecurityGroupIds: ["g-inline1", "g-inline2", "esg-ent1"],
    },
    locked: {
      subnets: { ipv4: { cidr: "10.97.0.0/24" } },
      enis: 1,
      namespaces: ["team-b"],
    },
  },
};

const withDefaults = (fn: (n: Node) => Promise<void>, opts: NodeOptions = {}) =>
  withNode(fn, { mock: PROFILES, ...opts });

/** Asserts `fn` is refused with `code` and that nothing was recorded or allocated. */
async function refused(n: Node, code: string, fn: () => Promise<unknown>): Promise<string> {
  const before = await n.owned();
  const e = await assertRejects(fn);
  assert(e instanceof ApiError, String(e));
  assertEquals(e.code, code, e.message);
  assertEquals(n.mgr.state.all(), [], "nothing recorded");
  assertEquals(await n.owned(), before, "nothing allocated");
  return e.message;
}

async function eni(n: Node, id: string) {
  return (await n.mock.list()).find((e) => e.id === id)!;
}

Deno.test("a pod of profile b gets an ENI of b's subnet and groups; the pools stay apart", () =>
  withDefaults(async (n) => {
    const a = await add(n, 1);
    const b = await add(n, 2, { profile: "b" });
    assertEquals(a.ips[0], { address: "10.99.0.2/24", gateway: "10.99.0.1" });
    assertEquals(b.eniId, "eni-mock-b-0001");
    assertEquals(b.ips[0], { address: "10.98.0.2/24", gateway: "10.98.0.1" });
    assertEquals((await eni(n, b.eniId)).securityGroupIds, ["g-bbbb"]);
    assertEquals(n.mgr.state.get({ containerId: "c2", ifName: "eth0" })?.profile, "b");
    const s = await n.mgr.status();
    assertEquals(s.pool.profiles.default, { free: 1, owned: 1, recycling: 0, held: 0 });
    assertEquals(s.pool.profiles.b, { free: 1, owned: 1, recycling: 0, held: 0 });
    assertEquals(s.pool.profiles.locked, { free: 1, owned: 0, recycling: 0, held: 0 });
    // b's second ENI is b's; the default pool's last one is not handed to b.
    await add(n, 3, { profile: "b" });
    await add(n, 4);
    const msg = (await assertRejects(() => add(n, 5, { profile: "b" }))) as ApiError;
    assertEquals(msg.code, "no_eni_available");
  }));

Deno.test("a choice the operator did not allow is refused before anything is allocated", () =>
  withDefaults(async (n) => {
    let m = await refused(n, "not_allowed", () => add(n, 1, { profile: "nope" }));
    assert(m.includes('"nope" is not configured') && m.includes('"default", "b", "locked"'), m);
    m = await refused(n, "not_allowed", () => add(n, 1, { profile: "locked" }));
    assert(m.includes('namespaces "team-b" only, not of "default"'), m);
    m = await refused(n, "not_allowed", () => add(n, 1, { securityGroupIds: ["g-inline1"] }));
    assert(m.includes("allows no inline security groups"), m);
    m = await refused(
      n,
      "not_allowed",
      () => add(n, 1, { profile: "b", securityGroupIds: ["g-other"] }),
    );
    assert(m.includes('does not allow the security group "g-other"'), m);
    m = await refused(
      n,
      "not_allowed",
      () => add(n, 1, { profile: "b", securityGroupIds: ["g-inline1", "esg-ent1"] }),
    );
    assert(m.includes("all regular"), m);
    m = await refused(n, "requested_ip_unavailable", () => add(n, 1, { ips: ["10.98.0.50"] }));
    assert(m.includes('10.98.0.50 is outside the subnet 10.99.0.0/24 of profile "default"'), m);
    m = await refused(n, "requested_ip_unavailable", () => add(n, 1, { ips: ["fd00::5"] }));
    assert(m.includes("has no IPv6 subnet"), m);
    // The same pod in an admitted namespace gets it.
    const ok = await add(n, 1, {
      profile: "locked",
      pod: { namespace: "team-b", name: "pod-1" },
    });
    assertEquals(ok.eniId, "eni-mock-locked-0001");
  }));

Deno.test("inline security groups replace the ENI's while the pod owns it, then go back", () =>
  withDefaults(async (n) => {
    const r = await add(n, 1, { profile: "b", securityGroupIds: ["g-inline1", "g-inline2"] });
    assertEquals((await eni(n, r.eniId)).securityGroupIds, ["g-inline1", "g-inline2"]);
    assertEquals((await eni(n, r.eniId)).enterpriseSecurityGroupIds, []);
    await n.mgr.del(delReq(1));
    await n.mgr.settled();
    assertEquals((await eni(n, r.eniId)).securityGroupIds, ["g-bbbb"]);
    const e = await add(n, 2, { profile: "b", securityGroupIds: ["esg-ent1"] });
    assertEquals(e.eniId, r.eniId, "the same pooled ENI, groups replaced again");
    assertEquals((await eni(n, e.eniId)).securityGroupIds, []);
    assertEquals((await eni(n, e.eniId)).enterpriseSecurityGroupIds, ["esg-ent1"]);
  }));

Deno.test("a fixed IP no pooled ENI carries gets a new ENI with exactly that IP", () =>
  withDefaults(async (n) => {
    const r = await add(n, 1, { profile: "b", ips: ["10.98.0.77"] });
    assertEquals(r.ips[0], { address: "10.98.0.77/24", gateway: "10.98.0.1" });
    assert(r.eniId.startsWith("eni-mock-b-"), r.eniId);
    // Taken: another pod cannot have it.
    const e = await assertRejects(() => add(n, 2, { profile: "b", ips: ["10.98.0.77"] }));
    assertEquals((e as ApiError).code, "requested_ip_unavailable");
    // Freed, the ENI stays in b's pool and the next pod asking for the IP gets it.
    await n.mgr.del(delReq(1));
    const again = await add(n, 3, { profile: "b", ips: ["10.98.0.77"] });
    assertEquals(again.eniId, r.eniId);
    // A pooled ENI's own address works as before.
    const pooled = await add(n, 4, { ips: ["10.99.0.3"] });
    assertEquals(pooled.eniId, "eni-mock-0002");
  }));

Deno.test("a sticky pod gets its ENI back after a delete and re-create; others do not", () =>
  withDefaults(async (n) => {
    const pod = { namespace: "default", name: "db-0" };
    const first = await add(n, "a1", { pod, sticky: true });
    await n.mgr.del(delReq("a1"));
    const row = n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })!;
    assertEquals([row.state, row.eniId], ["held", first.eniId]);
    assertEquals(n.devices.where(first.mac)?.ns, NODE, "the device is back on the node");
    assertEquals((await n.owned()).get(first.eniId), "ca1/eth0", "still the pod's in the cloud");
    assertEquals((await n.mgr.status()).pool.held, 1);
    await n.mgr.del(delReq("a1")); // a retried DEL changes nothing
    assertEquals(n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })?.state, "held");
    // Another pod does not get the held ENI.
    const other = await add(n, "x", {});
    assertNotEquals(other.eniId, first.eniId);
    // The pod's new sandbox gets it back: same ENI, MAC and IP.
    const back = await add(n, "a2", { pod, sticky: true });
    assertEquals([back.eniId, back.mac, back.ips], [first.eniId, first.mac, first.ips]);
    assertEquals(n.mgr.state.get({ containerId: "ca1", ifName: "eth0" }), null);
    assertEquals((await n.owned()).get(first.eniId), "ca2/eth0");
    assertEquals(n.devices.where(first.mac)?.ns, "/run/netns/pa2");

    // Not sticky: a DEL frees the ENI; the next pod takes it and the re-created one does not.
    const plain = { namespace: "default", name: "web-0" };
    await n.mgr.del(delReq("x"));
    const p1 = await add(n, "p1", { pod: plain });
    await n.mgr.del(delReq("p1"));
    await n.mgr.settled();
    assertEquals(n.mgr.state.all().filter((r) => r.state === "held"), []);
    assert(!(await n.owned()).has(p1.eniId), "freed in the cloud at once");
    const y = await add(n, "y", {});
    assertEquals(y.eniId, p1.eniId, "the next pod gets the plain pod's ENI");
  }));

Deno.test("a sticky pod's container ADDed again under the same container ID after its DEL gets its held ENI back: same ENI, MAC and IP", () =>
  withDefaults(async (n) => {
    const pod = { namespace: "default", name: "db-0" };
    // Another pod's ENI freed first, so that a fresh allocation would pick another ENI.
    await add(n, "x", {});
    const first = await add(n, "a1", { pod, sticky: true });
    await n.mgr.del(delReq("x"));
    await n.mgr.del(delReq("a1"));
    assertEquals(n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })?.state, "held");
    // podman restarts the container: the same container ID, the same namespace.
    const back = await add(n, "a1", { pod, sticky: true });
    assertEquals([back.eniId, back.mac, back.ips], [first.eniId, first.mac, first.ips]);
    const row = n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })!;
    assertEquals([row.state, row.eniId, row.holdUntil], ["ready", first.eniId, null]);
    assertEquals((await n.owned()).get(first.eniId), "ca1/eth0");
    assertEquals(n.devices.where(first.mac)?.ns, "/run/netns/pa1");
    assertEquals((await n.mgr.status()).pool.held, 0);
    // Its next DEL holds it again, and a GC pass of the grace period leaves it be.
    await n.mgr.del(delReq("a1"));
    assertEquals(n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })?.state, "held");
  }));

Deno.test("a held ENI's container ADDed again but no longer sticky ends the hold: the ENI goes back to the pool", () =>
  withDefaults(async (n) => {
    const pod = { namespace: "default", name: "db-0" };
    const first = await add(n, "a1", { pod, sticky: true });
    await n.mgr.del(delReq("a1"));
    const back = await add(n, "a1", { pod });
    assertEquals(n.mgr.state.all().map((r) => [r.containerId, r.state]), [["ca1", "ready"]]);
    assertEquals((await n.owned()).get(back.eniId), "ca1/eth0");
    assertEquals((await n.mgr.status()).pool.held, 0);
    assert(back.eniId === first.eniId || !(await n.owned()).has(first.eniId));
  }));

Deno.test("a hold expires and GC frees the ENI; the pod then gets a fresh one", () =>
  withDefaults(async (n) => {
    const pod = { namespace: "default", name: "db-0" };
    const first = await add(n, "a1", { pod, sticky: true });
    await n.mgr.del(delReq("a1"));
    n.devices.deleteNetns("/run/netns/pa1");
    // Before expiry GC leaves it alone, though its netns is gone.
    n.clock.advance(60_000);
    assertEquals((await n.mgr.gc({ dryRun: false })).items, []);
    n.clock.advance(61_000);
    const plan = await n.mgr.gc({ dryRun: true });
    assertEquals(plan.items.map((i) => [i.kind, i.eniId]), [["hold", first.eniId]]);
    const report = await n.mgr.gc({ dryRun: false });
    assertEquals(report.items.map((i) => [i.kind, i.outcome]), [["hold", "reclaimed"]]);
    assertEquals(n.mgr.state.all(), []);
    assertEquals((await n.owned()).size, 0);
    assertEquals(n.devices.where(first.mac)?.ns, NODE);
    assertEquals((await n.mgr.status()).pool.held, 0);
  }, { stickyHoldMs: 120_000 }));

Deno.test("CNI GC never reclaims a held ENI: it is no attachment of the runtime", () =>
  withDefaults(async (n) => {
    const first = await add(n, "a1", { pod: { namespace: "default", name: "db-0" }, sticky: true });
    await n.mgr.del(delReq("a1"));
    const r = await n.mgr.gc({ dryRun: false, network: "enim", validAttachments: [] });
    assertEquals(r.items, []);
    assertEquals(n.mgr.state.get({ containerId: "ca1", ifName: "eth0" })?.eniId, first.eniId);
  }));

Deno.test("a sticky pod's hold survives an agent restart and is taken back after it", () =>
  withDefaults(async (n) => {
    const pod = { namespace: "default", name: "db-0" };
    const first = await add(n, "a1", { pod, sticky: true });
    await n.mgr.del(delReq("a1"));
    await n.restart();
    const rep = await n.mgr.reconcile();
    assertEquals(rep.errors, []);
    const back = await add(n, "a2", { pod, sticky: true });
    assertEquals(back.eniId, first.eniId);
  }));

Deno.test("the node limit is shared: a pod of one profile makes room from another's idle pool", () =>
  withDefaults(async (n) => {
    // 2 default ENIs attached; b's are not, and the node takes 3 at most.
    const before = await n.mgr.status();
    assertEquals(before.pool.profiles.default.free, 2);
    assertEquals(before.pool.profiles.b.free, 1);
    const b1 = await add(n, 1, { profile: "b" });
    const b2 = await add(n, 2, { profile: "b" });
    assert(b1.eniId.startsWith("eni-mock-b-") && b2.eniId.startsWith("eni-mock-b-"));
    const s = await n.mgr.status();
    assertEquals(s.pool.profiles.b.owned, 2);
    assertEquals(s.pool.profiles.default.free, 1, "an idle default ENI was detached for b");
    assertEquals(s.pool.free + s.pool.owned, 3, "never over the node limit");
    // The default pod still gets the remaining one.
    const d = await add(n, 3);
    assert(d.eniId.startsWith("eni-mock-0"), d.eniId);
  }, {
    mock: {
      ...PROFILES,
      maxEnisPerNode: 3,
      profiles: {
        ...PROFILES.profiles,
        b: { ...PROFILES.profiles.b, preattached: 1 },
        locked: { ...PROFILES.profiles.locked, preattached: 0 },
      },
    },
  }));

Deno.test("the cloud description names the owning pod and node, and is restored when freed", () =>
  withDefaults(async (n) => {
    const r = await add(n, 1);
    await n.mgr.descriptionsIdle();
    assertEquals((await eni(n, r.eniId)).description, "default/pod-1 on node-7");
    await n.mgr.del(delReq(1));
    await n.mgr.settled();
    await n.mgr.descriptionsIdle();
    assertEquals((await eni(n, r.eniId)).description, null);
  }, { describeAs: "node-7" }));
