/**
 * The nftables model (nft_model.ts) against the kernel: the same texts, rendered by
 * policy/nft.ts and as the enforcer writes them (a whole node render over an earlier
 * agent's table, chains kept as they are, updates, set edits, a render that shrinks), and
 * the ones the kernel refuses (an element to delete that is not there, a set still in
 * use), loaded with `nft -f` in a fresh namespace and in the model: each is accepted by
 * both or refused by both, and after each the table holds the same objects (per set its
 * elements, per map its keys, per chain its rules).
 */
import { assertEquals } from "../../lib/assert.ts";
import { netnsExec, NFT_BIN } from "../../netns/ip.ts";
import { createNetns, deleteNetns, uniqueName } from "../../netns/sim.ts";
import { NODE } from "../../netns/fake.ts";
import {
  nodeNames,
  nodeRuleset,
  nodeUpdate,
  podRuleset,
  PolicyEngine,
  setDeltaCommands,
} from "../../policy/mod.ts";
import { NftModel } from "./nft_model.ts";
import { baseNamespaces, basePods, podObject, policyObject, viewOf } from "./policy_world.ts";

const ROOT = Deno.uid() === 0;
const T = "inet enim_policy";

async function load(ns: string, text: string): Promise<boolean> {
  const file = await Deno.makeTempFile({ suffix: ".nft" });
  try {
    await Deno.writeTextFile(file, text);
    return (await netnsExec(ns, [NFT_BIN, "-f", file])).code === 0;
  } finally {
    await Deno.remove(file);
  }
}

type Shape = Record<string, string[] | number>;

/** The kernel's table: `set:<name>` → elements count, `map:<name>` → keys, `chain:<name>` → rules. */
async function kernelShape(ns: string): Promise<Shape> {
  const out = await netnsExec(ns, [NFT_BIN, "-j", "list", "table", ...T.split(" ")]);
  if (out.code !== 0) return {};
  const items = (JSON.parse(out.stdout) as { nftables: Record<string, Record<string, unknown>>[] })
    .nftables;
  const shape: Shape = {};
  for (const item of items) {
    if (item.set) shape[`set:${item.set.name}`] = ((item.set.elem as unknown[]) ?? []).length;
    if (item.map) {
      shape[`map:${item.map.name}`] = ((item.map.elem as [string, unknown][]) ?? [])
        .map(([k]) => `"${k}"`).sort();
    }
    if (item.chain) shape[`chain:${item.chain.name}`] ??= 0;
    if (item.rule) {
      const k = `chain:${item.rule.chain}`;
      shape[k] = ((shape[k] as number | undefined) ?? 0) + 1;
    }
  }
  return shape;
}

/** The model's table in the same shape. */
function modelShape(m: NftModel): Shape {
  const t = m.tables.get(NODE);
  if (!t) return {};
  const shape: Shape = {};
  for (const [name, s] of t.sets) shape[`set:${name}`] = s.elements.size;
  for (const [name, map] of t.maps) shape[`map:${name}`] = [...map.keys()].sort();
  for (const [name, c] of t.chains) shape[`chain:${name}`] = c.rules.length;
  return shape;
}

Deno.test({
  name:
    "nft model: the enforcer's texts, and those the kernel refuses, are accepted or refused as nft does, leaving the same objects",
  ignore: !ROOT,
  async fn(t) {
    const pods = basePods();
    const DB = { matchLabels: { app: "db" } };
    const engine = new PolicyEngine(
      viewOf(pods.map(podObject), baseNamespaces(), [
        policyObject("alpha", "db", {
          podSelector: DB,
          ingress: [{
            from: [{ podSelector: { matchLabels: { app: "web" } } }, {
              ipBlock: { cidr: "10.0.0.0/16", except: ["10.0.3.0/24"] },
            }],
            ports: [{ port: 5432 }, { port: "http" }],
          }],
        }),
        policyObject("beta", "deny", { podSelector: {}, policyTypes: ["Ingress", "Egress"] }),
      ]),
      { nodeAddresses: ["10.0.0.254"] },
    );
    const local = (ns: string, name: string) => {
      const p = pods.find((x) => x.namespace === ns && x.name === name)!;
      return engine.addLocal({ namespace: ns, name, ips: p.ips }).compiled;
    };
    const db = local("alpha", "db"), job = local("beta", "job");
    const node = { ipv4: ["10.0.0.254"], ipv6: [] };
    const a = { nodeEnd: "enimh1", policy: db }, b = { nodeEnd: "enimh2", policy: job };
    const kept = (end: string) => {
      const n = nodeNames(end);
      return `table ${T} {\n\tchain ${n.ingress} { }\n\tchain ${n.egress} { }\n}\n` +
        `add element ${T} ingress_links { "${end}" : jump ${n.ingress} }\n` +
        `add element ${T} egress_links { "${end}" : jump ${n.egress} }\n`;
    };
    const dbSet = db.sets.find((s) => s.kind === "pods")!;
    const member = dbSet.ipv4[0] as string;
    const steps: [string, string][] = [
      [
        "a whole render over an earlier table",
        `table ${T} {}\ndelete table ${T}\n` +
        nodeRuleset([a, b], { node }),
      ],
      ["the same again", nodeRuleset([a, b], { node, previous: [a, b] })],
      [
        "a whole render keeping one pod's chains",
        nodeRuleset([b], { node, previous: [b] }) + kept("enimh1"),
      ],
      ["an update that drops a pod", nodeUpdate([a], { previous: [a, b] })],
      [
        "a whole render dropping a pod whose chains are not there",
        nodeRuleset([a], {
          node,
          previous: [a, { nodeEnd: "enimh9", policy: { ...job, sets: [] } }],
        }),
      ],
      [
        "a set edit",
        setDeltaCommands({
          key: dbSet.key,
          kind: "pods",
          users: [],
          ipv4: { add: ["10.0.1.77"], delete: [member] },
          ipv6: { add: [], delete: [] },
        }),
      ],
      [
        "a delete of an element no longer there (refused)",
        `delete element ${T} ${dbSet.key}_4 { ${member} }\n`,
      ],
      ["a delete of a set in use (refused)", `delete set ${T} ${dbSet.key}_4\n`],
      ["a map element added again, same verdict", kept("enimh1")],
      [
        "a map element added again, another verdict (refused)",
        `add element ${T} ingress_links { "enimh1" : jump ${nodeNames("enimh1").egress} }\n`,
      ],
      [
        "a delete of a chain still jumped to (refused)",
        `flush chain ${T} in_enimh1\ndelete chain ${T} in_enimh1\n`,
      ],
      [
        "a pod's ruleset over a table made again",
        `table ${T} {}\ndelete table ${T}\n${podRuleset(db, { eni: "eth0" })}`,
      ],
      ["a smaller pod ruleset over it", podRuleset(job, { eni: "eth0", previous: db })],
    ];
    const ns = uniqueName("enim-model");
    await createNetns(ns);
    try {
      const model = new NftModel();
      const refused: string[] = [];
      for (const [what, text] of steps) {
        await t.step(what, async () => {
          const kernel = await load(ns, text);
          let modelOk = true;
          try {
            model.apply(NODE, text);
          } catch {
            modelOk = false;
          }
          assertEquals(modelOk, kernel, `the model ${modelOk ? "accepted" : "refused"}:\n${text}`);
          if (!kernel) refused.push(what);
          assertEquals(modelShape(model), await kernelShape(ns));
        });
      }
      assertEquals(refused, steps.map(([w]) => w).filter((w) => w.endsWith("(refused)")));
    } finally {
      await deleteNetns(ns);
    }
  },
});
