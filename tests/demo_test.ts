/**
 * `deno task demo` is the README's main job: it must pass and leave nothing behind.
 * The demo prints every namespace, its sandbox and the agent's PID; each must be
 * gone afterwards (checked by name, so other work on the machine cannot interfere).
 */
import { existsSync as exists } from "../lib/fs.ts";
import { assert, assertEquals, assertMatch } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";
import { listNetns } from "../netns/sim.ts";

Deno.test({
  name: "deno task demo passes and leaves no namespaces, sandbox or agent process behind",
  ignore: Deno.uid() !== 0,
  async fn() {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["task", "demo"],
      cwd: ROOT,
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assertEquals(out.code, 0, text + new TextDecoder().decode(out.stderr));
    assertMatch(text, /demo passed in [\d.]+ s/);
    assertMatch(text, /web → its gateway 10\.99\.0\.1/);
    assertMatch(text, /db → its gateway 10\.98\.0\.1/, "the db profile's pod is in its own subnet");
    assertMatch(text, /eni-mock-db-0001\s+db\s/);
    assertMatch(
      text,
      /every ENI back in the pool \(free 5, owned 1, of which held for the sticky db pod 1\)/,
    );

    const namespaces = [
      ...text.matchAll(/^(?:node|VPC) namespace\s+(\S+)/gm),
      ...text.matchAll(/CNI_NETNS=\/run\/netns\/([^)\s]+)/g),
    ].map((m) => m[1]);
    assertEquals(namespaces.length, 5, "the demo names its node, VPC and three pod namespaces");
    const left = await listNetns();
    assertEquals(namespaces.filter((n) => left.includes(n)), []);

    const sandbox = text.match(/^sandbox\s+(\S+)/m)?.[1];
    assert(sandbox, "the demo names its sandbox");
    assert(!exists(sandbox), `sandbox ${sandbox} is gone`);

    const pid = text.match(/^agent\s+pid (\d+)/m)?.[1];
    assert(pid, "the demo names its agent");
    assert(!exists(`/proc/${pid}`), `agent ${pid} has exited`);
  },
});
