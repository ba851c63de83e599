/**
 * A child process that never answers (issue 33 item 3): on a simulated node whose
 * agent runs with `timeouts.commandSeconds: 1`, the `ip` wrapper of
 * `support/ip_faults.ts` makes one call hang (ignoring SIGTERM), once in the device's
 * move on the node and once in the configure batch fed to the pod's `ip -batch -`.
 * The agent kills it by its PID at the deadline; the ADD fails with 105 naming the
 * command and the deadline; the attachment's lock is free again, so a DEL that waited
 * behind the ADD goes on, and the pod's next ADD succeeds; nothing is left.
 */
import { assert, assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { type CniOutcome, SimulatedNode } from "./support/node.ts";
import { IpFaults } from "./support/ip_faults.ts";
import type { NetnsHandle } from "./support/vpc.ts";

const AS_ROOT = Deno.uid() === 0;
const IP = "/usr/sbin/ip";

/** The device's move into the pod (the node's `ip -batch`). */
const ADD_MOVE = String.raw`netns\s\S+\sname\seth0\salias`;
/** The configure batch fed to the pod's `ip -force -j -batch -` (its first line). */
const ADD_CONFIGURE = String.raw`^link\sshow\sdev\seth0$`;

function call(node: SimulatedNode, verb: string, ns: NetnsHandle, name: string, extra = {}) {
  return node.cni(verb, {
    containerId: `c-${name}`,
    ifName: "eth0",
    netns: ns.path,
    args: `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${name};IgnoreUnknown=1`,
    config: node.netconf("1.1.0", extra),
  });
}

function ok(r: CniOutcome, what: string): void {
  assertEquals(r.code, 0, `${what}: ${r.stdout}${r.stderr}`);
}

/** Whether a process with this PID exists. */
async function alive(pid: number): Promise<boolean> {
  try {
    await Deno.stat(`/proc/${pid}`);
    return true;
  } catch {
    return false;
  }
}

/** No record, nothing owned, every ENI's device on the node. */
async function clean(node: SimulatedNode): Promise<void> {
  assertEquals((await node.client.attachments()).map((a) => a.containerId), []);
  const enis = await node.client.enis();
  assertEquals(enis.filter((e) => e.owner).map((e) => e.id), []);
  const links = (await node.vpc.exec(node.vpc.node, [IP, "-o", "link", "show"])).stdout;
  for (const e of enis) assert(links.includes(e.mac), `the device of ${e.id} is on the node`);
}

/**
 * Runs an ADD that hangs at `regex` in `where`, with a DEL of the same attachment sent
 * while it hangs (it waits for the attachment's lock), and checks what each answers.
 */
async function hangingAdd(
  node: SimulatedNode,
  faults: IpFaults,
  where: "node" | "pod",
  regex: string,
  name: string,
  extra: Record<string, unknown>,
  step: string,
): Promise<void> {
  const pod = await node.vpc.pod(name);
  await faults.hang(where, regex);
  const started = performance.now();
  const adding = call(node, "ADD", pod, name, extra);
  await faults.hit();
  const pid = await faults.hungPid();
  assert(pid !== null && await alive(pid), "the hung ip is running");
  // The runtime gives up on the ADD and sends DEL: it queues behind the ADD's lock.
  const deleting = call(node, "DEL", pod, name, extra);
  try {
    const add = await adding;
    console.log(
      `command_deadline_test: after ${
        Math.round(performance.now() - started)
      } ms the user sees ${add.json?.code}: ${add.json?.msg}`,
    );
    assertEquals(add.code, 1, add.stdout);
    assertEquals(add.json?.code, 105, add.stdout);
    assertStringIncludes(String(add.json?.msg), step);
    assertStringIncludes(String(add.json?.msg), 'Cannot run "');
    assertStringIncludes(String(add.json?.msg), "no answer within 1 s; killed");
    assert(!(await alive(pid)), `the hung ip (PID ${pid}) was killed`);
  } finally {
    // Should the agent not have killed it, the test's own injected process goes, by its PID.
    if (await alive(pid)) Deno.kill(pid, "SIGKILL");
  }
  ok(await deleting, "the DEL that waited behind the ADD");
  await clean(node);
  // The same pod's next ADD, with nothing injected, goes through.
  ok(await call(node, "ADD", pod, name, extra), "the next ADD");
  ok(await call(node, "DEL", pod, name, extra), "its DEL");
  await clean(node);
}

Deno.test({
  name:
    "an ip that never answers is killed at the agent's command deadline: the ADD fails with 105 naming the command, the lock is released and the next operations go through",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({
      mock: { enis: 2 },
      gc: { intervalSeconds: 3600, graceSeconds: 0 },
      extra: { timeouts: { commandSeconds: 1 } },
    });
    const faults = await IpFaults.install(node);
    try {
      await t.step(
        "in the device's move into the pod (the node's ip -batch)",
        () => hangingAdd(node, faults, "node", ADD_MOVE, "hm", {}, "Cannot move link"),
      );
      await t.step("in the configure batch fed to the pod's ip -batch - (a stream)", () =>
        // Without a host link the fed process is the `ip` itself (with one, it is the
        // policy's shell, and SIGKILL reaches the shell only, not the `ip` it runs).
        hangingAdd(
          node,
          faults,
          "pod",
          ADD_CONFIGURE,
          "hc",
          { hostLink: { enabled: false } },
          'Cannot configure link "eth0"',
        ));
    } catch (err) {
      console.error((await node.agentLog()).slice(-4000));
      throw err;
    } finally {
      await faults.uninstall();
    }
  },
});
