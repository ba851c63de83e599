/**
 * `deno task demo` is the README's main job: it must pass and leave nothing behind
 * (namespaces, sandboxes, agent processes).
 */
import { assertEquals, assertMatch } from "../lib/assert.ts";
import { ROOT } from "./_enim.ts";
import { listNetns } from "../netns/sim.ts";

async function agentPids(): Promise<number[]> {
  const pids: number[] = [];
  for await (const e of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const cmd = await Deno.readTextFile(`/proc/${e.name}/cmdline`);
      if (cmd.includes("main.ts\0agent")) pids.push(Number(e.name));
    } catch { /* gone */ }
  }
  return pids.sort();
}

async function sandboxes(): Promise<string[]> {
  const out: string[] = [];
  for await (const e of Deno.readDir("/tmp")) if (e.name.startsWith("enim-sbx-")) out.push(e.name);
  return out.sort();
}

Deno.test({
  name: "deno task demo passes and leaves no namespaces, sandboxes or processes behind",
  ignore: Deno.uid() !== 0,
  async fn() {
    const before = { ns: (await listNetns()).sort(), sbx: await sandboxes(), pids: await agentPids() };
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
    assertMatch(text, /web → gateway 10\.99\.0\.1/);
    assertMatch(text, /every ENI back in the pool \(free 4, owned 0\)/);
    assertEquals((await listNetns()).sort(), before.ns);
    assertEquals(await sandboxes(), before.sbx);
    assertEquals(await agentPids(), before.pids);
  },
});
