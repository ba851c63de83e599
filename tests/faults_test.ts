/**
 * Faults of the node under the real agent and plugin (issue 17): the state's
 * disk full, the state read-only. What the user sees and what is left, as the
 * fault matrix of docs/faults.md says. The state lives on a small tmpfs mounted inside
 * the node's sandbox (its private mount namespace), so filling it touches
 * nothing outside.
 */
import { poll } from "../lib/async.ts";
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { SimulatedNode } from "./support/node.ts";
import type { NetnsHandle } from "./support/vpc.ts";

const AS_ROOT = Deno.uid() === 0;
const STATE_DIR = "/run/enim/lib";

function podArgs(name: string): string {
  return `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`;
}

/** Runs a command inside the node's sandbox; returns its exit code. */
async function inSandbox(node: SimulatedNode, argv: string[]): Promise<number> {
  const [cmd, ...args] = node.sandbox.wrap(argv);
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "null" }).output();
  return out.code;
}

/** A node whose agent keeps its state on a 1 MiB tmpfs of its own. */
async function nodeWithSmallState(): Promise<SimulatedNode> {
  const node = await SimulatedNode.start({
    startAgent: false,
    mock: { enis: 3 },
    extra: { statePath: `${STATE_DIR}/enim.db` },
  });
  try {
    await Deno.mkdir(node.sandbox.host("lib"), { recursive: true });
    const code = await inSandbox(node, [
      "/usr/bin/mount",
      "-t",
      "tmpfs",
      "-o",
      "size=1m,mode=0700",
      "tmpfs",
      STATE_DIR,
    ]);
    assertEquals(code, 0, "mount the state's tmpfs");
    await node.startAgent();
  } catch (err) {
    await node.close();
    throw err;
  }
  return node;
}

function call(node: SimulatedNode, verb: string, pod: NetnsHandle, id: string) {
  return node.cni(verb, {
    containerId: id,
    ifName: "eth0",
    netns: pod.path,
    args: podArgs(pod.name),
    config: node.netconf(),
  });
}

async function podLinks(node: SimulatedNode, pod: NetnsHandle): Promise<string> {
  return (await node.vpc.exec(pod, ["/usr/sbin/ip", "-o", "link", "show"])).stdout;
}

Deno.test({
  name:
    "a full state disk: DEL and ADD fail with 5 naming the state, change nothing, and work once there is room",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await nodeWithSmallState();
    const a = await node.vpc.pod("fa");
    const b = await node.vpc.pod("fb");
    const added = await call(node, "ADD", a, "cfa");
    assertEquals(added.code, 0, added.stdout);
    // Fill the state's disk (dd stops at ENOSPC).
    await inSandbox(node, ["/usr/bin/dd", "if=/dev/zero", `of=${STATE_DIR}/fill`, "bs=4k"]);

    const del = await call(node, "DEL", a, "cfa");
    assertEquals(del.code, 1, "a DEL that could not be recorded is not acknowledged");
    assertEquals(del.json!.code, 5);
    assertStringIncludes(String(del.json!.msg), `"${STATE_DIR}/enim.db"`);
    assertStringIncludes(String(del.json!.msg), "disk is full");
    assertEquals(
      (await node.client.attachments()).map((x) => [x.containerId, x.state]),
      [["cfa", "ready"]],
    );
    assertStringIncludes(await podLinks(node, a), "eth0", "the device is still in the pod");

    const add = await call(node, "ADD", b, "cfb");
    assertEquals([add.code, add.json!.code], [1, 5]);
    assertEquals((await node.client.status()).pool.owned, 1, "nothing allocated");

    // Room again: the runtime's retry of the DEL goes through.
    assertEquals(await inSandbox(node, ["/usr/bin/rm", "-f", `${STATE_DIR}/fill`]), 0);
    const retry = await call(node, "DEL", a, "cfa");
    assertEquals(retry.code, 0, retry.stdout);
    // A DEL answers once the rest cannot be lost; the move home follows at once.
    assert(
      await poll(async () => !(await podLinks(node, a)).includes("eth0") || null, {
        timeoutMs: 5000,
        intervalMs: 20,
      }),
      "the device left the pod",
    );
    assertEquals(await node.client.attachments(), []);
    assertEquals((await call(node, "ADD", b, "cfb")).code, 0);
  },
});

Deno.test({
  name:
    "a read-only state: the agent refuses to start naming the path, the plugin answers 11, nothing changes",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await nodeWithSmallState();
    const a = await node.vpc.pod("ra");
    assertEquals((await call(node, "ADD", a, "cra")).code, 0);
    // Killed: the agent that comes back cannot start, so the plugin must not wait for it
    // as for one being replaced (a graceful stop would: tests/restart_status_test.ts).
    await node.stopAgent("SIGKILL");
    // A file system cannot go read-only under open files: made so while the agent is down.
    assertEquals(await inSandbox(node, ["/usr/bin/mount", "-o", "remount,ro", STATE_DIR]), 0);
    let started = true;
    try {
      await node.startAgent();
    } catch {
      started = false;
    }
    assert(!started, "the agent does not start on a read-only state");
    const log = await node.agentLog();
    assertStringIncludes(log, STATE_DIR);
    assert(/read-only|Read-only/.test(log), `the log says read-only: ${log.slice(-800)}`);
    const b = await node.vpc.pod("rb");
    const add = await call(node, "ADD", b, "crb");
    assertEquals([add.code, add.json!.code], [1, 11]);
    assertStringIncludes(await podLinks(node, a), "eth0", "the pod keeps its device");
    // Writable again: the agent starts and finds everything as it was.
    assertEquals(await inSandbox(node, ["/usr/bin/mount", "-o", "remount,rw", STATE_DIR]), 0);
    await node.startAgent();
    assertEquals((await node.client.attachments()).map((x) => [x.containerId, x.state]), [[
      "cra",
      "ready",
    ]]);
  },
});
