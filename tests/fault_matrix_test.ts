/**
 * The fault matrix (issue 17; the table of docs/faults.md): `ip` failing at each step, the
 * pod's namespace deleted or replaced at each step, the provider failing at each
 * step, SIGTERM in the middle of a batch. Each case checks what the user sees (the
 * CNI exit code and message) and what is left (the agent's record, the cloud's
 * ownership, where the ENI's device is), and that the runtime's retry or the next
 * GC pass finishes the job. Disk full and a read-only state are in faults_test.ts,
 * a second agent in reliability_test.ts, SIGKILL at random moments in
 * `deno task stress`.
 */
import { assert, assertEquals, assertMatch, assertStringIncludes } from "../lib/assert.ts";
import { type CniOutcome, SimulatedNode } from "./support/node.ts";
import { IpFaults } from "./support/ip_faults.ts";
import type { NetnsHandle } from "./support/vpc.ts";

const AS_ROOT = Deno.uid() === 0;
const IP = "/usr/sbin/ip";

interface Pod {
  name: string;
  ns: NetnsHandle;
  id: string;
}

function call(node: SimulatedNode, verb: string, pod: Pod): Promise<CniOutcome> {
  return node.cni(verb, {
    containerId: pod.id,
    ifName: "eth0",
    netns: pod.ns.path,
    args: `K8S_POD_NAMESPACE=default;K8S_POD_NAME=${pod.name};IgnoreUnknown=1`,
    config: node.netconf(),
  });
}

async function newPod(node: SimulatedNode, name: string): Promise<Pod> {
  return { name, ns: await node.vpc.pod(name), id: `c-${name}` };
}

/** Whether the pod's namespace has a link with `mac` (false when the namespace is gone). */
async function inPod(node: SimulatedNode, ns: NetnsHandle, mac: string): Promise<boolean> {
  const out = await node.vpc.exec(ns, [IP, "-o", "link", "show"]);
  return out.code === 0 && out.stdout.includes(mac);
}

async function onNode(node: SimulatedNode, mac: string): Promise<boolean> {
  return (await node.vpc.exec(node.vpc.node, [IP, "-o", "link", "show"])).stdout.includes(mac);
}

/** What is left: the agent's records, and the ENIs the cloud shows owned. */
async function left(node: SimulatedNode) {
  const atts = await node.client.attachments();
  const enis = await node.client.enis();
  return {
    records: atts.map((a) => `${a.containerId}:${a.state}`).sort(),
    owned: enis.filter((e) => e.owner).map((e) => e.owner!.containerId).sort(),
  };
}

/** Everything free, every ENI's device on the node, and no record. */
async function clean(node: SimulatedNode): Promise<void> {
  assertEquals(await left(node), { records: [], owned: [] });
  for (const e of await node.client.enis()) {
    assert(await onNode(node, e.mac), `the device of ${e.id} (${e.mac}) is on the node`);
  }
}

function failedWith(r: CniOutcome, code: number, text: string): void {
  assertEquals(r.code, 1, `expected a failure: ${r.stdout}`);
  assertEquals(r.json?.code, code, String(r.json?.msg));
  assertStringIncludes(String(r.json?.msg), text);
  console.log(`fault_matrix_test: the user sees ${r.json?.code}: ${r.json?.msg}`);
}

async function succeeded(node: SimulatedNode, r: CniOutcome): Promise<void> {
  assertEquals(r.code, 0, `${r.stdout}\n${(await node.agentLog()).slice(-2000)}`);
}

async function withNode(
  fn: (node: SimulatedNode, faults: IpFaults) => Promise<void>,
  opts: Parameters<typeof SimulatedNode.start>[0] = {},
): Promise<void> {
  await using node = await SimulatedNode.start({
    mock: { enis: 3 },
    gc: { intervalSeconds: 3600, graceSeconds: 0 },
    ...opts,
  });
  const faults = await IpFaults.install(node);
  try {
    await fn(node, faults);
  } finally {
    await faults.uninstall();
  }
}

/** ADD's device steps: the move into the pod, and the configure batch inside it. */
const ADD_MOVE = String.raw`netns\s\S+\sname\seth0\salias`;
const ADD_CONFIGURE = String.raw`addr\sadd\s`;
/** DEL's device steps: the lookup in the pod, and the move back to the node. */
const DEL_LOOKUP = String.raw`^-j\slink\sshow$`;
/** The move back to the node: first by the device's altname, then, when that fails, after a lookup. */
const DEL_MOVE_BACK = String.raw`link\sset\sdev\s\S+\snetns\s\S+\sname\s`;

Deno.test({
  name: "fault matrix: ip failing at each step of ADD, DEL and CHECK",
  ignore: !AS_ROOT,
  async fn(t) {
    await withNode(async (node, faults) => {
      await t.step(
        "ADD, the move into the pod fails → 105; nothing is left; a retry works",
        async () => {
          const p = await newPod(node, "m1");
          await faults.fail("node", ADD_MOVE);
          failedWith(await call(node, "ADD", p), 105, "Cannot move link");
          assert(await faults.fired());
          await clean(node);
          await succeeded(node, await call(node, "ADD", p));
          await succeeded(node, await call(node, "DEL", p));
          await clean(node);
        },
      );
      await t.step(
        "ADD, configuring in the pod fails → 105; the device is back; a retry works",
        async () => {
          const p = await newPod(node, "m2");
          await faults.fail("pod", ADD_CONFIGURE);
          failedWith(await call(node, "ADD", p), 105, 'Cannot configure link "eth0"');
          await clean(node);
          await succeeded(node, await call(node, "ADD", p));
          await succeeded(node, await call(node, "DEL", p));
          await clean(node);
        },
      );
      await t.step("DEL, the move back fails once → the looked-up way brings it home", async () => {
        const p = await newPod(node, "m3a");
        await succeeded(node, await call(node, "ADD", p));
        await faults.fail("pod", DEL_MOVE_BACK);
        await succeeded(node, await call(node, "DEL", p));
        // The DEL answers before its device is home; the agent's reads wait for the rest.
        await clean(node);
        assert(await faults.fired());
      });
      await t.step(
        "DEL, the move back fails both ways → DEL answers 0, the record stays deleting, GC finishes",
        async () => {
          const p = await newPod(node, "m3");
          await succeeded(node, await call(node, "ADD", p));
          const mac = (await node.client.attachments())[0].mac!;
          await faults.fail("pod", DEL_MOVE_BACK, 2);
          await succeeded(node, await call(node, "DEL", p));
          assertEquals(await left(node), { records: [`${p.id}:deleting`], owned: [p.id] });
          assert(
            await inPod(node, p.ns, mac),
            "the device is still in the pod, the ENI still held",
          );
          const gc = await node.client.gc({ dryRun: false });
          assertEquals(gc.items.map((i) => i.outcome), ["reclaimed"]);
          assert(!(await inPod(node, p.ns, mac)));
          await clean(node);
        },
      );
      await t.step(
        "DEL, listing the pod's links fails → the ENI is never freed unaccounted",
        async () => {
          const p = await newPod(node, "m4");
          await succeeded(node, await call(node, "ADD", p));
          const mac = (await node.client.attachments())[0].mac!;
          // The direct way fails, then the lookup does.
          await faults.fail("pod", `(${DEL_MOVE_BACK})|(${DEL_LOOKUP})`, 2);
          await succeeded(node, await call(node, "DEL", p));
          // The device could not be accounted for: the ENI stays held, the record says
          // why, and the next GC pass finishes.
          assertEquals(await left(node), { records: [`${p.id}:deleting`], owned: [p.id] });
          assert(await inPod(node, p.ns, mac));
          const row = (await node.client.attachments())[0];
          console.log(`fault_matrix_test: DEL with the pod unreadable: record ${row.state}`);
          const gc = await node.client.gc({ dryRun: false });
          assertEquals(gc.items.map((i) => i.outcome), ["reclaimed"]);
          await clean(node);
        },
      );
      await t.step("CHECK, reading the pod fails → 106 naming it; nothing changes", async () => {
        const p = await newPod(node, "m5");
        const added = await call(node, "ADD", p);
        await succeeded(node, added);
        const before = await left(node);
        await faults.fail("pod", String.raw`route\sshow\stable\sall`);
        const check = await node.cni("CHECK", {
          containerId: p.id,
          ifName: "eth0",
          netns: p.ns.path,
          config: node.netconf("1.1.0", { prevResult: added.json }),
        });
        assertEquals(check.code, 1, check.stdout);
        assertMatch(String(check.json?.msg), /Cannot read link "eth0"|injected/);
        console.log(`fault_matrix_test: the user sees ${check.json?.code}: ${check.json?.msg}`);
        assertEquals(await left(node), before);
        await succeeded(node, await call(node, "DEL", p));
        await clean(node);
      });
    });
  },
});

Deno.test({
  name: "fault matrix: the pod's namespace deleted or replaced at each step",
  ignore: !AS_ROOT,
  async fn(t) {
    await withNode(async (node, faults) => {
      /** Runs `verb` paused at `regex` in `where`, and does `act` to the pod meanwhile. */
      const during = async (
        verb: string,
        p: Pod,
        where: "pod" | "node",
        regex: string,
        act: () => Promise<void>,
      ) => {
        await faults.pause(where, regex);
        const running = call(node, verb, p);
        await faults.hit();
        await act();
        await faults.go();
        return await running;
      };
      const del = (p: Pod) => node.vpc.deletePod(p.ns);
      const replace = async (p: Pod) => {
        await node.vpc.deletePod(p.ns);
        p.ns = await node.vpc.pod(p.name);
      };

      for (const [what, act] of [["deleted", del], ["replaced", replace]] as const) {
        await t.step(`ADD, ${what} before the move → 103; nothing is left`, async () => {
          const p = await newPod(node, `a${what[0]}1`);
          const r = await during("ADD", p, "node", ADD_MOVE, () => act(p));
          failedWith(r, 103, "was replaced during the ADD");
          await clean(node);
          if (what === "replaced") {
            assert(!(await inPod(node, p.ns, "eth0")), "nothing in the new namespace");
          }
        });
        await t.step(`ADD, ${what} while configuring → 103; nothing is left`, async () => {
          const p = await newPod(node, `a${what[0]}2`);
          const r = await during("ADD", p, "pod", ADD_CONFIGURE, () => act(p));
          failedWith(r, 103, "was replaced during the ADD");
          await clean(node);
        });
        await t.step(
          `DEL, ${what} before the move back → 0; the ENI is free, its device home`,
          async () => {
            const p = await newPod(node, `d${what[0]}1`);
            await succeeded(node, await call(node, "ADD", p));
            const r = await during("DEL", p, "pod", DEL_MOVE_BACK, () => act(p));
            await succeeded(node, r);
            await clean(node);
          },
        );
      }
      // Deleted with no DEL at all (kubelet gone): GC finds it and frees the ENI.
      await t.step("no DEL, the namespace deleted → the next GC pass frees the ENI", async () => {
        const p = await newPod(node, "gone");
        await succeeded(node, await call(node, "ADD", p));
        await node.vpc.deletePod(p.ns);
        const gc = await node.client.gc({ dryRun: false });
        assertEquals(gc.items.map((i) => i.outcome), ["reclaimed"]);
        await clean(node);
      });
    });
  },
});

Deno.test({
  name: "fault matrix: the provider failing at ADD and at DEL",
  ignore: !AS_ROOT,
  async fn(t) {
    await using node = await SimulatedNode.start({
      mock: { enis: 2 },
      gc: { intervalSeconds: 3600, graceSeconds: 0 },
    });
    const setErrorRate = async (errorRate: number) => {
      await node.stopAgent();
      await node.editConfig((c) => {
        const p = c.provider as { mock: Record<string, unknown> };
        p.mock = { ...p.mock, errorRate };
      });
      await node.startAgent();
    };
    const p = await newPod(node, "pv1");
    await t.step("ADD, allocate fails → 104 naming the cloud; nothing is left", async () => {
      await setErrorRate(1);
      failedWith(await call(node, "ADD", p), 104, "The cloud provider failed");
      await clean(node);
    });
    await t.step("DEL, deallocate fails → 0; device home, ENI held until GC frees it", async () => {
      await setErrorRate(0);
      await succeeded(node, await call(node, "ADD", p));
      const mac = (await node.client.attachments())[0].mac!;
      await setErrorRate(1);
      await succeeded(node, await call(node, "DEL", p));
      assertEquals(await left(node), { records: [`${p.id}:deleting`], owned: [p.id] });
      assert(await onNode(node, mac), "the device is back on the node");
      assert(!(await inPod(node, p.ns, mac)));
      // The provider answers again: the agent finishes the DEL (at its start here: reconcile;
      // while running: the next GC pass).
      await setErrorRate(0);
      await node.client.gc({ dryRun: false });
      await clean(node);
      assertMatch(
        await node.agentLog(),
        /(Finished a half-done DEL|GC reclaimed an ENI)[^\n]*c-pv1/,
      );
    });
  },
});

Deno.test({
  name: "fault matrix: SIGTERM in the middle of a batch of ADDs",
  ignore: !AS_ROOT,
  async fn() {
    await using node = await SimulatedNode.start({
      mock: { enis: 6, preattached: 0, attachLatencyMs: 400 },
      gc: { intervalSeconds: 3600, graceSeconds: 0 },
    });
    const pods = await Promise.all(Array.from({ length: 6 }, (_, i) => newPod(node, `t${i}`)));
    const calls = pods.map((p) => call(node, "ADD", p));
    await new Promise((r) => setTimeout(r, 250));
    const stopped = await node.stopAgent("SIGTERM");
    assertEquals(stopped?.code, 0, "a clean stop");
    const results = await Promise.all(calls);
    const ok = pods.filter((_, i) => results[i].code === 0);
    const failed = results.filter((r) => r.code !== 0);
    for (const r of failed) {
      // Answered "shutting down" or found no agent: both say try again later.
      assertEquals(r.json?.code, 11, r.stdout);
    }
    console.log(
      `fault_matrix_test: SIGTERM mid-batch: ${ok.length} ADDs finished, ${failed.length} answered 11 (${
        failed[0]?.json?.msg ?? "-"
      })`,
    );
    await node.startAgent();
    // What finished is intact; what failed left nothing; the retries then succeed.
    const after = await left(node);
    assertEquals(after.records, ok.map((p) => `${p.id}:ready`).sort());
    assertEquals(after.owned, ok.map((p) => p.id).sort());
    for (const p of pods.filter((p) => !ok.includes(p))) {
      await succeeded(node, await call(node, "ADD", p));
    }
    for (const p of pods) await succeeded(node, await call(node, "DEL", p));
    await clean(node);
  },
});
