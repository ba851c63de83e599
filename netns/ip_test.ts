import { assertEquals, assertThrows } from "../lib/assert.ts";
import { batchLine, ipArgv, IpError, netnsPath, parseJsonLines } from "./ip.ts";

Deno.test("ipArgv() uses ip -n for named namespaces and nsenter for other paths", async (t) => {
  for (
    const [netns, argv] of [
      [undefined, ["/usr/sbin/ip", "link", "show"]],
      [null, ["/usr/sbin/ip", "link", "show"]],
      ["p1", ["/usr/sbin/ip", "-n", "p1", "link", "show"]],
      ["/run/netns/p1", ["/usr/sbin/ip", "-n", "p1", "link", "show"]],
      ["/var/run/netns/cni-1", ["/usr/sbin/ip", "-n", "cni-1", "link", "show"]],
      ["/proc/42/ns/net", [
        "/usr/bin/nsenter",
        "--net=/proc/42/ns/net",
        "/usr/sbin/ip",
        "link",
        "show",
      ]],
      ["/run/netns/../x", [
        "/usr/bin/nsenter",
        "--net=/run/netns/../x",
        "/usr/sbin/ip",
        "link",
        "show",
      ]],
    ] as const
  ) {
    await t.step(String(netns), () => assertEquals(ipArgv(["link", "show"], netns), argv));
  }
  await t.step("a relative path is refused", () => {
    assertThrows(() => ipArgv(["link"], "run/netns/p1"));
  });
});

Deno.test("netnsPath() maps names to /run/netns and keeps paths", () => {
  assertEquals(netnsPath("p1"), "/run/netns/p1");
  assertEquals(netnsPath("/proc/1/ns/net"), "/proc/1/ns/net");
});

Deno.test("batchLine() joins safe words and refuses words that would split the line", () => {
  assertEquals(
    batchLine(["addr", "add", "fd00::5/64", "dev", "eth0", "nodad"]),
    "addr add fd00::5/64 dev eth0 nodad",
  );
  for (const bad of ["eth0 up", "a\nlink del x", "#x", '"x"', "", "a\\b"]) {
    assertThrows(() => batchLine(["link", "set", "dev", bad]), `refuses ${JSON.stringify(bad)}`);
  }
});

Deno.test("parseJsonLines() reads one JSON value per line and names a bad line", () => {
  assertEquals(parseJsonLines('[{"ifindex":1}]\n\n[]\n'), [[{ ifindex: 1 }], []]);
  const err = assertThrows(() => parseJsonLines("[]\nnot json"));
  assertEquals(err.message.startsWith('Cannot parse line 2 of "ip -j" output'), true);
});

Deno.test("IpError carries the command and stderr", () => {
  const err = new IpError(["/usr/sbin/ip", "link", "del", "x"], 1, 'Cannot find device "x"\n');
  assertEquals(err.stderr, 'Cannot find device "x"');
  assertEquals(
    err.message,
    'Command "/usr/sbin/ip link del x" failed with exit code 1: Cannot find device "x"',
  );
});
