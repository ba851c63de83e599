import { assert, assertEquals, assertStringIncludes, assertThrows } from "../lib/assert.ts";
import { CniError } from "./errors.ts";
import { parseCniArgs, podOf, requestedIps } from "./args.ts";

function code4(fn: () => unknown): string {
  const err = assertThrows(fn);
  assert(err instanceof CniError, String(err));
  assertEquals(err.code, 4);
  assertStringIncludes(err.message, "CNI_ARGS");
  return err.message;
}

Deno.test("parseCniArgs() reads the Kubernetes keys kubelet passes", () => {
  const raw =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1";
  assertEquals(parseCniArgs(raw), {
    IgnoreUnknown: "1",
    K8S_POD_NAMESPACE: "ns1",
    K8S_POD_NAME: "web-0",
    K8S_POD_INFRA_CONTAINER_ID: "abc",
    K8S_POD_UID: "u-1",
  });
  assertEquals(parseCniArgs(""), {});
  assertEquals(parseCniArgs("K8S_POD_NAME=a;"), { K8S_POD_NAME: "a" });
});

Deno.test("parseCniArgs() refuses unknown keys unless IgnoreUnknown is set", async (t) => {
  await t.step("unknown key → 4 naming it", () => {
    assertStringIncludes(code4(() => parseCniArgs("FOO=bar;K8S_POD_NAME=a")), '"FOO"');
  });
  for (const v of ["1", "true", "True", "TRUE"]) {
    await t.step(`IgnoreUnknown=${v} ignores them`, () => {
      assertEquals(parseCniArgs(`FOO=bar;IgnoreUnknown=${v}`), { IgnoreUnknown: v });
    });
  }
  for (const v of ["0", "false"]) {
    await t.step(`IgnoreUnknown=${v} does not`, () => {
      code4(() => parseCniArgs(`FOO=bar;IgnoreUnknown=${v}`));
    });
  }
  await t.step("IgnoreUnknown=maybe is not a boolean", () => {
    assertStringIncludes(code4(() => parseCniArgs("IgnoreUnknown=maybe")), "IgnoreUnknown");
  });
  for (const bad of ["FOO", "A=B=C", "=x", "K8S_POD_NAME"]) {
    await t.step(`malformed pair ${JSON.stringify(bad)}`, () => {
      code4(() => parseCniArgs(bad));
    });
  }
});

Deno.test("requestedIps(): runtimeConfig.ips, then args.cni.ips, then IP=", async (t) => {
  const args = parseCniArgs("IP=10.0.0.9,2001:db8::9/64");
  await t.step("IP= alone, comma-separated, prefixes dropped", () => {
    assertEquals(requestedIps({}, args), {
      ips: ["10.0.0.9", "2001:db8::9"],
      source: "CNI_ARGS IP",
    });
  });
  await t.step("args.cni.ips wins over IP=", () => {
    assertEquals(requestedIps({ args: { cni: { ips: ["10.0.0.7/24"] } } }, args), {
      ips: ["10.0.0.7"],
      source: "args.cni.ips",
    });
  });
  await t.step("the ips capability wins over both", () => {
    assertEquals(
      requestedIps(
        { args: { cni: { ips: ["10.0.0.7"] } }, runtimeConfig: { ips: ["10.0.0.8"] } },
        args,
      ),
      { ips: ["10.0.0.8"], source: "runtimeConfig.ips" },
    );
  });
  await t.step("an empty args.cni.ips does not hide IP=", () => {
    assertEquals(requestedIps({ args: { cni: { ips: [] } } }, args).source, "CNI_ARGS IP");
  });
  await t.step("none", () => assertEquals(requestedIps({}, {}), { ips: [], source: "none" }));
  await t.step("a bad IP= → 4", () => {
    assertStringIncludes(code4(() => requestedIps({}, { IP: "10.0.0.1,nope" })), '"nope"');
  });
});

Deno.test("podOf() takes the pod from CNI_ARGS and falls back sensibly", async (t) => {
  await t.step("kubelet: namespace, name and uid", () => {
    assertEquals(
      podOf({ K8S_POD_NAMESPACE: "ns", K8S_POD_NAME: "web-0", K8S_POD_UID: "u1" }, "c1"),
      { namespace: "ns", name: "web-0", uid: "u1" },
    );
  });
  await t.step("podman: only K8S_POD_NAME → namespace default", () => {
    assertEquals(podOf({ K8S_POD_NAME: "mypod" }, "c1"), { namespace: "default", name: "mypod" });
  });
  await t.step("cnitool: nothing → default/<container id>", () => {
    assertEquals(podOf({}, "cnitool-77383ca0a0715733ca6f"), {
      namespace: "default",
      name: "cnitool-77383ca0a0715733ca6f",
    });
  });
  await t.step("a container id that is no valid name is trimmed", () => {
    assertEquals(podOf({}, "abc._").name, "abc");
    assertEquals(podOf({}, "a".repeat(256)).name.length, 253);
  });
  await t.step("an invalid namespace → 4 naming K8S_POD_NAMESPACE", () => {
    assertStringIncludes(
      code4(() => podOf({ K8S_POD_NAMESPACE: "Bad_NS" }, "c1")),
      "K8S_POD_NAMESPACE",
    );
  });
});
