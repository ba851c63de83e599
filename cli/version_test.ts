import { assertEquals, assertMatch } from "../lib/assert.ts";
import { runCli } from "./mod.ts";
import { VERSION } from "../lib/version.ts";
import { runEnim } from "../tests/support/enim.ts";

Deno.test("version prints enim's version and the CNI versions", async () => {
  let out = "";
  const code = await runCli(["version", "--json"], {
    out: (t) => (out += t),
    err: () => {},
    agent: () => {
      throw new Error("enim version asks no agent");
    },
  });
  assertEquals(code, 0);
  assertEquals(JSON.parse(out).cniVersions, ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
  assertEquals(JSON.parse(out).version, VERSION);
});

Deno.test("the real entry point runs with the enim permission set", async () => {
  const res = await runEnim(["version"]);
  assertEquals(res.code, 0);
  assertMatch(res.stdout, /^enim \d+\.\d+\.\d+/);
  assertEquals(res.stdout.split(" ")[1], VERSION);
});
