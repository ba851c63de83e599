/**
 * Planted violations: each changes the node behind the agent's back, the
 * checker must report it (with the expected class and subject), and then it
 * is undone and the next check must be clean again. So a run that reports
 * nothing is known to have had a checker that works.
 *
 * - `device_moved`: an intact attachment's device is moved out of its pod onto the
 *   node under another name (the kernel's side); undone by a DEL, which must cope.
 * - `provider_freed`: the mock cloud's table shows an ENI an attachment holds as
 *   free (the shape of issue 17's hole a); undone by restoring the owner.
 * - `provider_ghost`: the mock cloud's table shows a free ENI owned by a key the
 *   agent never saw; undone by freeing it again.
 * - `host_link_stray`: a host link's node end no attachment records appears on the
 *   node (what a kill in the middle of an ADD must never leave); undone by deleting it.
 *
 * The mock cloud keeps its table in the agent's state database (`mock_enis`);
 * the plants write it with the agent idle, as another process would.
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";
import { z } from "zod";
import type { Violation, ViolationClass } from "./_checker.ts";
import type { StressContext } from "./_context.ts";
import type { Operations } from "./_clients.ts";
import { prng } from "../support/agent_proc.ts";
import { strayNodeEndArgs } from "../support/host_link_fixtures.ts";

/** A planted violation. */
export interface Plant {
  name: string;
  expect: ViolationClass;
}

/** The plants, in the order they run. */
export const PLANTS: Plant[] = [
  { name: "device_moved", expect: "ack_add_device" },
  { name: "provider_freed", expect: "attachment_eni_not_owned" },
  { name: "provider_ghost", expect: "provider_owner_unrecorded" },
  { name: "host_link_stray", expect: "host_link_orphan" },
];

/** The outcome of one plant. */
export interface PlantResult {
  name: string;
  expect: ViolationClass;
  subject: string | null;
  /** Whether the checker reported it; null when the plant could not be set up. */
  caught: boolean | null;
  /** What the checker reported while it was planted. */
  reported: string[];
  note?: string;
}

const OwnerRowSchema = z.object({
  owner_pod: z.string().nullable(),
  owner_container: z.string().nullable(),
  owner_if: z.string().nullable(),
});

function withDb<T>(path: string, fn: (db: DatabaseSync) => T): T {
  const db = new DatabaseSync(path);
  try {
    db.exec("PRAGMA busy_timeout = 10000");
    return fn(db);
  } finally {
    db.close();
  }
}

/**
 * Runs one plant against the idle node: plants it, runs `check` (which must report
 * the expected class for the subject), undoes it. `check` returns the violations.
 */
export async function runPlant(
  ctx: StressContext,
  ops: Operations,
  plant: Plant,
  check: () => Promise<Violation[]>,
): Promise<PlantResult> {
  const m = ctx.model;
  const db = ctx.node.sandbox.host("enim.db");
  const res: PlantResult = {
    name: plant.name,
    expect: plant.expect,
    subject: null,
    caught: null,
    reported: [],
  };
  let undo: (() => Promise<void>) | undefined;

  const intactKey = async () => {
    let k = [...m.keys.values()].find((x) => m.mustBeIntact(x));
    if (!k) {
      // Make one: an ADD through the API into a pod that holds nothing.
      const pod = m.pods.find((p) => !m.keysOfPod(p).some((x) => x.status === "added"));
      if (pod) {
        await ops.add({ index: -1, via: "api", rand: prng(ctx.opts.seed) }, pod);
        k = [...m.keys.values()].find((x) => m.mustBeIntact(x));
      }
    }
    return k;
  };

  if (plant.name === "device_moved") {
    const k = await intactKey();
    if (!k) return { ...res, note: "no intact attachment to move (no ENI free)" };
    const pod = m.pods[k.pod];
    res.subject = `${k.containerId}/${k.ifName}`;
    m.note(k, `PLANT: its device is moved out of the pod behind the agent's back`);
    const out = await new Deno.Command("/usr/sbin/ip", {
      args: [
        "-n",
        pod.nsName,
        "link",
        "set",
        "dev",
        k.ifName,
        "netns",
        ctx.node.vpc.node.path,
        "name",
        "stressplant0",
      ],
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!out.success) {
      return {
        ...res,
        note: `cannot move the device: ${new TextDecoder().decode(out.stderr).trim()}`,
      };
    }
    undo = async () => {
      await ctx.node.client.del({
        containerId: k.containerId,
        ifName: k.ifName,
        netns: pod.path,
        network: "enim-stress",
      });
      k.status = "deleted";
      k.finishing = true;
      if (k.containerId === m.containerId(pod)) pod.ctr++;
      m.note(k, "PLANT undone: DEL acknowledged");
    };
  } else if (plant.name === "provider_freed") {
    const atts = (await ctx.node.client.attachments()).filter((a) =>
      a.state === "ready" && a.eniId
    );
    let a = atts[0];
    if (!a) {
      const k = await intactKey();
      a = (await ctx.node.client.attachments()).find((x) => k && x.containerId === k.containerId)!;
    }
    if (!a?.eniId) return { ...res, note: "no attachment holds an ENI" };
    res.subject = `${a.containerId}/${a.ifName}`;
    const eniId = a.eniId;
    const before = withDb(db, (d) =>
      OwnerRowSchema.parse(
        d.prepare("SELECT owner_pod, owner_container, owner_if FROM mock_enis WHERE id = ?").get(
          eniId,
        ),
      ));
    withDb(
      db,
      (d) =>
        d.prepare(
          "UPDATE mock_enis SET owner_pod = NULL, owner_container = NULL, owner_if = NULL WHERE id = ?",
        )
          .run(eniId),
    );
    undo = () => {
      withDb(
        db,
        (d) =>
          d.prepare(
            "UPDATE mock_enis SET owner_pod = ?, owner_container = ?, owner_if = ? WHERE id = ?",
          )
            .run(before.owner_pod, before.owner_container, before.owner_if, eniId),
      );
      return Promise.resolve();
    };
  } else if (plant.name === "host_link_stray") {
    const name = "enimhplant00001";
    res.subject = name;
    const ip = (args: string[]) =>
      new Deno.Command("/usr/sbin/ip", {
        args: ["-n", ctx.node.vpc.node.name, ...args],
        stdout: "null",
        stderr: "piped",
      }).output();
    const out = await ip(strayNodeEndArgs(name, "enimhplant00002"));
    if (!out.success) {
      return {
        ...res,
        note: `cannot add a node end: ${new TextDecoder().decode(out.stderr).trim()}`,
      };
    }
    undo = async () => {
      await ip(["link", "del", "dev", name]);
    };
  } else if (plant.name === "provider_ghost") {
    const free = (await ctx.node.client.enis()).find((e) => !e.owner);
    if (!free) return { ...res, note: "no free ENI" };
    res.subject = free.id;
    withDb(
      db,
      (d) =>
        d.prepare(
          "UPDATE mock_enis SET owner_pod = ?, owner_container = ?, owner_if = ? WHERE id = ?",
        )
          .run("stress/ghost", `${m.runId}-ghost`, "eth0", free.id),
    );
    undo = () => {
      withDb(
        db,
        (d) =>
          d.prepare(
            "UPDATE mock_enis SET owner_pod = NULL, owner_container = NULL, owner_if = NULL WHERE id = ?",
          )
            .run(free.id),
      );
      return Promise.resolve();
    };
  } else {
    throw new TypeError(`Unknown plant "${plant.name}"`);
  }

  try {
    const found = await check();
    res.reported = found.map((v) => `${v.class} ${v.subject}`);
    res.caught = found.some((v) => v.class === plant.expect && v.subject === res.subject);
  } finally {
    await undo();
  }
  return res;
}
