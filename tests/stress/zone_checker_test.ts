/**
 * The zone stress's cross-node checker on synthetic views (no root): a consistent
 * two-node cluster passes, and each cross-node divergence is reported with its
 * class and subject.
 */
import { assertEquals } from "../../lib/assert.ts";
import type { Attachment } from "../../api/schema.ts";
import { type Eni, makeEni, type ParkedEni } from "../../providers/schema.ts";
import { readyAttachment } from "../support/records.ts";
import { nodeLink } from "./_fixtures.ts";
import type { FakeEni } from "../support/bce_fake.ts";
import type { ViolationClass } from "./_checker.ts";
import type { KernelView } from "./_kernel.ts";
import { checkZone, unaccountedDevices, type ZoneViews } from "./_zone_checker.ts";
import { encodeRecord } from "../../providers/bce/_sticky.ts";

const A = "i-a", B = "i-b";
const NOW = Date.parse("2026-01-01T00:00:00Z");
const mac = (n: number) => `fa:f6:00:00:00:0${n}`;
const STICKY = "enim/z/e2e/00112233aabbccdd";

function cloudEni(n: number, over: Partial<FakeEni> = {}): FakeEni {
  return {
    eniId: `eni-${n}`,
    name: `enim/pool-${n}`,
    description: "",
    zoneName: "cn-bj-a",
    instanceId: A,
    macAddress: mac(n),
    vpcId: "vpc-1",
    subnetId: "sbn-1",
    status: "inuse",
    privateIpSet: [],
    ipv6PrivateIpSet: [],
    securityGroupIds: [],
    enterpriseSecurityGroupIds: [],
    createdTime: "2026-01-01T00:00:00Z",
    networkInterfaceTrafficMode: "standard",
    ...over,
  };
}

function eni(n: number, owner: string | null = null): Eni {
  return makeEni({
    id: `eni-${n}`,
    mac: mac(n),
    ipv4: null,
    ipv6: null,
    subnetId: "sbn-1",
    state: owner ? "owned" : "free",
    owner: owner ? { pod: "default/db-0", containerId: owner, ifName: "eth0" } : null,
  });
}

function attachment(containerId: string, n: number): Attachment {
  return readyAttachment({
    containerId,
    pod: "default/db-0",
    network: "enim-test",
    netns: "/run/netns/p",
    eniId: `eni-${n}`,
    mac: mac(n),
    sticky: true,
  });
}

function kernel(macs: string[]): KernelView {
  const links = macs.map((m) => nodeLink(m));
  return {
    node: { name: "n", path: "/run/netns/n", exists: true, ino: 1, links },
    pods: new Map(),
    vpcEnds: new Set(macs),
    nodeRules: [],
  };
}

const parkedRecord = (by: string, until = NOW + 60_000) =>
  encodeRecord({ state: "parked", cluster: "e2e", pod: "default/db-0", ifName: "eth0", until, by });

const parkedEntry = (id: string): ParkedEni => ({
  eniId: id,
  pod: "default/db-0",
  ifName: "eth0",
  profile: "default",
  state: "parked",
  since: "2026-01-01T00:00:00.000Z",
  until: "2026-01-01T00:01:00.000Z",
});

/** A consistent cluster: A runs the pod on eni-1 and has eni-2 free; eni-3 is parked by B. */
function consistent(): ZoneViews {
  return {
    cloud: [
      cloudEni(1, { name: STICKY }),
      cloudEni(2),
      cloudEni(3, {
        name: "enim/z/e2e/ffeeddccbbaa9988",
        instanceId: "",
        status: "available",
        description: parkedRecord(B),
      }),
    ],
    nodes: [
      {
        label: "A",
        instanceId: A,
        agent: {
          attachments: [attachment("c1", 1)],
          enis: [eni(1, "c1"), eni(2)],
          parked: [],
          claiming: 0,
        },
        kernel: kernel([mac(1), mac(2)]),
      },
      {
        label: "B",
        instanceId: B,
        agent: { attachments: [], enis: [], parked: [parkedEntry("eni-3")], claiming: 0 },
        kernel: kernel([]),
      },
    ],
    unaccounted: [],
    now: NOW,
  };
}

const found = (v: ZoneViews) => checkZone(v).map((x) => `${x.class} ${x.subject}`);

Deno.test("checkZone() finds nothing in a consistent two-node cluster", () => {
  assertEquals(found(consistent()), []);
});

Deno.test("checkZone() reports each cross-node divergence with its class and subject", async (t) => {
  const cases: [string, (v: ZoneViews) => void, ViolationClass, string][] = [
    [
      "an ENI attached to B that B's agent does not record",
      (v) => v.cloud.push(cloudEni(4, { instanceId: B })),
      "zone_attached_unrecorded",
      "eni-4",
    ],
    [
      "an ENI A records while the cloud has it on B",
      (v) => {
        v.cloud[1].instanceId = B;
        v.nodes[1].agent!.enis.push(eni(2));
      },
      "zone_recorded_elsewhere",
      "eni-2",
    ],
    [
      "an ENI both agents record",
      (v) => v.nodes[1].agent!.enis.push(eni(2)),
      "zone_recorded_twice",
      "eni-2",
    ],
    [
      "an ENI's device on both nodes",
      (v) => (v.nodes[1].kernel = kernel([mac(1)])),
      "zone_device_on_two_nodes",
      "eni-1",
    ],
    [
      "a pod ready on both nodes",
      (v) => v.nodes[1].agent!.attachments.push(attachment("c2", 3)),
      "zone_pod_runs_twice",
      "default/db-0/eth0",
    ],
    [
      "a sticky ENI detached with its owned record (a park half done)",
      (v) => {
        v.cloud[0].status = "available";
        v.cloud[0].instanceId = "";
        v.cloud[0].description = encodeRecord({
          state: "owned",
          cluster: "e2e",
          pod: "default/db-0",
          ifName: "eth0",
          until: null,
          by: A,
        });
        v.nodes[0].agent = null;
      },
      "zone_parked_without_record",
      "eni-1",
    ],
    [
      "two parked ENIs of one sticky pod",
      (v) =>
        v.cloud.push(
          cloudEni(5, {
            name: v.cloud[2].name,
            instanceId: "",
            status: "available",
            description: parkedRecord(A),
          }),
        ),
      "zone_parked_twice",
      "enim/z/e2e/ffeeddccbbaa9988",
    ],
    [
      "a parked ENI listed by both agents",
      (v) => v.nodes[0].agent!.parked.push(parkedEntry("eni-3")),
      "zone_parked_listed_twice",
      "eni-3",
    ],
    [
      "a device no namespace of any node shows",
      (v) => v.unaccounted.push(mac(7)),
      "device_in_unknown_namespace",
      mac(7),
    ],
    [
      "after the final expiry, a parked ENI whose hold has ended",
      (v) => {
        v.final = true;
        v.now = NOW + 120_000;
      },
      "zone_cloud_leak",
      "eni-3",
    ],
  ];
  for (const [what, mutate, cls, subject] of cases) {
    await t.step(what, () => {
      const v = consistent();
      mutate(v);
      assertEquals(found(v).filter((x) => x.startsWith(`${cls} `)), [`${cls} ${subject}`]);
    });
  }
  await t.step("an unexpired park is no leak after the final GC", () => {
    const v = consistent();
    v.final = true;
    assertEquals(found(v), []);
  });
});

Deno.test("unaccountedDevices() reports a device alive through the whole read that no namespace shows, and no device plugged or unplugged meanwhile", async (t) => {
  // Node A shows eni-1's device, node B shows none; eni-7's device is in no namespace.
  const kernels = [kernel([mac(1)]), kernel([])];
  const ends = (...ns: number[]) => new Set(ns.map(mac));
  await t.step("a device shown on a node is accounted for", () => {
    assertEquals(unaccountedDevices(ends(1), ends(1), kernels), []);
  });
  await t.step("a device whose VPC end was there before and after is lost", () => {
    assertEquals(unaccountedDevices(ends(1, 7), ends(1, 7), kernels), [mac(7)]);
  });
  await t.step("a device unplugged during the read (the failed run's case) is not", () => {
    assertEquals(unaccountedDevices(ends(1, 7), ends(1), kernels), []);
  });
  await t.step("a device plugged during the read is not", () => {
    assertEquals(unaccountedDevices(ends(1), ends(1, 7), kernels), []);
  });
  await t.step("a device shown in a pod namespace is accounted for", () => {
    const k = kernel([]);
    k.pods.set("/run/netns/p", { ...kernel([mac(7)]).node, name: "p", path: "/run/netns/p" });
    assertEquals(unaccountedDevices(ends(7), ends(7), [k]), []);
  });
});
