/**
 * The agent under hostile or clumsy neighbours (issue 17): a second agent on the
 * same node, a rolling update, clients that send half a request, and non-root
 * users on a node in the systemd and in the DaemonSet layout. The real agent
 * process (the shipped bundle, the production permission set) in a sandbox,
 * with the mock provider and the fake device layer.
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { SocketAgentClient, unixRequest } from "../api/client.ts";
import { fakeDevicesConfig, podAddRequest, startAgent } from "./support/agent_proc.ts";
import { withSandbox } from "./support/run_dir.ts";
import { runEnim } from "./support/enim.ts";
import type { EnimSandbox } from "./support/sandbox.ts";

const AS_ROOT = Deno.uid() === 0;

/** The agent's files in the layout of the systemd unit and the DaemonSet (lib/, log/). */
function config(dir: string, extra: Record<string, unknown> = {}) {
  return fakeDevicesConfig(dir, { enis: 4 }, {
    statePath: `${dir}/lib/enim.db`,
    log: { level: "info", file: `${dir}/log/agent.log` },
    ...extra,
  });
}

/** Polls `fn` until it is true or `ms` pass. */
async function until(fn: () => Promise<boolean> | boolean, ms: number, what: string) {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

const readLog = (sb: EnimSandbox) => Deno.readTextFile(sb.host("log/agent.log")).catch(() => "");

Deno.test({
  name: "a second agent refuses at once and touches nothing while the first is mid-ADD",
  ignore: !AS_ROOT,
  async fn() {
    await withSandbox(async (dir, sb) => {
      // A 1.5 s attach: the ADD is in flight when the second agent starts.
      const agent = await startAgent(
        sb,
        config(dir, {
          provider: { name: "mock", mock: { enis: 4, preattached: 0, attachLatencyMs: 1500 } },
        }),
      );
      try {
        const c = new SocketAgentClient(agent.socket);
        const adding = c.add(podAddRequest(1));
        await until(async () => (await c.attachments()).length === 1, 5000, "the ADD's intent");
        const second = await runEnim(
          ["agent", "--config", `${dir}/agent.jsonc`, "--lock-wait", "0"],
          { sandbox: sb },
        );
        assertEquals(second.code, 1, second.stderr);
        assertStringIncludes(await readLog(sb), "Another enim agent holds");
        assertStringIncludes(await readLog(sb), "only one agent may run per node");
        const res = await adding;
        assertEquals((await c.attachments()).map((a) => [a.containerId, a.state, a.eniId]), [
          ["ctr-1", "ready", res.eniId],
        ]);
        assertEquals((await unixRequest(agent.socket, "GET", "/v1/healthz")).status, 200);
      } finally {
        assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
      }
    });
  },
});

Deno.test({
  name: "a new agent waits for the lock and takes over once the old one stops (rolling update)",
  ignore: !AS_ROOT,
  async fn() {
    await withSandbox(async (dir, sb) => {
      const old = await startAgent(sb, config(dir));
      const c = new SocketAgentClient(old.socket);
      const res = await c.add(podAddRequest(1));
      const [cmd, ...args] = sb.enim([
        "agent",
        "--config",
        `${dir}/agent.jsonc`,
        "--lock-wait",
        "30",
      ]);
      const next = new Deno.Command(cmd, {
        args,
        clearEnv: true,
        env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
        stdin: "null",
        stdout: "null",
        stderr: "null",
      }).spawn();
      try {
        await until(
          async () => (await readLog(sb)).includes("waiting for it to stop"),
          10_000,
          "the wait",
        );
        assertEquals((await old.stop("SIGTERM")).code, 0, old.stderr());
        await until(
          async () =>
            (await unixRequest(old.socket, "GET", "/v1/healthz", undefined, 1000).catch(() => null))
              ?.status === 200,
          20_000,
          "the new agent to serve",
        );
        assertEquals((await c.attachments()).map((a) => [a.containerId, a.eniId]), [[
          "ctr-1",
          res.eniId,
        ]]);
      } finally {
        try {
          Deno.kill(next.pid, "SIGTERM");
        } catch { /* gone */ }
        assertEquals((await next.status).code, 0);
      }
    });
  },
});

/** The agent's open file descriptors. */
function fdCount(pid: number): number {
  return [...Deno.readDirSync(`/proc/${pid}/fd`)].length;
}

Deno.test({
  name: "clients that send half a request are answered 408 or 503 and the agent's fds come back",
  ignore: !AS_ROOT,
  async fn() {
    await withSandbox(async (dir, sb) => {
      const agent = await startAgent(
        sb,
        config(dir, {
          api: { maxConnections: 16, requestTimeoutSeconds: 1 },
        }),
      );
      const conns: Deno.Conn[] = [];
      try {
        await unixRequest(agent.socket, "GET", "/v1/status");
        const baseline = fdCount(agent.pid);
        for (let i = 0; i < 50; i++) {
          const conn = await Deno.connect({ transport: "unix", path: agent.socket });
          conns.push(conn);
          await conn.write(
            new TextEncoder().encode("POST /v1/add HTTP/1.1\r\nContent-Length: 99\r\n\r\n{"),
          );
        }
        // Beyond the cap: answered at once, and the cap holds while the slow ones wait.
        const busy = await unixRequest(agent.socket, "GET", "/v1/healthz");
        assertEquals(busy.status, 503, busy.body);
        assertStringIncludes(busy.body, "Too many connections");
        assert(fdCount(agent.pid) <= baseline + 16 + 40, "the cap bounds the fds held");
        // The deadline closes the slow ones; then everything is served again.
        await until(
          async () => (await unixRequest(agent.socket, "GET", "/v1/healthz")).status === 200,
          5000,
          "the slow connections to be closed",
        );
        for (const c of conns) c.close();
        conns.length = 0;
        await until(() => fdCount(agent.pid) <= baseline, 5000, "fds back to the baseline");
      } finally {
        for (const c of conns) c.close();
        assertEquals((await agent.stop("SIGTERM")).code, 0, agent.stderr());
      }
    });
  },
});

/** Runs `argv` as a throwaway non-root user (uid/gid 54321, no groups) inside the sandbox. */
async function asStranger(sb: EnimSandbox, argv: string[]): Promise<number> {
  const [cmd, ...args] = sb.wrap([
    "/usr/bin/setpriv",
    "--reuid=54321",
    "--regid=54321",
    "--clear-groups",
    "--",
    ...argv,
  ]);
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "null" }).output();
  return out.code;
}

const mode = (path: string) => (Deno.statSync(path).mode! & 0o777).toString(8);

for (const layout of ["systemd", "daemonset"] as const) {
  Deno.test({
    name: `in the ${layout} layout nothing of enim's is readable or connectable by a non-root user`,
    ignore: !AS_ROOT,
    async fn() {
      await withSandbox(async (dir, sb) => {
        if (layout === "daemonset") {
          // hostPath DirectoryOrCreate: Kubernetes makes the directories 0755.
          for (const d of ["", "lib", "log"]) {
            await Deno.mkdir(sb.host(d), { recursive: true });
            await Deno.chmod(sb.host(d), 0o755);
          }
        }
        // A container's (and systemd's default) umask 022 for the agent and the plugin.
        const umask = Deno.umask(0o022);
        let agent;
        try {
          agent = await startAgent(sb, config(dir));
          const c = new SocketAgentClient(agent.socket);
          await c.add(podAddRequest(1));
          const v = await runEnim([], {
            sandbox: sb,
            env: { CNI_COMMAND: "VERSION", ENIM_LOG_FILE: `${dir}/log/cni.log` },
            stdin: '{"cniVersion":"1.1.0"}',
          });
          assertEquals(v.code, 0, v.stderr);
        } finally {
          Deno.umask(umask);
        }
        try {
          const expected: [string, string][] = [
            ["", "700"],
            ["enim.sock", "600"],
            ["lib", "700"],
            ["lib/enim.db", "600"],
            ["lib/enim.db-wal", "600"],
            ["lib/enim.db-shm", "600"],
            ["lib/enim.lock", "600"],
            ["log", "750"],
            ["log/agent.log", "600"],
            ["log/cni.log", "640"],
          ];
          for (const [rel, want] of expected) assertEquals([rel, mode(sb.host(rel))], [rel, want]);
          for (
            const rel of [
              "lib/enim.db",
              "lib/enim.db-wal",
              "lib/enim.lock",
              "log/agent.log",
              "log/cni.log",
            ]
          ) {
            assert(
              await asStranger(sb, ["/usr/bin/cat", `${dir}/${rel}`]) !== 0,
              `${rel} readable`,
            );
          }
          for (const rel of ["", "lib", "log"]) {
            assert(
              await asStranger(sb, ["/usr/bin/ls", `${dir}/${rel}`]) !== 0,
              `${rel}/ listable`,
            );
          }
          const connect =
            `import socket; socket.socket(socket.AF_UNIX).connect("${dir}/enim.sock")`;
          assert(
            await asStranger(sb, ["/usr/bin/python3", "-c", connect]) !== 0,
            "socket connectable",
          );
          // And root can, so the check above is not vacuous.
          const asRoot = await new Deno.Command(sb.wrap(["/usr/bin/python3", "-c", connect])[0], {
            args: sb.wrap(["/usr/bin/python3", "-c", connect]).slice(1),
            stdout: "null",
            stderr: "null",
          }).output();
          assertEquals(asRoot.code, 0);
        } finally {
          assertEquals((await agent!.stop("SIGTERM")).code, 0, agent!.stderr());
        }
      });
    },
  });
}
