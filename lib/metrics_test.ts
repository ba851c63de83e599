import { assert, assertMatch } from "./assert.ts";
import { Metrics } from "./metrics.ts";
import { VERSION } from "./version.ts";

Deno.test("metrics exposes phase histograms, operation counters and pool gauges", async () => {
  const m = new Metrics();
  m.setPoolSource(() => ({
    attachable: 4,
    profiles: {
      default: { free: 3, owned: 2, recycling: 1, held: 0 },
      b: { free: 1, owned: 1, recycling: 0, held: 1 },
    },
    lost: 1,
    details: { quarantined: 2, limitSource: "quota", lostEnis: [] },
  }));
  m.holdExpired("b");
  m.stickyEvent("park", "db");
  m.stickyEvent("claim_conflict", "db");
  m.stickyEvent("claim_conflict", "db");
  m.description("ok");
  m.answeredDelStateFailed();
  await m.time("add", "provider", () => Promise.resolve(1));
  m.phase("add", "move", 2.5);
  m.operation("add", "ok", 7);
  m.gcReclaims.inc({ result: "reclaimed" });
  const text = await m.text();
  assertMatch(text, /enim_phase_duration_seconds_count\{op="add",phase="provider"\} 1/);
  assertMatch(text, /enim_phase_duration_seconds_bucket\{le="0.0025",op="add",phase="move"\} 1/);
  assertMatch(text, /enim_operations_total\{op="add",result="ok"\} 1/);
  assertMatch(text, /enim_pool_enis\{profile="default",state="free"\} 3/);
  assertMatch(text, /enim_pool_enis\{profile="b",state="held"\} 1/);
  assertMatch(text, /enim_sticky_held_enis\{profile="b"\} 1/);
  assertMatch(text, /enim_sticky_hold_expiries_total\{profile="b"\} 1/);
  assertMatch(text, /enim_eni_descriptions_total\{result="ok"\} 1/);
  assertMatch(text, /enim_del_state_write_failures_total 1/);
  assertMatch(text, /enim_sticky_zone_events_total\{event="park",profile="db"\} 1/);
  assertMatch(text, /enim_sticky_zone_events_total\{event="claim_conflict",profile="db"\} 2/);
  assertMatch(text, /enim_node_attachable_enis 4/);
  assertMatch(text, /enim_lost_enis 1/);
  assertMatch(text, /enim_provider_status\{field="quarantined"\} 2/);
  assert(!text.includes('field="limitSource"'), "only numeric details become samples");
  assertMatch(text, /enim_gc_reclaims_total\{result="reclaimed"\} 1/);
});

Deno.test("metrics show each NetworkPolicy the agent cannot read, and none when it reads them all", async () => {
  const m = new Metrics();
  let unreadable: string[] | undefined = ["a/future", "b/gt"];
  m.setPolicySource(() =>
    Promise.resolve({ synced: true, caches: [], rules: [], drops: [], unreadable })
  );
  const text = await m.text();
  assertMatch(text, /# TYPE enim_policy_unreadable gauge/);
  assertMatch(text, /enim_policy_unreadable\{policy="a\/future"\} 1/);
  assertMatch(text, /enim_policy_unreadable\{policy="b\/gt"\} 1/);
  unreadable = [];
  assert(!(await m.text()).includes('enim_policy_unreadable{policy="a/future"}'), "read now: gone");
  unreadable = undefined;
  assert(!(await m.text()).includes("enim_policy_unreadable{"), "an older source: none");
});

Deno.test("metrics carry enim's version as enim_build_info", async () => {
  const text = await new Metrics().text();
  assertMatch(
    text,
    new RegExp(`^enim_build_info\\{version="${VERSION.replaceAll(".", "\\.")}"\\} 1$`, "m"),
  );
});
