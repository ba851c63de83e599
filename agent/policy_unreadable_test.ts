/**
 * A NetworkPolicy the agent cannot read fails closed (issue 42): the enforcer against the
 * test API server and the fake device layer (no root). The pods it selects are isolated
 * and admit nothing through it (its whole namespace when its podSelector cannot be read),
 * `status()` lists it, and the log says so once per version of it.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { Logger } from "../lib/log.ts";
import type { KubeApiServer } from "../tests/support/kube_apiserver.ts";
import {
  policyPod,
  testKube,
  until,
  withTestApiServer,
} from "../tests/support/enforcer_fixtures.ts";
import { makeNamespace, makePod } from "../tests/support/kube_objects.ts";
import { FakeDeviceLayer } from "../netns/fake.ts";
import { PolicyEnforcer } from "./policy/mod.ts";
import type { PolicyPod } from "../manager/types.ts";

async function withEnforcer(
  fn: (
    server: KubeApiServer,
    e: PolicyEnforcer,
    d: FakeDeviceLayer,
    log: string[],
  ) => Promise<void>,
) {
  await withTestApiServer(async (server) => {
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const kube = testKube(server, { log });
    server.put("namespaces", makeNamespace("a"));
    for (const [name, ip] of [["db", "10.1.0.2"], ["web", "10.1.0.1"]]) {
      server.put(
        "pods",
        makePod({ namespace: "a", name, labels: { app: name }, nodeName: "n1", ip }),
      );
    }
    const devices = new FakeDeviceLayer();
    devices.addNetns("/run/netns/db");
    devices.addNetns("/run/netns/web");
    const e = new PolicyEnforcer({ kube, devices, log, syncWaitMs: 5_000, getPodTimeoutMs: 1_000 });
    // The manager's hand-over of the node's pods (none): the enforcer may take over.
    e.restore([]);
    try {
      await fn(server, e, devices, lines);
    } finally {
      await e.close();
    }
  });
}

const add = policyPod;

/** The pod's table as the plug would load it ("" when no policy isolates it). */
async function admit(e: PolicyEnforcer, p: PolicyPod): Promise<string> {
  const r = await e.prepare(p);
  assert(r, "policy is on");
  const table = await r.podRuleset();
  await e.committed(p.key, `/run/netns/${p.pod.split("/")[1]}`);
  return table;
}

/** The warnings the log has said about unreadable policies. */
const warned = (lines: string[]) =>
  lines.map((l) => JSON.parse(l)).filter((l) =>
    l.msg.startsWith("NetworkPolicy: a policy cannot be read")
  );

Deno.test("a policy with a protocol enim does not know isolates the pods it selects, admits nothing, and is said once per version", async () => {
  await withEnforcer(async (server, e, _devices, lines) => {
    const future = server.put("networkpolicies", {
      metadata: { namespace: "a", name: "future" },
      spec: {
        podSelector: { matchLabels: { app: "db" } },
        // Read, the second rule would admit every pod of the namespace.
        ingress: [{ ports: [{ protocol: "FOO", port: 5432 }] }, { from: [{ podSelector: {} }] }],
      },
    });
    assert(await e.waitSynced(10_000));
    const table = await admit(e, add("a/db", "10.1.0.2", "enimh2"));
    assertStringIncludes(table, 'counter name "drop_ingress" drop');
    assert(!table.includes("10.1.0.1"), "web's address is in no set of db's table");
    const view = e.view("a/db")!;
    assertEquals(view.ingress, { isolated: true, rules: [] });
    assertEquals(view.egress.isolated, false);
    assertMatch(view.policies[0].unreadable ?? "", /protocol: .*\(got "FOO"\)/);
    assertMatch(
      view.warnings.join("\n"),
      /future: cannot be read .*: it isolates the pods app=db for ingress and admits nothing/,
    );
    assertEquals(await admit(e, add("a/web", "10.1.0.1", "enimh1")), "", "web is not selected");
    const reason = e.status().unreadable[0]?.reason ?? "";
    assertEquals(e.status().unreadable, [{
      policy: "a/future",
      resourceVersion: future.metadata.resourceVersion,
      reason,
      selects: "app=db",
      wholeNamespace: false,
      ingress: true,
      egress: false,
    }]);
    assertMatch(reason, /^spec\.ingress\.0\.ports\.0\.protocol: /);
    await until("the warning", () => warned(lines).length === 1);
    assertEquals(warned(lines)[0].policy, "a/future");
    assertEquals(warned(lines)[0].level, "warn");

    // A relist (410) brings the same version again: not said again.
    const relists = () => e.status().caches.find((c) => c.resource === "networkpolicies")!.relists;
    await until("the watch", () => server.watchCount("networkpolicies") === 1);
    server.compact();
    server.expireWatches("networkpolicies");
    await until("the relist", () => relists() >= 1);
    assertEquals(warned(lines).length, 1, "one line per version, not one per list");

    // A new version is said again; a readable one ends it.
    server.put("networkpolicies", {
      ...future,
      metadata: { namespace: "a", name: "future", labels: { v: "2" } },
    });
    await until("the second version's warning", () => warned(lines).length === 2);
    server.put("networkpolicies", {
      metadata: { namespace: "a", name: "future" },
      spec: {
        podSelector: { matchLabels: { app: "db" } },
        ingress: [{ from: [{ podSelector: {} }] }],
      },
    });
    await until("readable again", () => e.status().unreadable.length === 0);
    assert(lines.some((l) => l.includes("a policy that could not be read can be read now")));
    await until(
      "web admitted",
      () => e.view("a/db")!.ingress.rules.some((r) => r.members.includes("10.1.0.1")),
    );
  });
});

Deno.test("a policy whose podSelector cannot be read isolates every pod of its namespace, in the directions it names", async () => {
  await withEnforcer(async (server, e) => {
    server.put("networkpolicies", {
      metadata: { namespace: "a", name: "gt" },
      spec: {
        podSelector: { matchExpressions: [{ key: "app", operator: "Gt", values: ["1"] }] },
        policyTypes: ["Ingress", "Egress"],
        ingress: [{}],
        egress: [{}],
      },
    });
    assert(await e.waitSynced(10_000));
    for (
      const [pod, ip, end] of [["a/db", "10.1.0.2", "enimh2"], ["a/web", "10.1.0.1", "enimh1"]]
    ) {
      const table = await admit(e, add(pod, ip, end));
      assertStringIncludes(table, 'counter name "drop_ingress" drop', pod);
      assertStringIncludes(table, 'counter name "drop_egress" drop', pod);
      const v = e.view(pod)!;
      assertEquals([v.ingress, v.egress], [{ isolated: true, rules: [] }, {
        isolated: true,
        rules: [],
      }]);
    }
    const [u] = e.status().unreadable;
    assertEquals([u.policy, u.selects, u.wholeNamespace, u.ingress, u.egress], [
      "a/gt",
      "<all>",
      true,
      true,
      true,
    ]);
    assertEquals(e.status().pods.map((p) => [p.pod, p.ingressIsolated, p.egressIsolated]), [
      ["a/db", true, true],
      ["a/web", true, true],
    ]);
  });
});
