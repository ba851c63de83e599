/**
 * A small run of the zone mode in the test suite (root): two nodes on the BCE
 * provider and one fake cloud, sticky and plain pods moving between them, either
 * agent SIGKILLed (aimed mostly at an ENI attaching or detaching: mid-claim,
 * mid-park). The planted cross-node violation must be reported (so a clean run is
 * known to mean something), every check of both nodes and the cloud must hold,
 * and nothing may be left after the final GC and expiry. `deno task stress --zone`
 * runs the same at any size.
 */
import { assert, assertEquals } from "../../lib/assert.ts";
import { formatZoneReport, runZoneStress, zoneDefaults } from "./mod.ts";

const AS_ROOT = Deno.uid() === 0;

Deno.test({
  name:
    "a small zone stress run on two nodes catches the planted cross-node violation and finds no real one",
  ignore: !AS_ROOT,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const opts = { ...zoneDefaults(20261126), kills: 4, holdSeconds: 10 };
    const lines: string[] = [];
    const report = await runZoneStress(opts, { log: (l) => lines.push(l) });
    const text = `${formatZoneReport(report)}\n${lines.join("\n")}`;
    console.log(formatZoneReport(report).split("\n").slice(0, 6).join("\n"));
    assertEquals(report.plants.map((p) => [p.name, p.caught]), [["foreign_attach", true]], text);
    assertEquals(report.stoppedBy, "kills", text);
    assertEquals(report.figures.killsTotal, 4, text);
    assert(report.figures.moves >= 1, text);
    // One check after the first start, one per kill, one after the plant, the final one.
    assert(report.figures.checks >= 7, text);
    assertEquals(report.violations.map((v) => `${v.class} ${v.subject}: ${v.message}`), [], text);
  },
});
