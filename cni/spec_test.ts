/**
 * The table of what a call gets wrong whatever the agent says (`specProblem`),
 * which the plugin process applies without zod: it must word a field as the
 * agent's schemas do, so a message never depends on which side answered.
 */
import { assertEquals } from "../lib/assert.ts";
import { decodeStdin, specProblem } from "./spec.ts";
import { NetworkConfigSchema } from "./config.ts";
import { formatZodIssues } from "./errors.ts";
import { ContainerIdSchema, IfNameSchema, NetnsPathSchema } from "../api/schema.ts";
import { CONTAINER_ID, IFNAME, type NameRule, NETNS_PATH } from "../api/wire.ts";

const ENV = {
  CNI_COMMAND: "ADD",
  CNI_CONTAINERID: "c1",
  CNI_NETNS: "/run/netns/p",
  CNI_IFNAME: "eth0",
};

Deno.test("specProblem() words a cniVersion or name that is no string or malformed as the config's schema does", async (t) => {
  const cases: [string, Record<string, unknown>][] = [
    ["no cniVersion", { name: "n" }],
    ["a numeric cniVersion", { cniVersion: 1, name: "n" }],
    ["no name", { cniVersion: "1.1.0" }],
    ["a null name", { cniVersion: "1.1.0", name: null }],
    ["an array name", { cniVersion: "1.1.0", name: ["n"] }],
    ["an object name", { cniVersion: "1.1.0", name: { n: 1 } }],
    ["a name of the wrong form", { cniVersion: "1.1.0", name: "-x y" }],
    ["an empty name", { cniVersion: "1.1.0", name: "" }],
    ["a 257-character name", { cniVersion: "1.1.0", name: "n".repeat(257) }],
    ["neither cniVersion nor name", {}],
  ];
  for (const [what, fields] of cases) {
    await t.step(what, () => {
      const config = { type: "enim", ...fields };
      const problem = specProblem(ENV, decodeStdin(JSON.stringify(config)));
      const parsed = NetworkConfigSchema.safeParse(config);
      assertEquals(parsed.success, false);
      if (parsed.success) return;
      assertEquals(problem, {
        code: 7,
        msg: `Invalid network config: ${formatZodIssues(parsed.error)}`,
      });
    });
  }
});

Deno.test("the API's schemas refuse a name with the reason its rule gives the plugin process", async (t) => {
  const cases: [string, NameRule, typeof ContainerIdSchema, string[]][] = [
    ["containerId", CONTAINER_ID, ContainerIdSchema, ["", "-a", "a b", "x".repeat(257), "é"]],
    ["ifName", IFNAME, IfNameSchema, ["", ".", "..", "a/b", "a:b", "a b", "é".repeat(8)]],
    ["netns", NETNS_PATH, NetnsPathSchema, ["", "x", "/a/../b", "/a/./b", "/" + "a".repeat(4096)]],
  ];
  for (const [what, rule, schema, bad] of cases) {
    await t.step(what, () => {
      for (const value of bad) {
        const why = rule.problem(value);
        const parsed = schema.safeParse(value);
        assertEquals(parsed.success, false, `${what} ${JSON.stringify(value)}`);
        assertEquals(parsed.error?.issues.map((i) => i.message), [why!]);
      }
      const good = { containerId: "c-1.a_b", ifName: "eth0", netns: "/run/netns/p" }[what]!;
      assertEquals([rule.problem(good), schema.safeParse(good).success], [undefined, true]);
    });
  }
});

Deno.test("specProblem() refuses any CNI variable longer than the agent's API carries, used by the verb or not", () => {
  const long = "/x".repeat(70_000);
  const gc = specProblem(
    { CNI_COMMAND: "GC", CNI_PATH: "/opt/cni/bin", CNI_NETNS: long },
    decodeStdin('{"cniVersion":"1.1.0","name":"n","type":"enim","cni.dev/valid-attachments":[]}'),
  );
  assertEquals(gc?.code, 4);
  assertEquals(
    gc?.msg.startsWith("Invalid CNI environment for GC: CNI_NETNS is invalid: Expected at most"),
    true,
    gc?.msg,
  );
  const ok = specProblem(
    { CNI_COMMAND: "GC", CNI_PATH: "/opt/cni/bin", CNI_NETNS: "/x".repeat(60_000) },
    decodeStdin('{"cniVersion":"1.1.0","name":"n","type":"enim","cni.dev/valid-attachments":[]}'),
  );
  assertEquals(ok, undefined, "an unused variable within the limit is not looked at");
});
