import { assert, assertEquals, assertMatch } from "../../lib/assert.ts";
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
