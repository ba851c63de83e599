import { ANNOTATIONS, POD_ANNOTATIONS_KEY, podChoice } from "./selection.ts";
import { parseCniArgs } from "./args.ts";
import { CniError } from "./errors.ts";
import { assert, assertEquals, assertStringIncludes, assertThrows } from "../lib/assert.ts";

const ann = (a: Record<string, string>) => ({ runtimeConfig: { [POD_ANNOTATIONS_KEY]: a } });

function refused(code: number, fn: () => unknown): string {
  const e = assertThrows(fn);
  assert(e instanceof CniError, String(e));
  assertEquals(e.code, code, e.message);
  return e.message;
}

Deno.test("no choice anywhere: the default profile, exactly as before", () => {
  assertEquals(podChoice({}, {}), {
    profile: "default",
    ips: [],
    sticky: false,
    sources: { profile: "none", securityGroupIds: "none", ips: "none", sticky: "none" },
    overridden: [],
  });
});

Deno.test("annotations give profile, groups, IPs and stickiness", () => {
  const c = podChoice(
    ann({
      [ANNOTATIONS.profile]: "b",
      [ANNOTATIONS.securityGroupIds]: " g-aaa, g-bbb ,",
      [ANNOTATIONS.ip]: "10.98.0.7, fd00:98::7",
      [ANNOTATIONS.sticky]: "true",
      "other.io/thing": "ignored",
    }),
    {},
  );
  assertEquals(c.profile, "b");
  assertEquals(c.securityGroupIds, ["g-aaa", "g-bbb"]);
  assertEquals(c.ips, ["10.98.0.7", "fd00:98::7"]);
  assertEquals(c.sticky, true);
  assertEquals(c.sources, {
    profile: "annotation",
    securityGroupIds: "annotation",
    ips: "annotation",
    sticky: "annotation",
  });
});

Deno.test("CNI_ARGS carry the same choices where a runtime passes no annotations", () => {
  const args = parseCniArgs(
    "IgnoreUnknown=1;K8S_POD_NAME=web;ENIM_PROFILE=b;ENIM_SECURITY_GROUP_IDS=esg-1,esg-2;ENIM_STICKY=1;IP=10.98.0.9",
  );
  const c = podChoice({}, args);
  assertEquals([c.profile, c.securityGroupIds, c.sticky, c.ips], [
    "b",
    ["esg-1", "esg-2"],
    true,
    ["10.98.0.9"],
  ]);
  assertEquals(c.sources.profile, "CNI_ARGS");
});

Deno.test("args.cni carries them too", () => {
  const c = podChoice(
    {
      args: { cni: { profile: "b", securityGroupIds: ["g-x"], sticky: true, ips: ["10.98.0.4"] } },
    },
    {},
  );
  assertEquals([c.profile, c.securityGroupIds, c.sticky, c.ips], ["b", ["g-x"], true, [
    "10.98.0.4",
  ]]);
  assertEquals(c.sources.ips, "args.cni");
});

Deno.test("precedence: annotation > args.cni > CNI_ARGS, and the loser is named", () => {
  const args = parseCniArgs("ENIM_PROFILE=c;ENIM_STICKY=false;IP=10.0.0.3");
  const c = podChoice(
    {
      ...ann({ [ANNOTATIONS.profile]: "a", [ANNOTATIONS.ip]: "10.0.0.1" }),
      args: { cni: { profile: "b", sticky: true, ips: ["10.0.0.2"] } },
    },
    args,
  );
  assertEquals([c.profile, c.sticky, c.ips], ["a", true, ["10.0.0.1"]]);
  assertEquals(c.sources, {
    profile: "annotation",
    securityGroupIds: "none",
    ips: "annotation",
    sticky: "args.cni",
  });
  assertEquals(c.overridden, [
    'profile: enim.dev/profile "a" wins over args.cni.profile "b"',
    'profile: enim.dev/profile "a" wins over ENIM_PROFILE "c"',
    "sticky: args.cni.sticky true wins over ENIM_STICKY false",
    'ips: enim.dev/ip ["10.0.0.1"] wins over args.cni.ips ["10.0.0.2"]',
  ]);
  // The runtime's own ips capability still wins over everything.
  const d = podChoice(
    {
      runtimeConfig: {
        ips: ["10.0.0.9/24"],
        [POD_ANNOTATIONS_KEY]: { [ANNOTATIONS.ip]: "10.0.0.1" },
      },
    },
    {},
  );
  assertEquals([d.ips, d.sources.ips], [["10.0.0.9"], "runtimeConfig.ips"]);
});

Deno.test("values of the wrong form are refused: 7 from the config, 4 from CNI_ARGS", () => {
  let m = refused(7, () => podChoice(ann({ [ANNOTATIONS.profile]: "Bad_Name" }), {}));
  assertStringIncludes(m, 'annotation "enim.dev/profile": ');
  assertStringIncludes(m, 'got "Bad_Name"');
  m = refused(7, () => podChoice(ann({ [ANNOTATIONS.securityGroupIds]: "sg-123" }), {}));
  assertStringIncludes(m, "g-SY5smEG9");
  m = refused(7, () => podChoice(ann({ [ANNOTATIONS.securityGroupIds]: " , " }), {}));
  assertStringIncludes(m, "at least one");
  m = refused(7, () => podChoice(ann({ [ANNOTATIONS.ip]: "10.0.0.1,10.0.0.2" }), {}));
  assertStringIncludes(m, "at most one IPv4 and one IPv6");
  m = refused(7, () => podChoice(ann({ [ANNOTATIONS.ip]: "10.0.0.1/24" }), {}));
  assertStringIncludes(m, "without a prefix length");
  m = refused(7, () => podChoice(ann({ [ANNOTATIONS.sticky]: "yes" }), {}));
  assertStringIncludes(m, 'Expected "true" or "false"');
  m = refused(7, () => podChoice(ann({ "enim.dev/profle": "b" }), {}));
  assertStringIncludes(m, 'Unknown annotation "enim.dev/profle"');
  m = refused(7, () => podChoice({ args: { cni: { sticky: "yes" } } }, {}));
  assertStringIncludes(m, "args.cni.sticky");
  m = refused(4, () => podChoice({}, parseCniArgs("ENIM_PROFILE=NO!")));
  assertStringIncludes(m, "CNI_ARGS ENIM_PROFILE");
  m = refused(4, () => podChoice({}, parseCniArgs("ENIM_STICKY=maybe")));
  assertStringIncludes(m, "ENIM_STICKY");
  m = refused(4, () => podChoice({}, parseCniArgs("ENIM_SECURITY_GROUP_IDS=x")));
  assertStringIncludes(m, "ENIM_SECURITY_GROUP_IDS");
});

Deno.test("annotations as containerd passes them: null (a Go nil map) is none; not a map is a 7", () => {
  assertEquals(
    podChoice({ runtimeConfig: { [POD_ANNOTATIONS_KEY]: null } }, {}).profile,
    "default",
  );
  const m = refused(7, () => podChoice({ runtimeConfig: { [POD_ANNOTATIONS_KEY]: [1] } }, {}));
  assertStringIncludes(m, POD_ANNOTATIONS_KEY);
});

// Issue 25 point 4: a 64 KiB annotation made a 65,683-character message whose reason came last.
Deno.test("a 64 KiB security-group annotation is refused with the reason first and the value clipped", () => {
  const value = Array.from({ length: 6000 }, (_, i) => `g-${String(i).padStart(8, "0")}`).join(",")
    .slice(0, 64 * 1024);
  const m = refused(7, () => podChoice(ann({ [ANNOTATIONS.securityGroupIds]: value }), {}));
  assert(
    m.startsWith(
      'Invalid annotation "enim.dev/security-group-ids": Expected at most 10 security groups',
    ),
    m,
  );
  assert(m.length < 400, `${m.length} characters: ${m}`);
  assertStringIncludes(
    m,
    `got "${value.slice(0, 120)}"… (${value.length - 120} more bytes left out)`,
  );
});
