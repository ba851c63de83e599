/**
 * The stress checker on synthetic views (no root): a consistent node passes, and
 * each kind of divergence is reported with its class and subject.
 */
import { assertEquals } from "../../lib/assert.ts";
import type { Attachment } from "../../api/schema.ts";
import { type Eni, makeEni } from "../../providers/schema.ts";
import { readyAttachment } from "../support/records.ts";
import { nodeLink } from "./_fixtures.ts";
import { checkInvariants, type ViolationClass } from "./_checker.ts";
import type { KernelLink, KernelRule, KernelView, NamespaceView } from "./_kernel.ts";
import { Model, type PodRecord } from "./_model.ts";

const MAC1 = "02:e1:0a:00:00:01";
const MAC2 = "02:e1:0a:00:00:02";
const POD0 = "/run/netns/t-p0";

function eni(n: number, owner: string | null): Eni {
  return makeEni({
    id: `eni-mock-000${n}`,
    mac: `02:e1:0a:00:00:0${n}`,
    ipv4: { address: `10.99.0.${n + 1}`, prefixLength: 24, gateway: "10.99.0.1" },
    ipv6: null,
    subnetId: "subnet-mock",
    state: owner ? "owned" : "free",
    owner: owner ? { pod: "stress/pod-0", containerId: owner, ifName: "eth0" } : null,
  });
}

function attachment(containerId: string, n: number, over: Partial<Attachment> = {}): Attachment {
  return readyAttachment({
    containerId,
    pod: "stress/pod-0",
    network: "enim-stress",
    netns: POD0,
    eniId: `eni-mock-000${n}`,
    mac: `02:e1:0a:00:00:0${n}`,
    nodeName: `en02e10a00000${n}`,
    ...over,
  });
}

function podLink(mac: string, n: number): KernelLink {
  return nodeLink(mac, {
    ifname: "eth0",
    up: true,
    addrs: [`10.99.0.${n + 1}/24`, "fe80::1/64"],
    globalAddrs: [`10.99.0.${n + 1}/24`],
    routes: ["default via 10.99.0.1", "10.99.0.0/24"],
  });
}

function ns(path: string, links: KernelLink[], exists = true): NamespaceView {
  return { name: path.split("/").pop()!, path, exists, ino: exists ? 1 : null, links };
}

/** A node where pod 0 holds ENI 1 (ADD acknowledged) and ENI 2 is free on the node. */
function fixture() {
  const pod: PodRecord = {
    index: 0,
    name: "pod-0",
    short: "p0",
    nsName: "t-p0",
    path: POD0,
    gen: 1,
    exists: true,
    ino: 1,
    ctr: 1,
    busy: false,
    old: [],
  };
  const model = new Model("s1", [pod]);
  const k = model.key(pod, "s1-p0-c1");
  k.status = "added";
  k.added = { mac: MAC1, ips: ["10.99.0.2/24"], routes: ["default via 10.99.0.1"], prevResult: {} };
  const kernel: KernelView = {
    node: ns("/run/netns/t-node", [nodeLink(MAC2)]),
    pods: new Map([[POD0, ns(POD0, [podLink(MAC1, 1)])]]),
    vpcEnds: new Set([MAC1, MAC2]),
    nodeRules: [],
  };
  return {
    model,
    key: k,
    pod,
    attachments: [attachment("s1-p0-c1", 1)],
    enis: [eni(1, "s1-p0-c1"), eni(2, null)],
    kernel,
  };
}

function classes(v: ReturnType<typeof checkInvariants>): [ViolationClass, string][] {
  return v.map((x) => [x.class, x.subject]);
}

Deno.test("checkInvariants() finds nothing wrong with a consistent node", () => {
  assertEquals(checkInvariants(fixture()), []);
});

Deno.test("checkInvariants() reports each kind of divergence", async (t) => {
  await t.step("an attachment left deleting", () => {
    const f = fixture();
    f.attachments[0].state = "deleting";
    assertEquals(classes(checkInvariants(f)), [["half_done", "s1-p0-c1/eth0"]]);
  });

  await t.step("the provider shows an attachment's ENI free (issue 17 hole a)", () => {
    const f = fixture();
    f.enis[0] = eni(1, null);
    assertEquals(classes(checkInvariants(f)), [["attachment_eni_not_owned", "s1-p0-c1/eth0"]]);
  });

  await t.step("the provider shows an ENI owned by a key without an attachment", () => {
    const f = fixture();
    f.enis[1] = eni(2, "ghost");
    assertEquals(classes(checkInvariants(f)), [["provider_owner_unrecorded", "eni-mock-0002"]]);
  });

  await t.step("an attachment's device is nowhere while its pod exists (issue 17 hole b)", () => {
    const f = fixture();
    f.key.reclaimable = "netns replaced";
    f.attachments[0].state = "recycling";
    f.kernel.pods.set(POD0, ns(POD0, []));
    f.kernel.vpcEnds.delete(MAC1);
    assertEquals(classes(checkInvariants(f)), [["attachment_device_missing", "s1-p0-c1/eth0"]]);
  });

  await t.step("an acknowledged ADD lost, and its device left in the pod", () => {
    const f = fixture();
    f.attachments = [];
    f.enis[0] = eni(1, null);
    assertEquals(classes(checkInvariants(f)), [
      ["free_eni_not_on_node", "eni-mock-0001"],
      ["stray_device_in_pod", "eni-mock-0001"],
      ["ack_add_lost", "s1-p0-c1/eth0"],
    ]);
  });

  await t.step("an acknowledged ADD's device moved out of the pod", () => {
    const f = fixture();
    f.kernel.pods.set(POD0, ns(POD0, []));
    f.kernel.node.links.push(nodeLink(MAC1, { ifname: "eth0" }));
    assertEquals(classes(checkInvariants(f)), [["ack_add_device", "s1-p0-c1/eth0"]]);
  });

  await t.step("an acknowledged ADD's device without its address or route", () => {
    const f = fixture();
    f.kernel.pods.set(POD0, ns(POD0, [nodeLink(MAC1, { ifname: "eth0", up: true })]));
    assertEquals(classes(checkInvariants(f)), [["ack_add_device", "s1-p0-c1/eth0"]]);
  });

  await t.step("an acknowledged DEL whose attachment still holds the ENI", () => {
    const f = fixture();
    f.key.status = "deleted";
    assertEquals(classes(checkInvariants(f)), [["ack_del_undone", "s1-p0-c1/eth0"]]);
    // Left `deleting` for the agent to finish (a failed release): only half done.
    f.attachments[0].state = "deleting";
    assertEquals(classes(checkInvariants(f)), [["half_done", "s1-p0-c1/eth0"]]);
  });

  await t.step(
    "a DEL answered since the agent started is seen part way; after a kill it is not excused",
    () => {
      const f = fixture();
      f.key.status = "deleted";
      f.key.finishing = true;
      // Recorded deleting, the device still in the pod, the ENI still owned.
      f.attachments[0].state = "deleting";
      assertEquals(classes(checkInvariants(f)), []);
      // The record gone (read after the rest), the provider and the kernel read before it.
      f.attachments = [];
      assertEquals(classes(checkInvariants(f)), []);
      f.enis[0] = eni(1, null);
      assertEquals(classes(checkInvariants(f)), []);
      // The agent was killed since: reconcile must have finished it.
      f.model.agentKilled();
      assertEquals(classes(checkInvariants(f)), [
        ["free_eni_not_on_node", "eni-mock-0001"],
        ["stray_device_in_pod", "eni-mock-0001"],
      ]);
      f.attachments = [attachment("s1-p0-c1", 1, { state: "deleting" })];
      f.enis[0] = eni(1, "s1-p0-c1");
      assertEquals(classes(checkInvariants(f)), [["half_done", "s1-p0-c1/eth0"]]);
    },
  );

  await t.step("a free ENI's device up with an address on the node, and one nowhere", () => {
    const f = fixture();
    f.kernel.node.links = [nodeLink(MAC2, { up: true, addrs: ["10.99.0.3/24"] })];
    f.enis.push(eni(3, null));
    assertEquals(classes(checkInvariants(f)), [
      ["node_device_dirty", "eni-mock-0002"],
      ["free_eni_not_on_node", "eni-mock-0003"],
    ]);
  });

  await t.step("a MAC on two links, and a device alive in an unknown namespace", () => {
    const f = fixture();
    f.kernel.node.links.push(nodeLink(MAC2, { ifname: "eth9" }));
    assertEquals(classes(checkInvariants({ ...f, unaccounted: ["02:e1:0a:00:00:09"] })), [
      ["device_in_unknown_namespace", "02:e1:0a:00:00:09"],
      ["device_duplicated", "eni-mock-0002"],
    ]);
  });

  await t.step("two attachments on one ENI", () => {
    const f = fixture();
    f.model.key(f.pod, "s1-p0-c2");
    f.attachments.push(attachment("s1-p0-c2", 1, { netns: "/run/netns/t-p9" }));
    const found = classes(checkInvariants(f));
    assertEquals(found[0], ["eni_held_twice", "eni-mock-0001"]);
    // The second attachment is not the provider's owner, and its device is not in its pod.
    assertEquals(found.slice(1), [
      ["attachment_eni_not_owned", "s1-p0-c2/eth0"],
      ["attachment_device_missing", "s1-p0-c2/eth0"],
    ]);
  });

  await t.step("a node end no attachment records; a linked ADD whose pod end is gone", () => {
    const f = fixture();
    const hl = { nodeIfName: "enimh0000000001", podIfName: "host0" };
    f.key.added!.hostLink = { ...hl, podMac: "0a:00:00:00:00:01" };
    f.attachments[0].hostLink = { ...hl, serviceCidrs: [] };
    f.kernel.node.links.push(
      nodeLink("0e:00:00:00:00:01", { ifname: hl.nodeIfName, up: true, nodeEnd: true }),
      nodeLink("0e:00:00:00:00:02", { ifname: "enimh0000000002", up: true, nodeEnd: true }),
    );
    // The pod end is there: only the stray node end is reported.
    f.kernel.pods.get(POD0)!.links.push(
      nodeLink("0a:00:00:00:00:01", { ifname: "host0", up: true }),
    );
    assertEquals(classes(checkInvariants(f)), [["host_link_orphan", "enimh0000000002"]]);
    // The pod end gone (deleted behind the agent's back): the ADD's link is not whole.
    f.kernel.pods.get(POD0)!.links.pop();
    assertEquals(classes(checkInvariants(f)), [
      ["host_link_orphan", "enimh0000000002"],
      ["host_link_missing", "s1-p0-c1/eth0"],
    ]);
  });

  await t.step("a held attachment whose node end is still there", () => {
    const f = fixture();
    f.key.status = "deleted";
    f.attachments[0].state = "held";
    f.attachments[0].hostLink = {
      nodeIfName: "enimh0000000001",
      podIfName: "host0",
      serviceCidrs: [],
    };
    f.kernel.pods.set(POD0, ns(POD0, []));
    f.kernel.node.links.push(nodeLink(MAC1));
    f.kernel.node.links.push(
      nodeLink("0e:00:00:00:00:01", { ifname: "enimh0000000001", nodeEnd: true }),
    );
    assertEquals(classes(checkInvariants(f)).filter(([c]) => c.startsWith("host_link")), [
      ["host_link_orphan", "enimh0000000001"],
    ]);
  });

  await t.step(
    "a node rule whose node end is gone or unrecorded; a ready link without its rule",
    () => {
      const f = fixture();
      const hl = { nodeIfName: "enimh0000000001", podIfName: "host0" };
      f.key.added!.hostLink = { ...hl, podMac: "0a:00:00:00:00:01" };
      f.attachments[0].hostLink = { ...hl, serviceCidrs: [], table: 0x10000001 };
      f.kernel.node.links.push(
        nodeLink("0e:00:00:00:00:01", { ifname: hl.nodeIfName, up: true, nodeEnd: true }),
      );
      f.kernel.pods.get(POD0)!.links.push(
        nodeLink("0a:00:00:00:00:01", { ifname: "host0", up: true }),
      );
      const rule = (over: Partial<KernelRule>): KernelRule => ({
        family: 4,
        priority: 1501,
        iif: hl.nodeIfName,
        detached: false,
        table: String(0x10000001),
        src: "10.99.0.2",
        ...over,
      });
      f.kernel.nodeRules = [rule({}), rule({ priority: 1500, table: "main" })];
      assertEquals(classes(checkInvariants(f)), []);
      // Its table's rule gone: the pod's Service traffic would leave by the node's NIC.
      f.kernel.nodeRules = [rule({ priority: 1500, table: "main" })];
      assertEquals(classes(checkInvariants(f)), [["host_link_rules_missing", "s1-p0-c1/eth0"]]);
      // Rules of a node end that is gone, and of one no attachment records.
      f.kernel.nodeRules = [
        rule({}),
        rule({ iif: "enimh0000000009", detached: true }),
        rule({ iif: "enimh0000000008" }),
      ];
      assertEquals(classes(checkInvariants(f)), [
        ["host_link_rule_orphan", "enimh0000000009@1501/4"],
        ["host_link_rule_orphan", "enimh0000000008@1501/4"],
      ]);
    },
  );

  await t.step("after the final GC, anything left is a leak", () => {
    const f = fixture();
    f.pod.exists = false;
    f.kernel.pods.set(POD0, ns(POD0, [], false));
    f.kernel.node.links.push(nodeLink(MAC1));
    assertEquals(classes(checkInvariants({ ...f, final: { leftoverNetns: ["t-p3"] } })), [
      ["leak_attachment", "s1-p0-c1/eth0"],
      ["leak_owned_eni", "eni-mock-0001"],
      ["leak_netns", "t-p3"],
    ]);
  });
});
