/**
 * A pod's life across DEL and ADD on the real agent (issue 33): the agent process
 * (the shipped bundle, the production permission set) on a simulated node with real
 * namespaces, `ip` paused at a chosen step (tests/support/ip_faults.ts) so that a
 * second call arrives while the first is in the kernel.
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { withDeadline } from "../lib/async.ts";
import { SimulatedNode } from "./support/node.ts";
import { IpFaults } from "./support/ip_faults.ts";

const AS_ROOT = Deno.uid() === 0;

/** The DEL's move home: `ip link set dev <dev> netns <node> name <node name>` in the pod. */
const DEL_MOVE_BACK = String.raw`link\sset\sdev\s\S+\snetns\s\S+\sname\s`;

/** How many sockets the process has open. */
function sockets(pid: number): number {
  let n = 0;
  for (const e of Deno.readDirSync(`/proc/${pid}/fd`)) {
    try {
      if (Deno.readLinkSync(`/proc/${pid}/fd/${e.name}`).startsWith("socket:")) n++;
    } catch { /* closed meanwhile */ }
  }
  return n;
}

/** Waits until `cond` holds (polling); throws naming `what` after `ms`. */
async function until(what: string, cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`Timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Fails the test when `p` has not settled within 2 s (a bound for a wedge, not a speed test). */
function within2s<T>(p: Promise<T>, what: string): Promise<T> {
  return withDeadline(p, 2000, () => new Error(`${what} did not finish within 2 s`));
}

Deno.test({
  name:
    "a sticky pod's ADD sent again while its DEL is in the kernel finishes, with the same ENI, and the agent still reads and stops",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ nodeNic: true, mock: { enis: 2 } });
    const faults = await IpFaults.install(node);
    const pod = await node.vpc.pod("w");
    const call = node.podCall(pod, {
      args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=w;IgnoreUnknown=1;ENIM_STICKY=true",
      config: node.netconf("1.1.0", { serviceCidrs: ["172.30.0.0/16"] }),
    });
    const first = await node.cni("ADD", call);
    assertEquals(first.code, 0, first.stdout + first.stderr);
    assertEquals((first.json?.interfaces as unknown[]).length, 3, "the ENI and the host link");
    // The sticky DEL holds the attachment's lock while its device's move is in the kernel.
    await faults.pause("pod", DEL_MOVE_BACK);
    const del = node.cni("DEL", call);
    await faults.hit();
    // The runtime sends the ADD again (its plugin timed out and it retries; podman
    // restarts the container): it reaches the agent and queues on the attachment.
    const pid = node.agentPid!;
    const before = sockets(pid);
    const again = node.cni("ADD", call);
    await until("the agent took the second call", () => sockets(pid) > before);
    await new Promise((r) => setTimeout(r, 300));
    await faults.go();
    const [d, a] = await within2s(Promise.all([del, again]), "The DEL and the ADD behind it");
    await faults.uninstall();
    assertEquals(d.code, 0, d.stdout + d.stderr);
    assertEquals(a.code, 0, a.stdout + a.stderr);
    const mac = (r: typeof first) => (r.json?.interfaces as { mac: string }[])[0].mac;
    assertEquals(mac(a), mac(first), "the sticky pod keeps its ENI");
    const atts = await within2s(node.client.attachments(), "A read after them");
    assertEquals(atts.map((x) => [x.containerId, x.state]), [[call.containerId, "ready"]]);
    assert((await within2s(node.client.status(), "STATUS")).ready);
    const stopped = await node.stopAgent("SIGTERM");
    assertEquals(stopped?.code, 0, "the agent's close() returned");
  },
});

Deno.test({
  name:
    "a DEL through a /proc/<pid>/ns/net path (cri-dockerd's) answers only once the device is home",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const faults = await IpFaults.install(node);
    const pod = await node.vpc.pod("d");
    // The sandbox's process, as cri-dockerd names its namespace: by the PID's path.
    const sandbox = new Deno.Command("/usr/sbin/ip", {
      args: ["netns", "exec", pod.name, "sleep", "120"],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    try {
      const path = `/proc/${sandbox.pid}/ns/net`;
      await until(
        "the sandbox's process is in the pod's namespace",
        () => Deno.readLinkSync(path) !== Deno.readLinkSync("/proc/self/ns/net"),
      );
      const call = { ...node.podCall(pod), netns: path };
      const added = await node.cni("ADD", call);
      assertEquals(added.code, 0, added.stdout + added.stderr);
      await faults.pause("pod", DEL_MOVE_BACK);
      let answered = false;
      const del = node.cni("DEL", call).then((r) => (answered = true, r));
      await faults.hit();
      // An early answer would come now, before the move (a plain pod's DEL through a
      // /run/netns path answers here): give it time to show.
      await new Promise((r) => setTimeout(r, 1000));
      assertEquals(answered, false, "the DEL answered while its device was still in the pod");
      await faults.go();
      const d = await del;
      assertEquals(d.code, 0, d.stdout + d.stderr);
      await faults.uninstall();
      assertEquals(await node.client.attachments(), []);
      assertEquals((await node.client.status()).pool.free, 2, "the device is home, the ENI free");
    } finally {
      sandbox.kill("SIGKILL");
      await sandbox.status;
    }
  },
});

Deno.test({
  name:
    "a sticky container restarted under the same container ID (podman) gets its held ENI back: same MAC and IP",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({ mock: { enis: 2 } });
    const other = await node.vpc.pod("o");
    const pod = await node.vpc.pod("s");
    const call = node.podCall(pod, {
      args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=s;IgnoreUnknown=1;ENIM_STICKY=true",
    });
    // Another pod's ENI freed before the sticky pod's DEL: a fresh allocation would take it.
    await node.add(other);
    const first = await node.cni("ADD", call);
    assertEquals(first.code, 0, first.stdout + first.stderr);
    await node.del(other);
    const del = await node.cni("DEL", call);
    assertEquals(del.code, 0, del.stdout + del.stderr);
    assertEquals((await node.client.attachments()).map((a) => a.state), ["held"]);
    const again = await node.cni("ADD", call);
    assertEquals(again.code, 0, again.stdout + again.stderr);
    const view = (r: typeof first) => ({
      mac: (r.json?.interfaces as { mac: string }[])[0].mac,
      ips: (r.json?.ips as { address: string }[]).map((i) => i.address),
    });
    assertEquals(view(again), view(first));
    assertEquals((await node.client.attachments()).map((a) => [a.containerId, a.state]), [
      [call.containerId, "ready"],
    ]);
  },
});
