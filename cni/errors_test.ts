import { z } from "zod";
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { API_ERROR_CODES, ApiError, type ApiErrorCode } from "../api/schema.ts";
import { AgentUnreachableError } from "../api/client.ts";
import { CNI_CODES, CniError, CniErrorObjectSchema, toCniError } from "./errors.ts";

Deno.test("CNI codes are unique, the spec's below 100 and enim's from 100 up", () => {
  const codes = Object.values(CNI_CODES);
  assertEquals(new Set(codes).size, codes.length);
  for (const c of [1, 2, 3, 4, 5, 6, 7, 11, 50, 51]) assert(codes.includes(c as never), `${c}`);
  const own = Object.entries(CNI_CODES).filter(([, c]) => c >= 100).map(([k]) => k);
  assertEquals(own.length, 13);
});

Deno.test("toCniError() maps each kind of failure to its CNI code", async (t) => {
  const socket = "/run/enim/enim.sock";
  const cases: { name: string; err: unknown; verb?: string; code: number; msg?: string }[] = [
    { name: "a CniError", err: new CniError(4, "CNI_IFNAME is not set"), code: 4 },
    {
      name: "an unreachable agent on ADD",
      err: new AgentUnreachableError(socket),
      verb: "ADD",
      code: 11,
      msg: socket,
    },
    {
      name: "an unreachable agent on GC",
      err: new AgentUnreachableError(socket),
      verb: "GC",
      code: 11,
      msg: socket,
    },
    {
      name: "an unreachable agent on STATUS",
      err: new AgentUnreachableError(socket),
      verb: "STATUS",
      code: 50,
      msg: socket,
    },
    {
      name: "a socket the permissions do not allow",
      err: new AgentUnreachableError("/tmp/x.sock", { cause: new Deno.errors.NotCapable("no") }),
      verb: "ADD",
      code: 11,
      msg: "permissions",
    },
    {
      name: "an empty pool",
      err: new ApiError("no_eni_available", "0 free"),
      code: 100,
      msg: "pool is empty",
    },
    { name: "a zod error", err: new z.ZodError([]), code: 7 },
    { name: "a JSON syntax error", err: new SyntaxError("Unexpected token"), code: 6 },
    { name: "an I/O error", err: new Deno.errors.BrokenPipe("pipe"), code: 5 },
    { name: "a bug", err: new TypeError("x is undefined"), code: 110, msg: "x is undefined" },
    { name: "a thrown string", err: "boom", code: 110, msg: "boom" },
    { name: "a thrown null", err: null, code: 110 },
    {
      name: "a thrown object with a hostile toString",
      err: {
        toString() {
          throw new Error("no");
        },
      },
      code: 110,
    },
  ];
  for (const c of cases) {
    await t.step(c.name, () => {
      const obj = toCniError(c.err, "1.0.0", { verb: c.verb });
      CniErrorObjectSchema.parse(obj);
      assertEquals(obj.code, c.code);
      assertEquals(obj.cniVersion, "1.0.0");
      if (c.msg) assertStringIncludes(obj.msg, c.msg);
    });
  }
});

Deno.test("toCniError() maps every agent API error code", async (t) => {
  const expected: Record<ApiErrorCode, number> = {
    bad_request: 7,
    not_found: 3,
    no_eni_available: 100,
    requested_ip_unavailable: 101,
    sticky_conflict: 108,
    wrong_zone: 109,
    ifname_exists: 102,
    netns_invalid: 103,
    check_failed: 106,
    not_allowed: 7,
    provider_error: 104,
    device_error: 105,
    busy: 11,
    policy_unavailable: 11,
    policy_unenforceable: 111,
    state_unavailable: 5,
    internal: 110,
  };
  for (const code of API_ERROR_CODES) {
    await t.step(code, () => {
      const obj = toCniError(new ApiError(code, "why", "more"), "1.1.0", { verb: "ADD" });
      assertEquals(obj.code, expected[code]);
      assertStringIncludes(obj.msg, "why");
      assertEquals(obj.details, "more");
    });
  }
  await t.step("any API error on STATUS is 50", () => {
    assertEquals(toCniError(new ApiError("internal", "x"), "1.1.0", { verb: "STATUS" }).code, 50);
  });
});
