/**
 * The agent writes the node's conflist only once it answers on its socket, and keeps it
 * when it stops (issue 50): the built agent, run with exactly the `enim` permission set,
 * in a sandbox whose `/etc/cni/net.d` is a test folder at the production path. The agent
 * is held before it answers by a deterministic means (its lock, held by the test, as a
 * DaemonSet's old pod holds it during a rolling update), so "not yet" is observed without
 * a race; then it answers, the conflist lands, a stop keeps it and a restart leaves it be.
 *
 * @module
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { unixRequest } from "../api/client.ts";
import { fakeDevicesConfig, startAgent } from "./support/agent_proc.ts";
import { withSandbox } from "./support/run_dir.ts";
import { acquireAgentLock } from "../agent/lock.ts";
import { poll } from "../lib/async.ts";
import { ROOT } from "../scripts/_paths.ts";

const exists = (p: string) => Deno.lstat(p).then(() => true, () => false);

Deno.test("the agent writes the conflist only after it answers on its socket, and a stop and a restart keep it", async () => {
  await withSandbox(async (dir, sb) => {
    const conflist = await Deno.readTextFile(`${ROOT}/deploy/10-enim.conflist`);
    await Deno.mkdir(sb.host("cni"));
    await Deno.writeTextFile(sb.host("cni/10-enim.conflist"), conflist);
    const written = `${sb.netdDir}/10-enim.conflist`;
    const config = {
      ...fakeDevicesConfig(dir, { enis: 2 }),
      log: { level: "info", file: `${dir}/agent.log` },
      cniConfig: {
        source: `${dir}/cni/10-enim.conflist`,
        destination: "/etc/cni/net.d/10-enim.conflist",
      },
    };
    const log = () => Deno.readTextFile(sb.host("agent.log")).catch(() => "");
    // The old agent of a rolling update: the lock beside the state, held.
    await Deno.mkdir(sb.host("state"), { mode: 0o700 });
    const held = await acquireAgentLock(sb.host("state/enim.lock"), { waitMs: 0 });
    let released = false;
    const starting = startAgent(sb, config);
    try {
      const waiting = await poll(
        async () => (await log()).includes("another enim agent holds the lock") || null,
        { timeoutMs: 20_000, intervalMs: 20 },
      );
      assert(waiting, `the agent never waited for the lock:\n${await log()}`);
      const answers = await unixRequest(sb.host("enim.sock"), "GET", "/v1/healthz", undefined, 1000)
        .then(() => true, () => false);
      assertEquals(answers, false, "the agent does not answer yet");
      assertEquals(await exists(written), false, "no conflist before the agent answers");
      held.release();
      released = true;
    } finally {
      if (!released) held.release();
    }
    let agent = await starting;
    try {
      const landed = await poll(() => exists(written).then((e) => e || null), {
        timeoutMs: 20_000,
        intervalMs: 20,
      });
      assert(landed, `no conflist after the agent answered:\n${await log()}`);
      assertEquals(await Deno.readTextFile(written), conflist);
      assertEquals((await Deno.stat(written)).mode! & 0o777, 0o644);
      const text = await log();
      const served = text.indexOf('"msg":"serving the API"');
      const wrote = text.indexOf('"msg":"wrote the CNI config on the node');
      assert(served >= 0 && wrote > served, `the conflist came after the socket:\n${text}`);
      assertEquals(
        (await Array.fromAsync(Deno.readDir(sb.netdDir))).map((e) => e.name),
        ["10-enim.conflist"],
        "no temporary file left beside it",
      );
    } finally {
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
    const before = await Deno.stat(written);
    assertEquals(await Deno.readTextFile(written), conflist, "a stopped agent keeps the conflist");
    agent = await startAgent(sb, config);
    try {
      const same = await poll(
        async () =>
          (await log()).includes("the CNI config on the node is already this one") || null,
        { timeoutMs: 20_000, intervalMs: 20 },
      );
      assert(same, await log());
      assertEquals((await Deno.stat(written)).ino, before.ino, "a restart leaves it as it was");
    } finally {
      assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
    }
  }, { cniNetD: true });
});

Deno.test("enim agent --check-config checks cniConfig: a conflist enim cannot use, and a destination the permission set cannot write", async () => {
  const { runEnim } = await import("./support/enim.ts");
  await withSandbox(async (dir, sb) => {
    const cfg = (cniConfig: Record<string, string>) =>
      JSON.stringify({ ...fakeDevicesConfig(dir, {}), cniConfig });
    await Deno.mkdir(sb.host("cni"));
    await Deno.writeTextFile(
      sb.host("cni/bad.conflist"),
      JSON.stringify({
        cniVersion: "1.0.0",
        name: "x",
        plugins: [{ type: "enim", timeoutSeconds: -1 }],
      }),
    );
    await Deno.writeTextFile(sb.host("bad.jsonc"), cfg({ source: `${dir}/cni/bad.conflist` }));
    await Deno.writeTextFile(
      sb.host("elsewhere.jsonc"),
      cfg({ source: `${dir}/cni/bad.conflist`, destination: "/etc/other/10-enim.conflist" }),
    );
    await Deno.writeTextFile(
      sb.host("absent.jsonc"),
      cfg({ source: "/etc/enim/10-enim.conflist" }),
    );
    const run = (name: string) =>
      runEnim(["agent", "--check-config", "--config", `${dir}/${name}`], { sandbox: sb });
    const bad = await run("bad.jsonc");
    assertEquals(bad.code, 1, bad.stdout);
    assertStringIncludes(bad.stderr, `cniConfig.source "${dir}/cni/bad.conflist": plugins[0]: `);
    const elsewhere = await run("elsewhere.jsonc");
    assertEquals(elsewhere.code, 1);
    assertStringIncludes(
      elsewhere.stderr,
      'cniConfig.destination: the enim permission set may not write in "/etc/other"',
    );
    // The ConfigMap's file is on the node, not where a config is checked: named, not fatal.
    const absent = await run("absent.jsonc");
    assertEquals(absent.code, 0, absent.stderr);
    assertStringIncludes(absent.stdout, "/etc/enim/10-enim.conflist is not here");
  });
});
