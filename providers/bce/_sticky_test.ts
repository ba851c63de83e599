import { assert, assertEquals } from "../../lib/assert.ts";
import {
  decodeRecord,
  DESCRIPTION_MAX,
  encodeRecord,
  isStickyName,
  recordNames,
  stickyName,
  type StickyRecord,
} from "./_sticky.ts";

const PARKED: StickyRecord = {
  state: "parked",
  cluster: "prod-1",
  pod: "payments/db-0",
  ifName: "eth0",
  until: Date.parse("2026-11-20T10:00:00.000Z"),
  by: "i-YufwpQAe",
};

Deno.test("a parked record reads back as written", () => {
  const text = encodeRecord(PARKED);
  assertEquals(
    text,
    "enim-sticky v1 parked cluster=prod-1 if=eth0 until=2026-11-20T10:00:00.000Z by=i-YufwpQAe pod=payments/db-0",
  );
  assertEquals(decodeRecord(text), PARKED);
});

Deno.test("an owned record carries no expiry", () => {
  const owned: StickyRecord = { ...PARKED, state: "owned", until: null };
  assertEquals(decodeRecord(encodeRecord(owned)), owned);
});

Deno.test("a pod name too long for BCE's 200 characters is cut and still matches its pod", () => {
  const pod = `ns-${"a".repeat(60)}/${"b".repeat(253)}`;
  const text = encodeRecord({ ...PARKED, pod });
  assertEquals(text.length, DESCRIPTION_MAX);
  const r = decodeRecord(text)!;
  assert(r.pod.endsWith("…"));
  assert(recordNames(r, pod, "eth0"));
  assert(!recordNames(r, `ns-${"a".repeat(60)}/c`, "eth0"));
  assert(!recordNames(r, pod, "eth1"));
});

Deno.test("descriptions that are no record read as none", async (t) => {
  for (
    const text of [
      null,
      "",
      "created by enim, do not modify",
      "default/web-0 on node-1",
      "enim-sticky v2 parked cluster=c if=eth0 until=2026-11-20T10:00:00.000Z by=i-a pod=a/b",
      "enim-sticky v1 parked cluster=c if=eth0 by=i-a pod=a/b",
      "enim-sticky v1 owned cluster=c if=eth0 until=2026-11-20T10:00:00.000Z by=i-a pod=a/b",
      "enim-sticky v1 parked cluster=c if=eth0 until=yesterday by=i-a pod=a/b",
      "enim-sticky v1 parked cluster=bad/cluster if=eth0 until=2026-11-20T10:00:00.000Z by=i-a pod=a/b",
    ]
  ) {
    await t.step(JSON.stringify(text), () => assertEquals(decodeRecord(text), null));
  }
});

Deno.test("a pod's sticky name is deterministic, per cluster, pod and interface, within BCE's rules", async () => {
  const a = await stickyName("enim", "prod-1", "payments/db-0", "eth0");
  assertEquals(a, await stickyName("enim", "prod-1", "payments/db-0", "eth0"));
  assert(/^enim\/z\/prod-1\/[0-9a-f]{16}$/.test(a), a);
  const others = await Promise.all([
    stickyName("enim", "prod-2", "payments/db-0", "eth0"),
    stickyName("enim", "prod-1", "payments/db-1", "eth0"),
    stickyName("enim", "prod-1", "payments/db-0", "eth1"),
  ]);
  assertEquals(new Set([a, ...others]).size, 4);
  const longest = await stickyName("x".repeat(24), "c".repeat(20), "a/b", "eth0");
  assert(longest.length <= 65 && /^[A-Za-z][A-Za-z0-9\-_/.]*$/.test(longest), longest);
  assert(isStickyName("enim", a));
  assert(!isStickyName("enim", "enim/i-fake0001/a1b2c3"));
});
