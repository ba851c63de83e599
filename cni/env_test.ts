import { assert, assertEquals, assertStringIncludes, assertThrows } from "../lib/assert.ts";
import { CniError } from "./errors.ts";
import { parseCniEnv } from "./env.ts";
import { CNI_VERBS, REQUIRED_ENV } from "./spec.ts";

const FULL = {
  CNI_COMMAND: "ADD",
  CNI_CONTAINERID: "abc123",
  CNI_NETNS: "/run/netns/pod1",
  CNI_IFNAME: "eth0",
  CNI_ARGS: "K8S_POD_NAME=p",
  CNI_PATH: "/opt/cni/bin",
};

function code4(env: Record<string, string | undefined>): string {
  const err = assertThrows(() => parseCniEnv(env));
  assert(err instanceof CniError);
  assertEquals(err.code, 4);
  return err.message;
}

Deno.test("parseCniEnv() reads a complete ADD environment", () => {
  assertEquals(parseCniEnv(FULL), {
    command: "ADD",
    containerId: "abc123",
    netns: "/run/netns/pod1",
    ifName: "eth0",
    args: "K8S_POD_NAME=p",
    path: "/opt/cni/bin",
  });
});

Deno.test("parseCniEnv() requires per verb what the spec requires", async (t) => {
  for (const verb of CNI_VERBS) {
    await t.step(`${verb} with only CNI_COMMAND names each required variable`, () => {
      const required = REQUIRED_ENV[verb];
      if (required.length === 0) {
        assertEquals(parseCniEnv({ CNI_COMMAND: verb }).command, verb);
        return;
      }
      const msg = code4({ CNI_COMMAND: verb });
      for (const name of required) assertStringIncludes(msg, `${name} is not set`);
    });
  }
  await t.step("DEL tolerates a missing or empty CNI_NETNS", () => {
    const env = { ...FULL, CNI_COMMAND: "DEL", CNI_NETNS: "" };
    assertEquals(parseCniEnv(env).netns, undefined);
  });
  await t.step("VERSION ignores garbage in the variables it does not use", () => {
    assertEquals(parseCniEnv({ CNI_COMMAND: "VERSION", CNI_IFNAME: "a/b" }).command, "VERSION");
  });
  await t.step("GC needs CNI_PATH only", () => {
    assertEquals(parseCniEnv({ CNI_COMMAND: "GC", CNI_PATH: "/opt/cni/bin" }).path, "/opt/cni/bin");
  });
});

Deno.test("parseCniEnv() refuses a missing or unknown CNI_COMMAND", () => {
  assertStringIncludes(code4({}), "CNI_COMMAND");
  assertStringIncludes(code4({ CNI_COMMAND: "" }), "CNI_COMMAND");
  assertStringIncludes(code4({ CNI_COMMAND: "add" }), 'CNI_COMMAND "add"');
});

Deno.test("parseCniEnv() validates each variable and names every bad one", async (t) => {
  const bad: [string, string, string][] = [
    ["CNI_CONTAINERID", "-abc", "leading dash"],
    ["CNI_CONTAINERID", "a b", "space"],
    ["CNI_CONTAINERID", "a/b", "slash"],
    ["CNI_CONTAINERID", "x".repeat(257), "too long"],
    ["CNI_IFNAME", "a".repeat(16), "16 bytes"],
    ["CNI_IFNAME", "é".repeat(8), "16 bytes in 8 characters"],
    ["CNI_IFNAME", "eth/0", "slash"],
    ["CNI_IFNAME", "eth:0", "colon"],
    ["CNI_IFNAME", "eth 0", "space"],
    ["CNI_IFNAME", "eth\t0", "tab"],
    ["CNI_IFNAME", ".", "dot"],
    ["CNI_IFNAME", "..", "dot-dot"],
    ["CNI_NETNS", "run/netns/x", "relative"],
    ["CNI_NETNS", "/run/netns/../x", "traversal"],
  ];
  for (const [name, value, why] of bad) {
    await t.step(`${name} ${why}`, () => {
      const msg = code4({ ...FULL, [name]: value });
      assertStringIncludes(msg, name);
    });
  }
  await t.step("ok: 15-byte name, dots and dashes in ids", () => {
    const env = parseCniEnv({ ...FULL, CNI_IFNAME: "a".repeat(15), CNI_CONTAINERID: "A1_b.c-d" });
    assertEquals(env.ifName, "a".repeat(15));
  });
  await t.step("all bad variables are named in one message", () => {
    const msg = code4({ CNI_COMMAND: "ADD", CNI_CONTAINERID: "-x", CNI_IFNAME: "a:b" });
    for (const n of ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"]) assertStringIncludes(msg, n);
  });
});
