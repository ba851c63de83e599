import { assertEquals, assertRejects } from "../../lib/assert.ts";
import type { ProviderError } from "../contract.ts";
import { MetadataClient } from "./metadata.ts";
import { startFake } from "../../tests/support/bce_harness.ts";

Deno.test("MetadataClient reads and trims instance, region, zone, VPC, subnet and MACs", async () => {
  const fake = startFake();
  try {
    const m = new MetadataClient({ baseUrl: fake.metadataUrl.replace(/\/$/, "") });
    assertEquals(await m.instanceId(), "i-fake0001");
    assertEquals(await m.region(), "bj");
    assertEquals(await m.zone(), "cn-bj-a");
    assertEquals(await m.vpcId(), "vpc-fake0001");
    assertEquals(await m.subnetId(), "sbn-fake0001");
    assertEquals(await m.macs(), ["fa:f6:ff:ff:ff:01"]);
    const empty = await assertRejects(() => m.get("not-implemented"));
    assertEquals((empty as ProviderError).reason, "not_found");
    const missing = await assertRejects(() => m.get("no-such-path"));
    assertEquals((missing as ProviderError).reason, "not_found");
  } finally {
    await fake.close();
  }
});

Deno.test("MetadataClient reports an unreachable service as unavailable", async () => {
  const fake = startFake();
  const url = fake.metadataUrl;
  await fake.close();
  const m = new MetadataClient({ baseUrl: url, timeoutMs: 500 });
  const e = await assertRejects(() => m.instanceId());
  assertEquals((e as ProviderError).reason, "unavailable");
});
