import { assertEquals } from "../lib/assert.ts";
import { ProviderError } from "../providers/contract.ts";
import { toApiError } from "./errors.ts";

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
