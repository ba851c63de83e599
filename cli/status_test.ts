import { assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { AddRequestSchema, StatusSchema } from "../api/schema.ts";
import { runEnim } from "../tests/support/enim.ts";
import { withRunDir, withSandbox } from "../tests/support/run_dir.ts";
import { cli, withFakeAgent } from "../tests/support/cli.ts";
import { renderStatus } from "./status.ts";
import { formatAge } from "./_table.ts";

const POD = AddRequestSchema.parse({
  containerId: "0123456789abcdef0123",
  ifName: "eth0",
  netns: "/run/netns/pod-1",
  network: "enim-net",
  pod: { namespace: "default", name: "web-0" },
  mode: "interface",
});

/** The status text of a ready agent (version 0.1.0, able to allocate, no ENI unless `s` lists some). */
function statusText(s: Record<string, unknown>): string {
  return renderStatus(
    StatusSchema.parse({ version: "0.1.0", ready: true, canAllocate: true, enis: [], ...s }),
  );
}

Deno.test("enim status prints the ENI table and pool counts", async () => {
  await withFakeAgent(async (socket, m) => {
    await m.add(POD);
    const r = await cli(["status", "--socket", socket]);
    assertEquals([r.code, r.err], [0, ""]);
    const lines = r.out.split("\n");
    assertEquals(lines[0], "provider mock, agent 0.1.0, ready, can allocate");
    assertEquals(lines[1], "pool: 2 free, 1 owned, 0 recycling, 0 more attachable");
    assertMatch(
      lines[3],
      /^ENI\s+MAC\s+DEVICE\s+IPV4\s+IPV6\s+STATE\s+OWNER\s+CONTAINER\s+NETNS\s+AGE$/,
    );
    assertMatch(
      lines[4],
      /^eni-mock-0001\s+02:00:00:00:00:01\s+eni0001\s+10\.0\.1\.10\/24\s+fd00::10\/64\s+ready\s+default\/web-0\s+0123456789ab\s+\/run\/netns\/pod-1\s+1m$/,
    );
    assertMatch(
      lines[5],
      /^eni-mock-0002\s+02:00:00:00:00:02\s+eni0002\s+10\.0\.1\.11\/24\s+-\s+free\s+-\s+-\s+-\s+-$/,
    );
  });
});

Deno.test("enim status --json prints the Status object", async () => {
  await withFakeAgent(async (socket) => {
    const r = await cli(["status", "--json", "--socket", socket]);
    assertEquals(r.code, 0);
    const s = StatusSchema.parse(JSON.parse(r.out));
    assertEquals(s.pool.free, 3);
  });
});

Deno.test("enim status exits 3 when the agent answers not ready, printing what it printed before", async () => {
  await withFakeAgent(async (socket, m) => {
    const ready = [
      await cli(["status", "--socket", socket]),
      await cli(["status", "--json", "--socket", socket]),
    ];
    assertEquals(ready.map((r) => r.code), [0, 0]);
    m.ready = false;
    const text = await cli(["status", "--socket", socket]);
    const json = await cli(["status", "--json", "--socket", socket]);
    assertEquals([text.code, json.code], [3, 3]);
    assertEquals([text.err, json.err], ["", ""]);
    assertEquals(text.out, ready[0].out.replace(", ready,", ", NOT READY,"));
    assertEquals(JSON.parse(json.out), { ...JSON.parse(ready[1].out), ready: false });
  });
});

Deno.test("enim status says clearly when the agent is not running", async () => {
  await withRunDir(async (dir) => {
    const r = await cli(["status", "--socket", `${dir}/enim.sock`]);
    assertEquals([r.code, r.out], [1, ""]);
    assertMatch(
      r.err,
      new RegExp(`^the enim agent is not running: cannot connect to ${dir}/enim\\.sock`),
    );
  });
});

Deno.test("enim status through the real entry point explains a socket it may not use", async () => {
  await withSandbox(async (_dir, sb) => {
    // Outside /run/enim: the set may not read or write it (the connect never reaches it).
    const other = "/tmp/enim-other.sock";
    const r = await runEnim(["status", "--socket", other], { sandbox: sb });
    assertEquals(r.code, 1);
    assertStringIncludes(
      r.stderr,
      `not allowed to connect to ${other}: the enim permission set reads and writes sockets only in /run/enim`,
    );
  });
});

Deno.test("ages are short", () => {
  const now = Date.parse("2026-01-01T12:00:00Z");
  const at = (s: number) => new Date(now - s * 1000).toISOString();
  assertEquals(
    [formatAge(at(5), now), formatAge(at(125), now), formatAge(at(3 * 3600 + 300), now)],
    ["5s", "2m", "3h05m"],
  );
  assertEquals([formatAge(at(50 * 3600), now), formatAge(null, now)], ["2d02h", "-"]);
});

Deno.test("enim status shows each profile's pool and a held ENI's time left", () => {
  const held = new Date(Date.now() + 4 * 60_000 + 30_000).toISOString();
  const eni = (id: string, profile: string, state: "free" | "owned") => ({
    id,
    mac: "02:00:00:00:00:01",
    ipv4: null,
    ipv6: null,
    subnetId: null,
    state,
    owner: null,
    profile,
    securityGroupIds: [],
    enterpriseSecurityGroupIds: [],
    description: null,
    cloudState: "ok" as const,
    device: "enim1",
  });
  const text = statusText({
    provider: "mock",
    pool: {
      free: 1,
      owned: 1,
      recycling: 0,
      held: 1,
      attachable: 2,
      profiles: {
        default: { free: 1, owned: 0, recycling: 0, held: 0 },
        b: { free: 0, owned: 1, recycling: 0, held: 1 },
      },
    },
    enis: [
      { ...eni("eni-1", "default", "free"), attachment: null },
      {
        ...eni("eni-2", "b", "owned"),
        attachment: {
          containerId: "c1",
          ifName: "eth0",
          pod: "db/db-0",
          podUid: null,
          network: "enim",
          netns: "/run/netns/x",
          mode: "interface",
          state: "held",
          eniId: "eni-2",
          mac: "02:00:00:00:00:01",
          nodeName: "enim1",
          createdAt: new Date().toISOString(),
          updatedAt: new Date().toISOString(),
          profile: "b",
          sticky: true,
          holdUntil: held,
        },
      },
    ],
  });
  const lines = text.split("\n");
  assertEquals(
    lines[1],
    "pool: 1 free, 1 owned, 0 recycling, 1 held, 2 more attachable (shared by all profiles)",
  );
  assertMatch(lines[3], /^PROFILE\s+FREE\s+OWNED\s+RECYCLING\s+HELD$/);
  assertMatch(lines[4], /^default\s+1\s+0\s+0\s+0$/);
  assertMatch(lines[5], /^b\s+0\s+1\s+0\s+1$/);
  assertMatch(lines[7], /^ENI\s+PROFILE\s+MAC/);
  assertMatch(lines[9], /^eni-2\s+b\s+.*held \(4m left\)\s+db\/db-0/);
});

Deno.test("enim status names lost and quarantined ENIs an operator must act on", () => {
  const text = statusText({
    provider: "bce",
    pool: { free: 0, owned: 1, recycling: 0, attachable: 0 },
    enis: [{
      id: "eni-x",
      mac: "02:00:00:00:00:09",
      ipv4: null,
      ipv6: null,
      state: "owned",
      owner: { pod: "ns/p", containerId: "c1", ifName: "eth0" },
      cloudState: "lost",
      device: null,
      attachment: null,
    }],
    providerDetails: { quarantined: 1 },
  });
  assertStringIncludes(text, "LOST: eni-x (02:00:00:00:00:09) of ns/p is gone from the cloud");
  assertStringIncludes(text, "QUARANTINED: 1 ENI(s) stuck");
});

Deno.test("enim status lists the ENIs this node parked in the VPC and the claims it made", () => {
  const now = Date.now();
  const text = statusText({
    provider: "bce",
    pool: { free: 0, owned: 0, recycling: 0, attachable: 4 },
    enis: [],
    sticky: {
      parked: [{
        eniId: "eni-parked01",
        pod: "payments/db-0",
        ifName: "eth0",
        profile: "db",
        state: "parked",
        since: new Date(now - 61_000).toISOString(),
        until: new Date(now + 4 * 60_000 + 30_000).toISOString(),
      }],
      claims: [{
        eniId: "eni-claimed1",
        pod: "payments/db-1",
        ifName: "eth0",
        from: "i-nodea001",
        at: new Date(now - 5_000).toISOString(),
      }],
    },
  });
  const lines = text.split("\n");
  const at = lines.findIndex((l) => l.startsWith("parked in the VPC by this node"));
  assertMatch(lines[at + 1], /^PARKED ENI\s+POD\s+IFNAME\s+PROFILE\s+STATE\s+SINCE\s+EXPIRES IN$/);
  assertMatch(lines[at + 2], /^eni-parked01\s+payments\/db-0\s+eth0\s+db\s+parked\s+1m\s+4m$/);
  const c = lines.findIndex((l) => l.startsWith("claimed by this node"));
  assertMatch(lines[c + 1], /^CLAIMED ENI\s+POD\s+IFNAME\s+FROM\s+AGO$/);
  assertMatch(lines[c + 2], /^eni-claimed1\s+payments\/db-1\s+eth0\s+i-nodea001\s+5s$/);
  // Nothing parked and no claim: no such sections.
  const plain = statusText({
    provider: "bce",
    pool: { free: 0, owned: 0, recycling: 0, attachable: 4 },
  });
  assertEquals(plain.includes("parked in the VPC"), false);
});

Deno.test("enim status shows what the device plugin advertises and why devices are Unhealthy", async (t) => {
  const base = {
    version: "0.1.0",
    provider: "mock",
    ready: true,
    canAllocate: true,
    pool: { free: 2, owned: 1, recycling: 0, attachable: 2 },
    enis: [],
  };
  const plugin = {
    state: "registered",
    reason: null,
    resourceName: "enim.dev/eni",
    socket: "/var/lib/kubelet/device-plugins/enim.sock",
    registeredAt: "2025-01-01T00:00:00.000Z",
    streams: 1,
    limit: 6,
    healthy: 5,
    unhealthy: 1,
    unhealthyReasons: [{
      reason: "foreign",
      devices: 1,
      message: '1 slot of the node\'s ENI limit taken by 1 ENI enim does not own ("eni-x")',
    }],
  };
  /** The status text with the plugin's fields `over` changed. */
  const withPlugin = (over: Record<string, unknown> = {}) =>
    renderStatus(StatusSchema.parse({ ...base, devicePlugin: { ...plugin, ...over } }));
  await t.step("registered, one device Unhealthy", () => {
    const lines = withPlugin().split("\n");
    assertEquals(
      lines[3],
      "device plugin enim.dev/eni: registered with kubelet, 6 devices advertised: 5 healthy, 1 unhealthy",
    );
    assertEquals(
      lines[4],
      'UNHEALTHY: 1 device: 1 slot of the node\'s ENI limit taken by 1 ENI enim does not own ("eni-x")',
    );
  });
  await t.step("not registered: kubelet's silence said", () => {
    const text = withPlugin({
      state: "registering",
      reason: 'kubelet did not answer Register on "/x/kubelet.sock" within 5 s',
      unhealthy: 0,
      healthy: 6,
      unhealthyReasons: [],
    });
    assertStringIncludes(
      text,
      "device plugin enim.dev/eni: NOT REGISTERED with kubelet, 6 devices advertised: 6 healthy, 0 unhealthy\n" +
        '  kubelet did not answer Register on "/x/kubelet.sock" within 5 s\n',
    );
  });
  await t.step("off, and why", () => {
    const text = withPlugin({
      state: "off",
      reason: "devicePlugin.enabled is false",
      socket: null,
      limit: null,
      healthy: 0,
      unhealthy: 0,
      unhealthyReasons: [],
    });
    assertStringIncludes(text, "device plugin enim.dev/eni: off (devicePlugin.enabled is false)\n");
  });
  await t.step("an older agent without one: nothing", () => {
    assertEquals(renderStatus(StatusSchema.parse(base)).includes("device plugin"), false);
  });
});

Deno.test("enim status shows NetworkPolicy's sync, its caches and each local pod's policies", () => {
  const cache = (resource: string, restarts: number) => ({
    resource,
    synced: false,
    objects: 0,
    relists: 0,
    watchRestarts: restarts,
    errors: 1,
    lastError: resource === "pods" ? "GET /api/v1/pods failed: connection refused" : null,
    lastEventAt: null,
    bookmarks: resource === "pods" ? "seen" as const : "none" as const,
    silentWatches: 0,
    enforcedResourceVersion: null,
  });
  const text = statusText({
    provider: "mock",
    pool: { free: 1, owned: 1, recycling: 0, attachable: 0 },
    policy: {
      synced: false,
      pendingEvents: 0,
      loadFailures: 0,
      caches: [cache("pods", 2), cache("namespaces", 1)],
      pods: [{
        pod: "shop/db",
        key: "c1/eth0",
        nodeIfName: "enimh0123456789",
        policies: 2,
        ingressIsolated: true,
        egressIsolated: false,
        state: "waiting",
      }],
      unreadable: [{
        policy: "shop/future",
        resourceVersion: "12",
        reason: 'spec.ingress.0.ports.0.protocol: Invalid option (got "FOO")',
        selects: "app=db",
        wholeNamespace: false,
        ingress: true,
        egress: false,
      }, {
        policy: "shop/gt",
        resourceVersion: "13",
        reason: "spec.podSelector.matchExpressions.0.operator: Invalid option",
        selects: "<all>",
        wholeNamespace: true,
        ingress: true,
        egress: true,
      }],
    },
  });
  assertStringIncludes(
    text,
    'UNREADABLE NetworkPolicy shop/future: spec.ingress.0.ports.0.protocol: Invalid option (got "FOO"); failing closed: pods app=db in shop isolated for ingress, nothing admitted by it\n' +
      "UNREADABLE NetworkPolicy shop/gt: spec.podSelector.matchExpressions.0.operator: Invalid option; failing closed: every pod of namespace shop isolated for ingress and egress, nothing admitted by it\n",
  );
  assertStringIncludes(
    text,
    "NetworkPolicy: NOT SYNCED (new pods' ADDs fail with 11 until it is), last event never, 3 watch restarts, 0 events pending\n" +
      "  pods: GET /api/v1/pods failed: connection refused\n" +
      "  namespaces: the API server sends no watch bookmarks: a dead watch is noticed only past its timeout (kubernetes.watchTimeoutSeconds)\n",
  );
  assertMatch(
    text,
    /POD\s+POLICIES\s+ISOLATED\s+NODE END\s+STATE\nshop\/db\s+2\s+ingress\s+enimh0123456789\s+waiting/,
  );
});

Deno.test("enim status says when NetworkPolicy refuses new pods under kube-proxy's IPVS mode, and nothing when it does not", () => {
  const ipvs = (refusing: boolean) => ({
    refusing,
    link: refusing,
    services: 0,
    reason: refusing ? 'link "kube-ipvs0"' : "none found",
    checkedAt: "2026-11-27T10:00:00.000Z",
    refusedAdds: refusing ? 3 : 0,
  });
  const base = { provider: "mock", pool: { free: 1, owned: 0, recycling: 0, attachable: 0 } };
  assertStringIncludes(
    statusText({ ...base, ipvs: ipvs(true) }),
    `NETWORKPOLICY REFUSES NEW PODS: kube-proxy's IPVS mode (link "kube-ipvs0") bypasses enim's node-side rules; ADDs fail with 111 (3 so far) until kube-proxy runs in iptables or nftables mode, or networkPolicy.enabled is false\n`,
  );
  assertEquals(statusText({ ...base, ipvs: ipvs(false) }), statusText(base));
});
