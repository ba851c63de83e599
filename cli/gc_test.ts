import { assertEquals, assertMatch } from "../lib/assert.ts";
import { AddRequestSchema, GcReportSchema } from "../api/schema.ts";
import { withRunDir } from "../tests/support/run_dir.ts";
import { cli, withFakeAgent } from "../tests/support/cli.ts";
import type { FakeManager } from "../tests/support/fake_manager.ts";

async function seed(m: FakeManager) {
  for (const [i, name] of ["web-0", "web-1", "web-2"].entries()) {
    await m.add(AddRequestSchema.parse({
      containerId: `c${i}aaaaaaaaaaaaaaaa`,
      ifName: "eth0",
      netns: `/run/netns/pod-${i}`,
      network: "enim-net",
      pod: { namespace: "default", name },
      mode: "interface",
    }));
  }
  m.gcPlan = [
    { eniId: "eni-mock-0001", reason: "netns gone" },
    { eniId: "eni-mock-0003", reason: "netns replaced", fail: "device busy" },
  ];
}

Deno.test("enim gc --dry-run lists what it would reclaim and changes nothing", async () => {
  await withFakeAgent(async (socket, m) => {
    await seed(m);
    const before = m.dump();
    const r = await cli(["gc", "--dry-run", "--socket", socket]);
    assertEquals([r.code, r.err], [0, ""]);
    const lines = r.out.split("\n");
    assertMatch(lines[0], /^ENI\s+MAC\s+DEVICE\s+OWNER\s+CONTAINER\s+NETNS\s+REASON\s+ACTION$/);
    assertMatch(
      lines[1],
      /^eni-mock-0001\s+02:00:00:00:00:01\s+eni0001\s+default\/web-0\s+c0aaaaaaaaaa\s+\/run\/netns\/pod-0\s+netns gone\s+move device back, scrub, deallocate$/,
    );
    assertMatch(lines[2], /^eni-mock-0003\s.*netns replaced/);
    assertEquals(lines[4], "dry run: 2 ENIs would be reclaimed; nothing was changed");
    assertEquals(m.dump(), before);
    assertEquals((m.calls.at(-1)!.arg as { dryRun: boolean }).dryRun, true);
  });
});

Deno.test("enim gc reports outcomes and exits 1 when a reclaim failed", async () => {
  await withFakeAgent(async (socket, m) => {
    await seed(m);
    const r = await cli(["gc", "--socket", socket]);
    assertEquals(r.code, 1);
    const lines = r.out.split("\n");
    assertMatch(lines[0], /\sOUTCOME\s+ERROR$/);
    assertMatch(lines[1], /^eni-mock-0001\s.*\sreclaimed\s+-$/);
    assertMatch(lines[2], /^eni-mock-0003\s.*\sfailed\s+device busy$/);
    assertEquals(lines[4], "reclaimed 1 of 2 ENIs; 1 failed (retried on the next GC pass)");
    assertEquals(m.atts.size, 2);
  });
});

Deno.test("enim gc exits 0 when everything was reclaimed, and --json prints the report", async () => {
  await withFakeAgent(async (socket, m) => {
    await seed(m);
    m.gcPlan = m.gcPlan.slice(0, 1);
    const r = await cli(["gc", "--json", "--socket", socket]);
    assertEquals(r.code, 0);
    const report = GcReportSchema.parse(JSON.parse(r.out));
    assertEquals(report.items.map((i) => [i.eniId, i.outcome]), [["eni-mock-0001", "reclaimed"]]);
    const again = await cli(["gc", "--socket", socket]);
    assertEquals(again.code, 0);
  });
});

Deno.test("enim gc with nothing to do says so", async () => {
  await withFakeAgent(async (socket) => {
    assertEquals(
      (await cli(["gc", "--dry-run", "--socket", socket])).out,
      "dry run: nothing to reclaim\n",
    );
    assertEquals((await cli(["gc", "--socket", socket])).out, "nothing to reclaim\n");
  });
});

Deno.test("enim gc exits 1 when the agent is not running", async () => {
  await withRunDir(async (dir) => {
    const r = await cli(["gc", "--dry-run", "--socket", `${dir}/enim.sock`]);
    assertEquals(r.code, 1);
    assertMatch(r.err, /^the enim agent is not running: cannot connect to /);
  });
});
