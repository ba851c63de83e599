/**
 * The NetworkPolicy enforcer against the test API server (tests/support/kube_apiserver.ts)
 * and the fake device layer (no root): its bounded waits and errors (CNI 11), what it
 * loads where and when, and that it never touches a table before its first sync.
 */
import { assert, assertEquals, assertRejects, assertStringIncludes } from "../../lib/assert.ts";
import { poll } from "../../lib/async.ts";
import { Logger } from "../../lib/log.ts";
import type { KubeApiServer } from "../../tests/support/kube_apiserver.ts";
import {
  policyPod,
  testKube,
  until,
  withTestApiServer,
} from "../../tests/support/enforcer_fixtures.ts";
import { makeNamespace, makePod } from "../../tests/support/kube_objects.ts";
import { FakeDeviceLayer, NODE } from "../../netns/fake.ts";
import { ModelDeviceLayer } from "../../tests/support/nft_model.ts";
import { ApiError } from "../../api/schema.ts";
import { NOT_SYNCED, PolicyEnforcer } from "./enforcer.ts";
import { InMemoryPolicyMemory } from "./_memory.ts";
import type { PolicyPod, RestoredPolicyPod } from "../../manager/types.ts";

/**
 * An enforcer over the test API server; the manager's hand-over of the node's pods
 * (`restore`) made at once with `restored` (null: the test makes it).
 */
function enforcer(
  server: KubeApiServer,
  devices: FakeDeviceLayer,
  syncWaitMs = 200,
  restored: RestoredPolicyPod[] | null = [],
) {
  const kube = testKube(server);
  const e = new PolicyEnforcer({ kube, devices, syncWaitMs, getPodTimeoutMs: 1_000 });
  if (restored) e.restore(restored);
  return e;
}

function pod(namespace: string, name: string, ip?: string) {
  return makePod({ namespace, name, labels: { app: name }, nodeName: "n1", ip });
}

const add = policyPod;

/** ADD's policy step as the plug takes it: prepare, then the pod's table (its own call). */
async function admit(e: PolicyEnforcer, p: PolicyPod): Promise<string> {
  const r = await e.prepare(p);
  assert(r, "policy is on: prepare gives the pod's table");
  return await r.podRuleset();
}

const denyAll = (namespace: string) => ({
  metadata: { namespace, name: "deny" },
  spec: { podSelector: {}, policyTypes: ["Ingress"] },
});

Deno.test("prepare() waits for the first sync, bounded, then fails with CNI 11's policy_unavailable", async () => {
  await withTestApiServer(async (server) => {
    await server.down();
    const devices = new FakeDeviceLayer();
    const e = enforcer(server, devices);
    try {
      const err = await assertRejects(
        () => e.prepare(add("a/web", "10.1.0.1", "enimh1")),
        ApiError,
      );
      assertEquals([err.code, err.message], ["policy_unavailable", NOT_SYNCED]);
      // The wait an ADD makes before it takes an ENI gives up the same way.
      const before = await assertRejects(() => e.whenSynced()!, ApiError);
      assertEquals([before.code, before.message], ["policy_unavailable", NOT_SYNCED]);
      assertEquals(devices.rulesets.size, 0, "nothing loaded");
      assertEquals(e.status().synced, false);
    } finally {
      await e.close();
    }
  });
});

Deno.test("whenSynced() waits for the manager's hand-over too, not only for the caches' sync: bounded while it has not come, resolved once it has", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    const devices = new FakeDeviceLayer();
    const e = enforcer(server, devices, 200, null);
    try {
      await until("the caches have synced", () => e.status().caches.every((c) => c.synced));
      const early = await assertRejects(() => e.whenSynced()!, ApiError);
      assertEquals([early.code, early.message], ["policy_unavailable", NOT_SYNCED]);
      assertEquals(e.phase, "waiting");
      const wait = e.whenSynced();
      assert(wait, "not served yet: an ADD waits");
      e.restore([]);
      await wait;
      assertEquals(e.whenSynced(), null, "served: an ADD waits for nothing");
    } finally {
      await e.close();
    }
  });
});

Deno.test("a pod the cache lacks is fetched from the API server; one it does not have fails the ADD with 11", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    const devices = new FakeDeviceLayer();
    const e = enforcer(server, devices);
    try {
      assert(await e.waitSynced(10_000));
      assertEquals(e.whenSynced(), null, "synced: an ADD waits for nothing");
      const err = await assertRejects(
        () => e.prepare(add("a/web", "10.1.0.1", "enimh1")),
        ApiError,
      );
      assertEquals(err.code, "policy_unavailable");
      assertStringIncludes(err.message, `has no pod "a/web"`);
      // Created a moment ago: the watch may not have brought it yet; the GET does.
      server.put("pods", pod("a", "web"));
      const r = await admit(e, add("a/web", "10.1.0.1", "enimh1"));
      assertEquals(r, "", "known now, and no policy selects it: no table");
      assertEquals(e.status().pods.map((p) => [p.pod, p.policies]), [["a/web", 0]]);
      assert(server.requests.some((q) => q.path === "/api/v1/namespaces/a/pods/web"));
    } finally {
      await e.close();
    }
  });
});

Deno.test("a pod no policy selects gets no table and no node chains; the first policy that selects it makes both, and its removal takes the chains", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("pods", pod("a", "web"));
    const devices = new FakeDeviceLayer();
    devices.addNetns("/run/netns/web");
    const e = enforcer(server, devices);
    try {
      assert(await e.waitSynced(10_000));
      const r = await admit(e, add("a/web", "10.1.0.1", "enimh1"));
      assertEquals(r, "", "not isolated: no table rides the plug");
      await e.committed("c-enimh1/eth0", "/run/netns/web");
      const node = devices.rulesets.get(NODE)!;
      assert(!node.some((t) => t.includes("enimh1")), "no chains on the node either");
      assertStringIncludes(
        node[0],
        "delete table inet enim_policy",
        "the agent's first load starts clean",
      );
      server.put("networkpolicies", denyAll("a"));
      await until("web's first table", () => devices.rulesets.get("/run/netns/web")?.length);
      const table = devices.rulesets.get("/run/netns/web")!.at(-1)!;
      assertStringIncludes(table, "table inet enim_policy {");
      assertStringIncludes(table, 'counter name "drop_ingress" drop');
      await until(
        "the node's chains for web, once a policy selects it",
        () => devices.rulesets.get(NODE)!.some((t) => t.includes('"enimh1" : jump in_enimh1')),
      );
      assertEquals(e.status().pods.map((p) => [p.pod, p.policies, p.ingressIsolated]), [
        ["a/web", 1, true],
      ]);
      assertEquals(e.view("a/web")?.ingress, { isolated: true, rules: [] });
      await e.removed("c-enimh1/eth0");
      assertStringIncludes(
        devices.rulesets.get(NODE)!.at(-1)!,
        "delete chain inet enim_policy in_enimh1",
      );
      assertEquals(e.status().pods, []);
    } finally {
      await e.close();
    }
  });
});

Deno.test("an enforcer that starts while the API server is down touches no table until it has synced", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("pods", pod("a", "web", "10.1.0.1"));
    server.put("networkpolicies", denyAll("a"));
    await server.down();
    const devices = new FakeDeviceLayer();
    devices.addNetns("/run/netns/web");
    const e = enforcer(server, devices, 200, null);
    try {
      e.restore([{
        pod: "a/web",
        key: "c-1/eth0",
        addresses: { ipv4: "10.1.0.1" },
        eniIfName: "eth0",
        nodeIfName: "enimh1",
        netns: "/run/netns/web",
      }]);
      assertEquals(await e.waitSynced(300), false);
      assertEquals(devices.rulesets.size, 0, "the kernel keeps what the last agent loaded");
      assertEquals(e.status().pods.map((p) => p.state), ["waiting"]);
      server.up();
      assert(await e.waitSynced(10_000));
      await until("web enforced", () => e.status().pods[0].state === "enforced");
      assertStringIncludes(devices.rulesets.get("/run/netns/web")!.at(-1)!, "drop_ingress");
      assertStringIncludes(devices.rulesets.get(NODE)![0], "jump in_enimh1");
    } finally {
      await e.close();
    }
  });
});

Deno.test("a failed load is retried until the pod's table has its deny", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("pods", pod("a", "web"));
    const devices = new FakeDeviceLayer();
    devices.addNetns("/run/netns/web");
    const e = enforcer(server, devices);
    try {
      assert(await e.waitSynced(10_000));
      await admit(e, add("a/web", "10.1.0.1", "enimh1"));
      await e.committed("c-enimh1/eth0", "/run/netns/web");
      const loads = devices.rulesets.get("/run/netns/web")?.length ?? 0;
      devices.failOn("nft", undefined, 2);
      server.put("networkpolicies", denyAll("a"));
      await poll(
        () =>
          Promise.resolve(
            (devices.rulesets.get("/run/netns/web")?.length ?? 0) > loads &&
                e.status().pods[0].state === "enforced" || null,
          ),
        { timeoutMs: 15_000, intervalMs: 20 },
      );
      assert(e.status().loadFailures >= 1);
      assertStringIncludes(devices.rulesets.get("/run/netns/web")!.at(-1)!, "drop_ingress");
    } finally {
      await e.close();
    }
  });
});

/**
 * Namespace a with web, the pods `clients` (app=client), and a policy isolating web that
 * admits the clients; a fake device layer with web's and c1's namespaces.
 */
function webAndClients(server: KubeApiServer, clients: string[]): FakeDeviceLayer {
  server.put("namespaces", makeNamespace("a"));
  server.put("pods", pod("a", "web"));
  for (const n of clients) {
    server.put(
      "pods",
      makePod({ namespace: "a", name: n, labels: { app: "client" }, nodeName: "n1" }),
    );
  }
  server.put("networkpolicies", {
    metadata: { namespace: "a", name: "web-from-clients" },
    spec: {
      podSelector: { matchLabels: { app: "web" } },
      ingress: [{ from: [{ podSelector: { matchLabels: { app: "client" } } }] }],
    },
  });
  const devices = new FakeDeviceLayer();
  for (const n of ["web", "c1"]) devices.addNetns(`/run/netns/${n}`);
  return devices;
}

/** Whether any load of the table `netns` (or the node's, {@linkcode NODE}) named `ip`. */
const loaded = (devices: FakeDeviceLayer, netns: string, ip: string) =>
  (devices.rulesets.get(netns) ?? []).some((t) => t.includes(ip));

Deno.test("the edits an ADD brings to other pods' tables and to the node's sets wait until it has answered", async () => {
  await withTestApiServer(async (server) => {
    const devices = webAndClients(server, ["c1", "c2"]);
    const e = enforcer(server, devices);
    try {
      assert(await e.waitSynced(10_000));
      const web = await admit(e, add("a/web", "10.1.0.1", "enimh1"));
      assertStringIncludes(web, 'counter name "drop_ingress" drop', "web is isolated");
      await e.committed("c-enimh1/eth0", "/run/netns/web");
      // web's own ADD's edits, after its answer, done.
      await until("no event pending", () => e.status().pendingEvents === 0);
      await new Promise((r) => setTimeout(r, 200));
      // c1's ADD: its address joins web's client set, in web's table and on the node, only
      // once that ADD has answered.
      const c1 = await admit(e, add("a/c1", "10.1.0.7", "enimh2"));
      assertEquals(c1, "", "no policy selects c1");
      // Time for any load the ADD started to land.
      await new Promise((r) => setTimeout(r, 100));
      assert(!loaded(devices, "/run/netns/web", "10.1.0.7"), "web's table waits for c1's answer");
      assert(!loaded(devices, NODE, "10.1.0.7"), "the node's set waits for c1's answer");
      await e.committed("c-enimh2/eth0", "/run/netns/c1");
      await until(
        "c1's address is in web's table and on the node once its ADD has answered",
        () => loaded(devices, "/run/netns/web", "10.1.0.7") && loaded(devices, NODE, "10.1.0.7"),
      );
    } finally {
      await e.close();
    }
  });
});

Deno.test("a set edit that fails is replaced by its sets whole at once, and only that counts as a failed load", async () => {
  await withTestApiServer(async (server) => {
    const devices = webAndClients(server, ["c1"]);
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const e = new PolicyEnforcer({ kube: testKube(server), devices, log, syncWaitMs: 5_000 });
    e.restore([]);
    try {
      assert(await e.waitSynced(10_000));
      await admit(e, add("a/web", "10.1.0.1", "enimh1"));
      await e.committed("c-enimh1/eth0", "/run/netns/web");
      await until("no event pending", () => e.status().pendingEvents === 0);
      assert(await e.idle(10_000), "the enforcer is idle");
      // c1's answered ADD edits web's client set and the node's: the first of those edits
      // fails (in a burst of events, the element it deletes may be gone already).
      devices.failOn("nft");
      await admit(e, add("a/c1", "10.1.0.7", "enimh2"));
      await e.committed("c-enimh2/eth0", "/run/netns/c1");
      await until(
        "c1's address in web's table and on the node",
        () => loaded(devices, "/run/netns/web", "10.1.0.7") && loaded(devices, NODE, "10.1.0.7"),
      );
      assert(await e.idle(10_000), "the enforcer is idle");
      assertEquals(e.status().loadFailures, 0, "the edit's own failure is not a failed load");
      // (The pods hold the runtime's default NET_RAW on a node without the raw-socket
      // guard: that is flagged, once per pod, and is not what this test is about.)
      const warned = lines.map((l) => JSON.parse(l))
        .filter((l) => l.level === "warn" && !/can reach past it/.test(l.msg));
      assertEquals(warned.map((l) => l.msg), [], "nothing is warned");
    } finally {
      await e.close();
    }
  });
});

/** A restored attachment of pod `namespace/name` at node end `end`, in `/run/netns/<name>`. */
const restored = (pod: string, ip: string, end: string): RestoredPolicyPod => ({
  pod,
  key: `c-${end}/eth0`,
  addresses: { ipv4: ip },
  eniIfName: "eth0",
  nodeIfName: end,
  netns: `/run/netns/${pod.split("/")[1]}`,
});

Deno.test("a restart never leaves a pod without node chains: nothing is loaded before the manager's hand-over, the first render holds every pod, and a pod the cluster lost keeps its chains", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("pods", pod("a", "web", "10.1.0.1"));
    server.put("pods", pod("a", "ghost", "10.1.0.2"));
    server.put("networkpolicies", denyAll("a"));
    const devices = new ModelDeviceLayer();
    for (const n of ["web", "ghost"]) devices.addNetns(`/run/netns/${n}`);
    devices.nodeAddrs = { addresses: ["10.0.0.254"], primary: {} };
    const pods = [
      restored("a/web", "10.1.0.1", "enimh1"),
      restored("a/ghost", "10.1.0.2", "enimh2"),
    ];
    // The agent before the restart: both pods' chains on the node.
    const before = enforcer(server, devices, 200, pods);
    try {
      assert(await before.waitSynced(10_000));
      assert(await before.idle(10_000));
    } finally {
      await before.close();
    }
    const chains = (end: string) => {
      const l = devices.model.nodeLinks(NODE, end);
      return [l.ingress && devices.model.rules(NODE, l.ingress), l.egress];
    };
    const ghostBefore = chains("enimh2");
    assertStringIncludes(String(ghostBefore[0]), "drop_in_enimh2", "ghost is isolated");
    assertStringIncludes(String(chains("enimh1")[0]), "drop_in_enimh1", "web is isolated");
    // While the agent is away, ghost is force-deleted from the cluster.
    server.remove("pods", "a", "ghost");
    // From the start on, every load of the node's table keeps both pods' chains.
    const lost: string[] = [];
    devices.onLoad = (where) => {
      if (where !== NODE) return;
      for (const end of ["enimh1", "enimh2"]) {
        const l = devices.model.nodeLinks(NODE, end);
        if (!l.ingress || !devices.model.rules(NODE, l.ingress)?.length) lost.push(end);
      }
    };
    const loads = devices.rulesets.get(NODE)!.length;
    const after = enforcer(server, devices, 200, null);
    try {
      // The caches sync; the manager has not handed the pods over yet (its reconcile).
      await until("the caches' sync", () => after.status().caches.every((c) => c.synced));
      await new Promise((r) => setTimeout(r, 200));
      assertEquals(devices.rulesets.get(NODE)!.length, loads, "no node load before the hand-over");
      assertEquals(after.phase, "waiting");
      after.restore(pods);
      assert(await after.waitSynced(10_000));
      assert(await after.idle(10_000), JSON.stringify(devices.refused));
      assert(devices.rulesets.get(NODE)!.length > loads, "the node's table was rendered");
      assertEquals(lost, [], "no load left a pod without its chains");
      assertEquals(chains("enimh2"), ghostBefore, "ghost's chains are as the last agent loaded");
      assertEquals(after.status().pods.map((p) => [p.pod, p.state]), [
        ["a/ghost", "unknown"],
        ["a/web", "enforced"],
      ]);
      // Once ghost's attachment goes, the node's table is made again without what the
      // earlier agent left.
      devices.onLoad = null;
      await after.removed("c-enimh2/eth0");
      assert(await after.idle(10_000));
      assertEquals(devices.model.nodeLinks(NODE, "enimh2"), {});
      assertEquals(devices.model.rules(NODE, "in_enimh2"), undefined, "its chains are gone");
      assertStringIncludes(String(chains("enimh1")[0]), "drop_in_enimh1");
    } finally {
      await after.close();
    }
  });
});

Deno.test("a force-deleted pod, then a change of the node's addresses: the queue goes on, the pod keeps its rules with the node's new addresses, and nothing is unhandled", async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (e: PromiseRejectionEvent) => {
    e.preventDefault();
    unhandled.push(e.reason);
  };
  globalThis.addEventListener("unhandledrejection", onUnhandled);
  try {
    await withTestApiServer(async (server) => {
      server.put("namespaces", makeNamespace("a"));
      server.put("pods", pod("a", "web"));
      server.put("pods", pod("a", "api"));
      server.put("networkpolicies", denyAll("a"));
      const devices = new ModelDeviceLayer();
      for (const n of ["web", "api"]) devices.addNetns(`/run/netns/${n}`);
      devices.nodeAddrs = { addresses: ["10.0.0.254"], primary: {} };
      const kube = testKube(server);
      const e = new PolicyEnforcer({ kube, devices, nodeAddressesEveryMs: 20 });
      e.restore([]);
      try {
        assert(await e.waitSynced(10_000));
        const text = await admit(e, add("a/web", "10.1.0.1", "enimh1"));
        devices.model.apply("/run/netns/web", text);
        await e.committed("c-enimh1/eth0", "/run/netns/web");
        const rules = devices.model.view("/run/netns/web").chains;
        assertStringIncludes(JSON.stringify(rules), "drop_ingress");
        // kubectl delete --force: the Pod is gone, the sandbox (and its attachment) stays.
        server.remove("pods", "a", "web");
        await until(
          "the pod gone from the cache",
          () => e.status().caches.find((c) => c.resource === "pods")?.objects === 1,
        );
        // Then any change of the node's addresses (a NodeLocal DNS rollout, a temporary IPv6).
        devices.nodeAddrs = { addresses: ["10.0.0.254", "169.254.20.10"], primary: {} };
        const nodeSet = () => devices.model.view("/run/netns/web").sets.node_4 ?? [];
        await until(
          "web's table has the node's new address",
          () => nodeSet().includes("169.254.20.10"),
        );
        assertEquals(devices.model.view("/run/netns/web").chains, rules, "web keeps its rules");
        // The queue still runs: the next ADD is answered and its pod enforced.
        let timer: ReturnType<typeof setTimeout> | undefined;
        const late = new Promise<never>((_, reject) =>
          timer = setTimeout(
            () => reject(new Error("the ADD was not answered: the queue is dead")),
            10_000,
          )
        );
        const api = await Promise.race([admit(e, add("a/api", "10.1.0.2", "enimh2")), late])
          .finally(() => clearTimeout(timer));
        assertStringIncludes(api, 'counter name "drop_ingress" drop');
        await e.committed("c-enimh2/eth0", "/run/netns/api");
        assert(await e.idle(10_000));
        assertEquals(e.status().pods.map((p) => [p.pod, p.state]), [
          ["a/api", "enforced"],
          ["a/web", "enforced"],
        ]);
      } finally {
        await e.close();
      }
    });
    await new Promise((r) => setTimeout(r, 0));
    assertEquals(unhandled, []);
  } finally {
    globalThis.removeEventListener("unhandledrejection", onUnhandled);
  }
});

Deno.test("a DEL's address leaves the other pods' sets and its tracked connections go, after those edits and before removed() resolves, though the API still shows the pod with it; the next pod on that address (another uid) does not inherit it", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put(
      "pods",
      makePod({ namespace: "a", name: "web", labels: { app: "web" }, nodeName: "n1" }),
    );
    const c1 = () =>
      makePod({
        namespace: "a",
        name: "c1",
        labels: { app: "client" },
        nodeName: "n1",
        ip: "10.1.0.7",
      });
    server.put("pods", c1());
    server.put("networkpolicies", {
      metadata: { namespace: "a", name: "web-from-clients" },
      spec: {
        podSelector: { matchLabels: { app: "web" } },
        ingress: [{ from: [{ podSelector: { matchLabels: { app: "client" } } }] }],
      },
    });
    const devices = new FakeDeviceLayer();
    for (const n of ["web", "c1", "e"]) devices.addNetns(`/run/netns/${n}`);
    const e = enforcer(server, devices);
    try {
      assert(await e.waitSynced(10_000));
      await admit(e, add("a/web", "10.1.0.1", "enimh1"));
      await e.committed("c-enimh1/eth0", "/run/netns/web");
      const uid = (name: string) => server.get("pods", `a/${name}`)!.metadata.uid as string;
      await admit(e, { ...add("a/c1", "10.1.0.7", "enimh2"), uid: uid("c1") });
      await e.committed("c-enimh2/eth0", "/run/netns/c1");
      const inWeb = () =>
        e.compiled("a/web")!.sets.some((s) => s.ipv4.includes("10.1.0.7" as never));
      await until("c1 is admitted", () => inWeb());
      // Deleted in the API, still Running with its address; then its DEL.
      const terminating = c1();
      terminating.metadata.deletionTimestamp = new Date().toISOString();
      terminating.metadata.deletionGracePeriodSeconds = 30;
      server.put("pods", terminating);
      await new Promise((r) => setTimeout(r, 200));
      assert(inWeb(), "Terminating, it still runs");
      const before = devices.calls.length;
      await e.removed("c-enimh2/eth0");
      assert(!inWeb(), "after its DEL, not c1's");
      const after = devices.calls.slice(before);
      const at = (op: string, netns: string | null) =>
        after.findIndex((c) => c.op === op && (c.args as { netns: string | null }).netns === netns);
      assert(at("loadRuleset", "/run/netns/web") >= 0, "web's set edited");
      assert(
        at("flushConntrack", "/run/netns/web") > at("loadRuleset", "/run/netns/web"),
        "then its connections to and from the address go, in web",
      );
      assert(at("flushConntrack", null) > at("loadRuleset", null), "and on the node");
      assertEquals(
        devices.conntrackFlushes.map((f) => [f.netns, f.addresses]).sort(),
        [["/run/netns/web", ["10.1.0.7"]], [NODE, ["10.1.0.7"]]],
      );
      // A new pod, another uid, gets the same address: it is not c1.
      server.put(
        "pods",
        makePod({ namespace: "a", name: "e", labels: { app: "e" }, nodeName: "n1" }),
      );
      await admit(e, { ...add("a/e", "10.1.0.7", "enimh3"), uid: uid("e") });
      await e.committed("c-enimh3/eth0", "/run/netns/e");
      await new Promise((r) => setTimeout(r, 200));
      assert(!inWeb(), "e's address is e's");
    } finally {
      await e.close();
    }
  });
});

Deno.test("a policy table taken away is found by the table check and loaded again, counted and logged, and never reported enforced while it is missing", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("pods", pod("a", "web", "10.1.0.1"));
    server.put("networkpolicies", denyAll("a"));
    const devices = new FakeDeviceLayer();
    devices.addNetns("/run/netns/web");
    devices.nodeAddrs = { addresses: ["10.0.0.254"], primary: {} };
    const lines: string[] = [];
    const repairs: string[] = [];
    const metrics = {
      policyEnforced() {},
      policyLoadFailed() {},
      tableRepaired: (table: string, place: string) => repairs.push(`${table} ${place}`),
    };
    // No periodic check at first: the status's own check is what finds the table gone.
    const still = new PolicyEnforcer({
      kube: testKube(server),
      devices,
      syncWaitMs: 200,
      tableCheckMs: 0,
      metrics,
      log: new Logger((l) => lines.push(l), "debug"),
    });
    still.restore([restored("a/web", "10.1.0.1", "enimh1")]);
    try {
      assert(await still.waitSynced(10_000));
      assert(await still.idle(10_000));
      assertEquals(still.status().pods.map((p) => p.state), ["enforced"]);
      devices.deleteTables(NODE);
      // What `GET /v1/status` does before it reads the status (agent/server.ts).
      assertEquals(await still.checkTables({ all: true }), 1);
      // Until the render is in, web is not enforced at its node end.
      const seen = still.status().pods.map((p) => p.state);
      assert(await still.idle(10_000));
      assertEquals(seen, ["retrying"]);
      assertEquals(still.status().pods.map((p) => p.state), ["enforced"]);
      assertEquals(await still.checkTables({ all: true }), 0, "loaded again: as it was loaded");
    } finally {
      await still.close();
    }
    const e = new PolicyEnforcer({
      kube: testKube(server),
      devices,
      syncWaitMs: 200,
      tableCheckMs: 20,
      metrics,
      log: new Logger((l) => lines.push(l), "debug"),
    });
    e.restore([restored("a/web", "10.1.0.1", "enimh1")]);
    try {
      assert(await e.waitSynced(10_000));
      assert(await e.idle(10_000));
      const node = () => devices.rulesets.get(NODE)!.length;
      const web = () => devices.rulesets.get("/run/netns/web")!.length;
      const [nodeLoads, webLoads] = [node(), web()];
      // The fence is up once the node's table (which stamps what it judged) has loaded.
      await until("the fence written", () => devices.fences.has(NODE));
      const fence = devices.fences.get(NODE)!;
      assertStringIncludes(fence, "add element inet enim_fence armed { 1701734765 timeout 10s }");
      assertStringIncludes(fence, "meta mark & 0x20000 == 0x20000 accept");
      assertStringIncludes(
        devices.rulesets.get(NODE)!.at(-1)!,
        "add rule inet enim_policy forward iifgroup 1701734765 meta mark set meta mark | 0x20000",
      );
      // `nft flush ruleset` on the node: the node's table is loaded again, whole.
      devices.deleteTables(NODE);
      await until("the node's table loaded again", () => node() > nodeLoads);
      const text = devices.rulesets.get(NODE)!.at(-1)!;
      assertStringIncludes(text, "table inet enim_policy {");
      assertStringIncludes(text, "drop_in_enimh1");
      assertEquals(web(), webLoads, "web's own table was there all along");
      // The table in web's namespace deleted: loaded again too.
      devices.deleteTables("/run/netns/web");
      await until("web's table loaded again", () => web() > webLoads);
      assertStringIncludes(devices.rulesets.get("/run/netns/web")!.at(-1)!, "chain ingress");
      assert(await e.idle(10_000));
      assertEquals(repairs, ["policy node", "policy node", "policy pod"]);
      const logged = lines.map((l) => JSON.parse(l)).filter((l) =>
        l.msg === "NetworkPolicy: a policy table is missing; loading it again"
      );
      assertEquals(logged.map((l) => [l.level, l.place]), [
        ["warn", "node"],
        ["warn", "node"],
        ["warn", "pod"],
      ]);
      assertEquals(e.status().pods.map((p) => p.state), ["enforced"]);
      // A stopping agent takes its fence away (whatever runs next may stamp nothing).
      await e.close();
      assertEquals(
        devices.fences.get(NODE),
        "table inet enim_fence {}\ndelete table inet enim_fence\n",
      );
    } finally {
      await e.close();
    }
  });
});

Deno.test("a take-over deletes the tracked connections of an address whose pod changed while the agent was away (its pod deleted, the address another pod's), in every local pod's namespace and on the node, and only then keeps the new owners", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("pods", pod("a", "b", "10.1.0.2"));
    const remote = (name: string) =>
      makePod({ namespace: "a", name, labels: { app: name }, nodeName: "n2", ip: "10.1.0.5" });
    server.put("pods", remote("x"));
    server.put("networkpolicies", {
      metadata: { namespace: "a", name: "b" },
      spec: {
        podSelector: { matchLabels: { app: "b" } },
        ingress: [{ from: [{ podSelector: { matchLabels: { app: "x" } } }] }],
      },
    });
    const devices = new FakeDeviceLayer();
    devices.addNetns("/run/netns/b");
    devices.nodeAddrs = { addresses: ["10.0.0.254"], primary: {} };
    const memory = new InMemoryPolicyMemory();
    const start = () => {
      const e = new PolicyEnforcer({
        kube: testKube(server),
        devices,
        syncWaitMs: 200,
        tableCheckMs: 0,
        memory,
      });
      e.restore([restored("a/b", "10.1.0.2", "enimh1")]);
      return e;
    };
    const before = start();
    try {
      assert(await before.waitSynced(10_000));
      assert(await before.idle(10_000));
      assertEquals(memory.owners().get("10.1.0.5")?.split(" ")[0], "a/x");
    } finally {
      await before.close();
    }
    // While the agent is away: x is deleted, its address goes to a new pod y, which b's
    // policy does not admit; b's conntrack may still hold x's connection.
    server.remove("pods", "a", "x");
    server.put("pods", remote("y"));
    const flushes = devices.conntrackFlushes.length;
    const after = start();
    try {
      assert(await after.waitSynced(10_000));
      assert(await after.idle(10_000));
      const made = devices.conntrackFlushes.slice(flushes)
        .filter((f) => f.addresses.includes("10.1.0.5")).map((f) => f.netns).sort();
      assertEquals(made, ["/run/netns/b", NODE].sort());
      assertEquals(memory.owners().get("10.1.0.5")?.split(" ")[0], "a/y");
    } finally {
      await after.close();
    }
    // Nothing changed since: the next take-over deletes nothing.
    const quiet = devices.conntrackFlushes.length;
    const again = start();
    try {
      assert(await again.waitSynced(10_000));
      assert(await again.idle(10_000));
      assertEquals(devices.conntrackFlushes.slice(quiet), []);
    } finally {
      await again.close();
    }
  });
});

Deno.test("a take-over never loads an older state than the agent before put in place: a first list a lagging watch cache answers from before a tightened policy is listed again from the latest", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("pods", pod("a", "web", "10.1.0.1"));
    server.put(
      "pods",
      makePod({ namespace: "a", name: "x", labels: { app: "x" }, nodeName: "n2", ip: "10.1.0.5" }),
    );
    const webPolicy = (from: unknown[]) => ({
      metadata: { namespace: "a", name: "web" },
      spec: { podSelector: { matchLabels: { app: "web" } }, ingress: from },
    });
    server.put(
      "networkpolicies",
      webPolicy([{ from: [{ podSelector: { matchLabels: { app: "x" } } }] }]),
    );
    const devices = new FakeDeviceLayer();
    devices.addNetns("/run/netns/web");
    devices.nodeAddrs = { addresses: ["10.0.0.254"], primary: {} };
    const memory = new InMemoryPolicyMemory();
    const lines: string[] = [];
    const start = () => {
      const e = new PolicyEnforcer({
        kube: testKube(server),
        devices,
        syncWaitMs: 200,
        tableCheckMs: 0,
        memory,
        log: new Logger((l) => lines.push(l), "debug"),
      });
      e.restore([restored("a/web", "10.1.0.1", "enimh1")]);
      return e;
    };
    const before = start();
    try {
      assert(await before.waitSynced(10_000));
      assert(await before.idle(10_000));
      // The watch cache of one API server stops here; the policy is tightened after.
      server.lagCache("networkpolicies");
      server.put("networkpolicies", webPolicy([]));
      await until("the tightened policy enforced", () => {
        const c = before.compiled("a/web");
        return c && c.ingress.entries.length === 0;
      });
      assert(await before.idle(10_000));
    } finally {
      await before.close();
    }
    const loads = (where: string) => devices.rulesets.get(where)?.length ?? 0;
    const [node0, web0] = [loads(NODE), loads("/run/netns/web")];
    const after = start();
    try {
      assert(await after.waitSynced(10_000));
      assert(await after.idle(10_000));
      const loaded = [
        ...devices.rulesets.get(NODE)!.slice(node0),
        ...devices.rulesets.get("/run/netns/web")!.slice(web0),
      ];
      assert(loaded.length > 0, "the take-over rendered the tables");
      assertEquals(
        loaded.filter((t) => t.includes("10.1.0.5")).length,
        0,
        "no load admitted x again",
      );
      assertEquals(after.compiled("a/web")!.ingress.entries.length, 0);
      assert(lines.some((l) => l.includes("listing again from the latest")));
    } finally {
      await after.close();
      server.catchUp();
    }
  });
});
