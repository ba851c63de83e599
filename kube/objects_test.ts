import { assertEquals } from "../lib/assert.ts";
import { PodSchema } from "./objects.ts";

const pod = (metadata: Record<string, unknown>) =>
  PodSchema.parse({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "b", namespace: "y", uid: "u-1", ...metadata },
    status: { phase: "Running", podIPs: [{ ip: "10.0.0.2" }] },
  });

Deno.test("PodSchema keeps a pod's uid, and when its deletion began with what grace", () => {
  const running = pod({});
  assertEquals(running.metadata, { name: "b", namespace: "y", uid: "u-1" });
  assertEquals(running.deleting, undefined);
  const terminating = pod({
    deletionTimestamp: "2026-12-01T10:00:30Z",
    deletionGracePeriodSeconds: 30,
  });
  assertEquals(terminating.metadata, { name: "b", namespace: "y", uid: "u-1" });
  assertEquals(terminating.deleting, { at: "2026-12-01T10:00:30Z", graceSeconds: 30 });
  assertEquals(
    pod({ deletionTimestamp: "2026-12-01T10:00:30Z" }).deleting,
    { at: "2026-12-01T10:00:30Z", graceSeconds: null },
  );
  assertEquals(terminating.phase, "Running");
  assertEquals(terminating.ips, ["10.0.0.2"]);
});
