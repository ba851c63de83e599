import { assert, assertEquals, assertMatch, assertRejects } from "../../lib/assert.ts";
import { ApiError } from "../../api/schema.ts";
import { FakeDeviceLayer } from "../../netns/fake.ts";
import type { PolicyPod } from "../../manager/types.ts";
import { makeNamespace, makePod } from "../../tests/support/kube_objects.ts";
import { policyPod, testKube, withTestApiServer } from "../../tests/support/enforcer_fixtures.ts";
import { PolicyEnforcer } from "./enforcer.ts";
import { PodSchema } from "../../kube/objects.ts";
import { bypassOf, kernelHasGuard, probeRawGuard } from "./_raw.ts";
import { Logger } from "../../lib/log.ts";
import { GUARD_STAMP, guardProbe, guardRuleset } from "../../policy/mod.ts";

/** A Pod as the API server sends it, with these containers (and init/ephemeral ones). */
const pod = (spec: Record<string, unknown>) =>
  PodSchema.parse({ metadata: { name: "p", namespace: "n", uid: "u" }, spec });

const ctr = (securityContext?: Record<string, unknown>) => ({
  name: "c",
  ...(securityContext ? { securityContext } : {}),
});

Deno.test("a pod's NET_RAW and NET_ADMIN are read from every container of its spec", async (t) => {
  const cases: [string, Record<string, unknown>, { raw: string; admin: string }][] = [
    ["no securityContext: the runtime's default", { containers: [ctr()] }, {
      raw: "default",
      admin: "default",
    }],
    ["drops NET_RAW", { containers: [ctr({ capabilities: { drop: ["NET_RAW"] } })] }, {
      raw: "no",
      admin: "default",
    }],
    ["drops ALL (restricted)", { containers: [ctr({ capabilities: { drop: ["ALL"] } })] }, {
      raw: "no",
      admin: "no",
    }],
    ["adds cap_net_admin (any case, CAP_ prefix)", {
      containers: [ctr({ capabilities: { drop: ["ALL"], add: ["cap_net_admin"] } })],
    }, { raw: "no", admin: "yes" }],
    ["privileged", { containers: [ctr({ privileged: true, capabilities: { drop: ["ALL"] } })] }, {
      raw: "yes",
      admin: "yes",
    }],
    ["one container keeps the default: the pod does", {
      containers: [ctr({ capabilities: { drop: ["ALL"] } })],
      initContainers: [ctr()],
    }, { raw: "default", admin: "default" }],
    ["an ephemeral container adds NET_RAW", {
      containers: [ctr({ capabilities: { drop: ["ALL"] } })],
      ephemeralContainers: [ctr({ capabilities: { add: ["NET_RAW"], drop: ["ALL"] } })],
    }, { raw: "yes", admin: "no" }],
    ["nulls read as absent", { containers: [ctr({ privileged: null, capabilities: null })] }, {
      raw: "default",
      admin: "default",
    }],
  ];
  for (const [name, spec, want] of cases) {
    await t.step(name, () => assertEquals({ ...pod(spec).netCaps }, want));
  }
});

Deno.test("bypassOf() says why an isolated pod can reach past its policy, against the runtime's defaults and the guard", () => {
  const dflt = pod({ containers: [ctr()] }).netCaps;
  const dropsRaw = pod({ containers: [ctr({ capabilities: { drop: ["NET_RAW"] } })] }).netCaps;
  const admin = pod({ containers: [ctr({ capabilities: { add: ["NET_ADMIN"] } })] }).netCaps;
  // containerd's default set (NET_RAW), no guard: the default pod is flagged.
  assertMatch(bypassOf(dflt, ["NET_RAW"], false) ?? "", /NET_RAW \(the runtime's default set/);
  // With the guard, NET_RAW is held back; on CRI-O (no default NET_RAW) it is not held at all.
  assertEquals(bypassOf(dflt, ["NET_RAW"], true), null);
  assertEquals(bypassOf(dflt, [], false), null);
  assertEquals(bypassOf(dropsRaw, ["NET_RAW"], false), null);
  // NET_ADMIN reaches past the guard too.
  assertMatch(bypassOf(admin, ["NET_RAW"], true) ?? "", /NET_ADMIN \(its spec adds it/);
  assertEquals(bypassOf(undefined, ["NET_RAW"], false), null);
});

Deno.test("the guard is on only from Linux 5.17, with the option on and the kernel taking its tables", async () => {
  assertEquals(
    ["5.16.20", "5.17.0", "6.1.0-18-amd64", "6.18.44-fc-v1300", "4.19.0", "x"].map(kernelHasGuard),
    [false, true, true, true, false, null],
  );
  const log = new Logger(() => {}, "debug");
  const checked: string[] = [];
  const ok = { checkRuleset: (t: string) => (checked.push(t), Promise.resolve()) };
  assertEquals((await probeRawGuard("auto", ok, "6.18.44", log)).on, true);
  assertEquals(checked, [guardProbe()]);
  assertEquals((await probeRawGuard(false, ok, "6.18.44", log)).on, false);
  assertEquals((await probeRawGuard("auto", ok, "5.16.1", log)).on, false);
  assertEquals((await probeRawGuard("auto", ok, null, log)).on, false);
  const refuses = { checkRuleset: () => Promise.reject(new Error("Operation not supported")) };
  const no = await probeRawGuard("auto", refuses, "6.18.44", log);
  assertEquals(no.on, false);
  assertMatch(no.why, /refuses the guard's tables: Operation not supported/);
});

Deno.test("guardRuleset() stamps what the IP stack sends out of the ENI and, enforcing, drops the rest but ARP", () => {
  const on = JSON.parse(guardRuleset("eth0", true));
  const text = JSON.stringify(on);
  assert(text.includes(`"hook":"postrouting","prio":1000`), text);
  assert(text.includes(`"hook":"egress","dev":"eth0"`), text);
  assert(text.includes(`{"mangle":{"key":{"meta":{"key":"secmark"}},"value":${GUARD_STAMP}}}`));
  assert(text.includes(`"right":"arp"}},{"accept":null}`), text);
  assert(text.includes(`{"counter":"drop_raw"},{"drop":null}`), text);
  // Not enforcing: the same tables and stamp, the egress chain empty (flushed).
  const off = JSON.stringify(JSON.parse(guardRuleset("eth0", false)));
  assert(off.includes("secmark") && !off.includes(`"drop":null`), off);
  let threw = false;
  try {
    guardRuleset('eth0" ; drop', true);
  } catch {
    threw = true;
  }
  assert(threw, "an interface name is checked");
});

// ---- the enforcer: flagged, refused, guarded ----

/** A pod of namespace `a` on node n1; `dropRaw`: its container drops NET_RAW. */
function specPod(name: string, dropRaw = false) {
  const p = makePod({ namespace: "a", name, labels: { app: name }, nodeName: "n1" });
  if (dropRaw) p.spec.containers[0].securityContext = { capabilities: { drop: ["NET_RAW"] } };
  return p;
}

async function admitted(e: PolicyEnforcer, p: PolicyPod): Promise<string> {
  const r = await e.prepare(p);
  assert(r, "policy is on");
  return await r.podRuleset();
}

const DENY = {
  metadata: { namespace: "a", name: "deny" },
  spec: { podSelector: {}, policyTypes: ["Ingress"] },
};

Deno.test("without the guard an isolated pod keeping the runtime's NET_RAW is flagged (status, view); one dropping it is not; with the guard neither is, and each gets its guard before the ADD answers", async () => {
  for (const guard of [false, true]) {
    await withTestApiServer(async (server) => {
      server.put("namespaces", makeNamespace("a"));
      server.put("pods", specPod("web"));
      server.put("pods", specPod("safe", true));
      server.put("networkpolicies", DENY);
      const devices = new FakeDeviceLayer();
      devices.addNetns("/run/netns/web");
      devices.addNetns("/run/netns/safe");
      const e = new PolicyEnforcer({
        kube: testKube(server),
        devices,
        syncWaitMs: 200,
        rawGuard: { on: guard, why: "test" },
      });
      e.restore([]);
      try {
        assert(await e.waitSynced(10_000));
        await admitted(e, policyPod("a/web", "10.1.0.1", "enimh1"));
        await e.committed("c-enimh1/eth0", "/run/netns/web");
        await admitted(e, policyPod("a/safe", "10.1.0.2", "enimh2"));
        await e.committed("c-enimh2/eth0", "/run/netns/safe");
        const bypass = Object.fromEntries(e.status().pods.map((p) => [p.pod, p.bypass]));
        if (guard) assertEquals(bypass, { "a/safe": null, "a/web": null });
        else {
          assertMatch(bypass["a/web"] ?? "", /NET_RAW.*no raw-socket guard/);
          assertEquals(bypass["a/safe"], null);
          assertMatch(e.view("a/web")?.bypass ?? "", /NET_RAW/);
        }
        assertEquals(e.status().rawSocketGuard.on, guard);
        const guards = (ns: string) =>
          (devices.rulesets.get(ns) ?? []).filter((t) => t.includes(`"enim_guard"`)).length;
        assertEquals(
          [guards("/run/netns/web"), guards("/run/netns/safe")],
          guard ? [1, 1] : [0, 0],
        );
      } finally {
        await e.close();
      }
    });
  }
});

Deno.test("with rawCapablePods refuse an isolated pod keeping NET_RAW fails its ADD with policy_unenforceable (111) and leaves nothing registered; a pod no policy isolates is admitted", async () => {
  await withTestApiServer(async (server) => {
    server.put("namespaces", makeNamespace("a"));
    server.put("namespaces", makeNamespace("b"));
    server.put("pods", specPod("web"));
    server.put("pods", makePod({ namespace: "b", name: "free", labels: {}, nodeName: "n1" }));
    server.put("networkpolicies", DENY);
    const devices = new FakeDeviceLayer();
    const e = new PolicyEnforcer({
      kube: testKube(server),
      devices,
      syncWaitMs: 200,
      rawCapablePods: "refuse",
    });
    e.restore([]);
    try {
      assert(await e.waitSynced(10_000));
      const err = await assertRejects(
        () => admitted(e, policyPod("a/web", "10.1.0.1", "enimh1")),
        ApiError,
      );
      assertEquals(err.code, "policy_unenforceable");
      assertMatch(err.message, /pod "a\/web": it holds NET_RAW/);
      assertEquals(e.status().pods, []);
      assertEquals(e.compiled("a/web"), undefined, "the engine forgot it");
      assertEquals(await admitted(e, policyPod("b/free", "10.1.0.3", "enimh3")), "");
    } finally {
      await e.close();
    }
  });
});
