import { assertEquals } from "../lib/assert.ts";
import { tcArgv } from "./tc.ts";

Deno.test("tcArgv() uses tc -n for named namespaces and nsenter for other paths", () => {
  assertEquals(tcArgv(["qdisc", "show"]), ["/usr/sbin/tc", "qdisc", "show"]);
  assertEquals(tcArgv(["qdisc", "show"], "/run/netns/p1"), [
    "/usr/sbin/tc",
    "-n",
    "p1",
    "qdisc",
    "show",
  ]);
  assertEquals(tcArgv(["qdisc", "show"], "/proc/42/fd/7"), [
    "/usr/bin/nsenter",
    "--net=/proc/42/fd/7",
    "/usr/sbin/tc",
    "qdisc",
    "show",
  ]);
});
