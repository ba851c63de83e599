import { assertEquals } from "../lib/assert.ts";
import { ProviderError } from "../providers/contract.ts";
import { toApiError } from "./errors.ts";
import { CommandTimeoutError } from "../netns/child.ts";
import { CNI_CODES, toCniError } from "../cni/errors.ts";

Deno.test("a zone-sticky pod's refusals keep their own API codes and messages", async (t) => {
  for (
    const [reason, code] of [
      ["sticky_conflict", "sticky_conflict"],
      ["wrong_zone", "wrong_zone"],
      ["no_eni_available", "no_eni_available"],
      ["unavailable", "provider_error"],
    ] as const
  ) {
    await t.step(reason, () => {
      const e = toApiError(new ProviderError(reason, `ENI "eni-x" says ${reason}`));
      assertEquals(e.code, code);
      assertEquals(e.message.endsWith(`ENI "eni-x" says ${reason}`), true);
    });
  }
});

Deno.test("a child process past its deadline is a device error (CNI 105) naming the command and the deadline", () => {
  const err = new CommandTimeoutError(["/usr/sbin/ip", "-batch", "-"], 10_000, "killed", 137);
  const api = toApiError(err);
  assertEquals(api.code, "device_error");
  assertEquals(api.message, 'Cannot run "ip -batch -": no answer within 10 s; killed');
  const cni = toCniError(api, "1.1.0");
  assertEquals(cni.code, CNI_CODES.DEVICE_ERROR);
  assertEquals(
    cni.msg,
    'Configuring the device failed: Cannot run "ip -batch -": no answer within 10 s; killed',
  );
});
