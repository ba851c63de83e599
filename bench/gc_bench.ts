/**
 * GC pass benchmark: 1000 recorded attachments, provider and device layer faked.
 *
 * `deno bench -A --config tests/deno.json bench/gc_bench.ts`
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";
import { nullLogger } from "../lib/log.ts";
import {
  type AllocationRequestInput,
  defaultProfile,
  type Eni,
  makeEni,
  type Owner,
  type Provider,
} from "../providers/contract.ts";
import { FakeDeviceLayer } from "../netns/fake.ts";
import { createManager, type Manager } from "../manager/manager.ts";

const N = 1000;
const DEAD = 100;
const T0 = 1_700_000_000_000;

/** An in-memory provider with every ENI owned by its attachment. */
class FakeProvider implements Provider {
  readonly name = "fake";
  enis = new Map<string, Eni>();
  list() {
    return Promise.resolve([...this.enis.values()]);
  }
  allocateNextENI(_o: Owner, _r: AllocationRequestInput): Promise<Eni> {
    return Promise.reject(new Error("unused"));
  }
  deallocateENI(o: Owner) {
    for (const e of this.enis.values()) {
      if (e.owner?.containerId === o.containerId && e.owner.ifName === o.ifName) {
        this.enis.set(e.id, { ...e, state: "free", owner: null });
      }
    }
    return Promise.resolve();
  }
  status() {
    return Promise.resolve({
      name: this.name,
      free: 0,
      owned: N,
      attachable: 0,
      details: {},
      profiles: {},
    });
  }
  profiles() {
    return [defaultProfile()];
  }
  close() {
    return Promise.resolve();
  }
}

/** A node with N ready attachments, DEAD of them with their netns deleted. */
async function setup(dead = DEAD): Promise<{ mgr: Manager; db: DatabaseSync }> {
  const db = new DatabaseSync(":memory:");
  const devices = new FakeDeviceLayer();
  const provider = new FakeProvider();
  const mgr = createManager({
    db,
    provider,
    devices,
    log: nullLogger,
    gcGraceMs: 60_000,
    now: () => T0 + 3_600_000,
  });
  const ins = db.prepare(
    `INSERT INTO attachments (container_id, if_name, pod, network, netns, netns_dev, netns_ino, mode,
       state, eni_id, mac, node_name, ifindex, result, created_at, updated_at)
     VALUES (?, 'eth0', ?, 'enim', ?, ?, ?, 'interface', 'ready', ?, ?, ?, ?, '{}', ?, ?)`,
  );
  db.exec("BEGIN");
  for (let i = 0; i < N; i++) {
    const mac = `02:e1:0a:00:${((i >> 8) & 0xff).toString(16).padStart(2, "0")}:${
      (i & 0xff).toString(16).padStart(2, "0")
    }`;
    const netns = `/run/netns/p${i}`;
    const id = devices.addNetns(netns);
    const link = devices.addNodeLink(mac, `ens${i}`);
    await devices.plug({ mac, netns, ifName: "eth0", addresses: [], routes: [] });
    const eniId = `eni-${i}`;
    provider.enis.set(
      eniId,
      makeEni({
        id: eniId,
        mac,
        ipv4: null,
        ipv6: null,
        subnetId: null,
        state: "owned",
        owner: { pod: `ns/pod-${i}`, containerId: `c${i}`, ifName: "eth0" },
      }),
    );
    ins.run(
      `c${i}`,
      `ns/pod-${i}`,
      netns,
      id.dev,
      id.ino,
      eniId,
      mac,
      `ens${i}`,
      link.ifindex,
      T0,
      T0,
    );
  }
  db.exec("COMMIT");
  for (let i = 0; i < dead; i++) devices.deleteNetns(`/run/netns/p${i * (N / dead)}`);
  return { mgr, db };
}

const dry = await setup();
Deno.bench({
  name: `GC dry run over ${N} attachments (${DEAD} dead)`,
  async fn() {
    const rep = await dry.mgr.gc({ dryRun: true });
    if (rep.items.length !== DEAD) throw new Error(`planned ${rep.items.length}`);
  },
});

Deno.bench({
  name: `GC pass over ${N} attachments, reclaiming ${DEAD}`,
  async fn(b) {
    const { mgr, db } = await setup();
    b.start();
    const rep = await mgr.gc({ dryRun: false });
    b.end();
    if (rep.items.filter((i) => i.outcome === "reclaimed").length !== DEAD) {
      throw new Error("not all reclaimed");
    }
    await mgr.close();
    db.close();
  },
});

Deno.bench({
  name: `GC pass over ${N} attachments, all dead (worst case)`,
  async fn(b) {
    const { mgr, db } = await setup(N);
    b.start();
    const rep = await mgr.gc({ dryRun: false });
    b.end();
    if (rep.items.length !== N) throw new Error(`reclaimed ${rep.items.length}`);
    await mgr.close();
    db.close();
  },
});

addEventListener("unload", () => dry.db.close());
