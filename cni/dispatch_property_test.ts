import fc from "fast-check";
import { assert, assertEquals } from "../lib/assert.ts";
import { API_ERROR_CODES, ApiError } from "../api/schema.ts";
import { FakeAgent } from "../tests/support/fake_agent.ts";
import { CniErrorObjectSchema } from "./errors.ts";
import { dispatchCall } from "./dispatch.ts";
import { CNI_VERBS } from "./spec.ts";
import { CniResultSchema, SUPPORTED_VERSIONS } from "./negotiate.ts";

/** Runs the plugin and checks the one-document invariant; returns the exit code. */
async function invariant(
  env: Record<string, string | undefined>,
  stdin: string,
  agent: FakeAgent,
): Promise<void> {
  const writes: string[] = [];
  let code: number;
  try {
    code = await dispatchCall({
      env,
      stdin,
      stdout: (s) => writes.push(s),
      agent,
    });
  } catch (err) {
    throw new Error(`dispatchCall threw past the error mapper: ${err}`);
  }
  assert(writes.length <= 1, `more than one stdout write: ${writes.join(" | ")}`);
  if (code !== 0) {
    assertEquals(code, 1);
    assertEquals(writes.length, 1, "a failure prints one error object");
    const parsed = CniErrorObjectSchema.safeParse(JSON.parse(writes[0]));
    assert(parsed.success, `not a CNI error object: ${writes[0]}`);
    return;
  }
  if (writes.length === 0) {
    assert(
      env.CNI_COMMAND !== "ADD" && env.CNI_COMMAND !== "VERSION",
      "ADD/VERSION print a result",
    );
    return;
  }
  const out = JSON.parse(writes[0]);
  if (env.CNI_COMMAND === "VERSION") {
    assertEquals(out.supportedVersions, [...SUPPORTED_VERSIONS]);
  } else {
    assertEquals(env.CNI_COMMAND, "ADD");
    assert(CniResultSchema.safeParse(out).success, writes[0]);
    assert(typeof out.cniVersion === "string");
  }
}

const verb = fc.constantFrom(...CNI_VERBS, "", "BOGUS");
const goodEnvFor = (command: fc.Arbitrary<string>) =>
  fc.record({
    CNI_COMMAND: command,
    CNI_CONTAINERID: fc.constantFrom("c1", "abc_123.x-y"),
    CNI_NETNS: fc.constantFrom("/run/netns/p1", "/proc/1/ns/net"),
    CNI_IFNAME: fc.constantFrom("eth0", "net1"),
    CNI_PATH: fc.constant("/opt/cni/bin"),
    CNI_ARGS: fc.constantFrom("", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p", "IgnoreUnknown=1;X=y"),
  });
const goodEnv = goodEnvFor(verb);
/** Env with any variable possibly replaced by random text or removed. */
const anyEnv = fc.tuple(
  goodEnv,
  fc.dictionary(
    fc.constantFrom("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"),
    fc.option(fc.string({ maxLength: 40 }), { nil: undefined }),
  ),
).map(([g, over]) => ({ ...g, ...over }) as Record<string, string | undefined>);

const agentArb = fc.oneof(
  fc.constant(new FakeAgent()),
  fc.constantFrom(...API_ERROR_CODES).map((code) => {
    const boom = () => {
      throw new ApiError(code, `agent says ${code}`);
    };
    return new FakeAgent({ add: boom, del: boom, check: boom, gc: boom, status: boom });
  }),
);

const base = {
  cniVersion: "1.1.0",
  name: "enimnet",
  type: "enim",
  prevResult: {
    cniVersion: "1.1.0",
    interfaces: [{ name: "eth0", sandbox: "/run/netns/p1" }],
    ips: [{ address: "10.0.0.2/24", interface: 0 }],
  },
  "cni.dev/valid-attachments": [],
};
const field = fc.constantFrom(
  "cniVersion",
  "name",
  "type",
  "ipam",
  "routes",
  "mtu",
  "agentSocket",
  "timeoutSeconds",
  "logFile",
  "args",
  "runtimeConfig",
  "prevResult",
  "cni.dev/valid-attachments",
);
const value = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.constantFrom(...SUPPORTED_VERSIONS, "1.0.10", "2.0.0"),
  fc.constant({ type: "enim" }),
  fc.constant({ cni: { ips: ["10.0.0.5", "nope"] } }),
  fc.constant({ ipRanges: [[{ subnet: "10.0.0.0/24" }]] }),
  fc.constant([{ dst: "0.0.0.0/0" }]),
);
/** Mostly a valid environment for a real verb, sometimes a damaged one. */
const mostlyGoodEnv = fc.oneof(
  { weight: 4, arbitrary: goodEnvFor(fc.constantFrom(...CNI_VERBS)) },
  { weight: 1, arbitrary: anyEnv },
) as fc.Arbitrary<Record<string, string | undefined>>;

/** A valid config with some fields replaced or removed. */
const nearValidConfig = fc.tuple(
  fc.dictionary(field, fc.option(value, { nil: undefined }), { maxKeys: 2 }),
  fc.boolean(),
).map(([over, ipamMode]) => {
  const cfg: Record<string, unknown> = ipamMode
    ? { ...base, type: "bridge", ipam: { type: "enim" } }
    : { ...base };
  for (const [k, v] of Object.entries(over)) {
    if (v === undefined) delete cfg[k];
    else cfg[k] = v;
  }
  return JSON.stringify(cfg);
});

Deno.test("random bytes on stdin always give one CNI error object or a result", async () => {
  await fc.assert(
    fc.asyncProperty(anyEnv, fc.uint8Array({ maxLength: 200 }), agentArb, (env, bytes, agent) => {
      return invariant(env, new TextDecoder().decode(bytes), agent);
    }),
    { numRuns: 300 },
  );
});

Deno.test("random JSON on stdin always gives one CNI error object or a result", async () => {
  await fc.assert(
    fc.asyncProperty(anyEnv, fc.json({ maxDepth: 4 }), agentArb, (env, json, agent) => {
      return invariant(env, json, agent);
    }),
    { numRuns: 300 },
  );
});

Deno.test("near-valid configs always give one CNI error object or a result", async () => {
  await fc.assert(
    fc.asyncProperty(mostlyGoodEnv, nearValidConfig, agentArb, (env, cfg, agent) => {
      return invariant(env, cfg, agent);
    }),
    { numRuns: 1000 },
  );
});
