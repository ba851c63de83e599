/**
 * The stress and fuzz harness of issue 17: `runStress` (a simulated node under
 * concurrent clients, agent and plugin SIGKILLs, kernel-side invariant checks
 * after every restart) and `runFuzz` (seeded malformed plugin inputs and API
 * requests against an oracle of CNI codes and HTTP statuses), and `runZoneStress`
 * (`--zone`: two nodes on the BCE provider, zone-sticky pods moving between them,
 * either agent killed mid-park and mid-claim). `deno task stress`
 * (scripts/stress.ts) runs them; the test suite runs small sizes of both.
 *
 * @module
 */
export { runStress, type StressIo, type StressReport } from "./_run.ts";
export {
  defaultOptions,
  parseOptions,
  type StressOptions,
  USAGE,
  zoneDefaults,
} from "./_options.ts";
export { formatReport, reproduce } from "./_report.ts";
export {
  checkInvariants,
  type Violation,
  VIOLATION_CLASSES,
  type ViolationClass,
} from "./_checker.ts";
export {
  formatFuzz,
  FUZZ_CLASSES,
  type FuzzClass,
  fuzzFailed,
  fuzzOnNewNode,
  type FuzzReport,
  KNOWN_FAILING,
} from "./_fuzz.ts";
export { checkZone, readZoneViews, type ZoneViews } from "./_zone_checker.ts";
export { formatZoneReport, runZoneStress, type ZoneStressReport } from "./_zone.ts";
