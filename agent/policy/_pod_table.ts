/**
 * A pod's policy table in its namespace: rendered whole when its turn comes (from the
 * engine's state then, after what the table holds), or edited by its sets' deltas.
 *
 * @module
 */
import {
  type CompiledPolicy,
  type DropLog,
  guardRuleset,
  podRuleset,
  type SetDelta,
  setDeltaCommands,
  setReplaceCommands,
} from "../../policy/mod.ts";
import type { DeviceLayer } from "../../netns/types.ts";
import { type Att, isolates, light } from "./_attachment.ts";
import type { LoadPlace, TableLoads } from "./_table_loads.ts";

/** What a pod's table reads of the enforcer. */
export interface PodTableDeps {
  devices: DeviceLayer;
  loads: TableLoads;
  dropLog: DropLog | undefined;
  /** The kernel has the raw-socket guard's hooks: each pod's guard follows its table. */
  guard: boolean;
  /** Whether the attachment is still under policy. */
  has(key: string): boolean;
  /** Whether the enforcer has an engine (has synced). */
  synced(): boolean;
  /** The pod's policy compiled now (kept light as `att.compiled`); null: not compiled. */
  compile(att: Att, members?: boolean): CompiledPolicy | null;
  failed(place: LoadPlace, netns: string | null, err: unknown): void;
}

/**
 * The pod's whole table, queued: rendered when its turn comes, from the engine's state
 * then and after what the table holds (`loaded`, which only a load that succeeded sets).
 */
export function renderPod(d: PodTableDeps, att: Att): Promise<boolean> {
  const netns = att.netns;
  if (netns === null || !d.synced()) return Promise.resolve(true);
  att.stale = false;
  return d.loads.enqueue(netns, async () => {
    if (!d.has(att.key)) return true;
    return await d.loads.renders.run(() => renderPodNow(d, att, netns));
  }, true);
}

/** Renders the pod's table from the engine's state now and loads it. */
async function renderPodNow(d: PodTableDeps, att: Att, netns: string): Promise<boolean> {
  try {
    const c = d.compile(att);
    if (!c) return true;
    // Still open and no table made: nothing to load.
    if (att.noTable && !isolates(c)) return true;
    const text = podRuleset(c, {
      eni: att.eni,
      previous: att.loaded ?? undefined,
      log: d.dropLog,
    });
    await d.devices.loadRuleset(netns, text);
    att.loaded = light(c);
    att.noTable = false;
    att.broken = false;
    await syncGuard(d, att, netns, isolates(c));
    return true;
  } catch (err) {
    // The transaction left what was there (or the render failed before it): rendered
    // whole again later.
    d.failed("pod", netns, err);
    att.stale = true;
    return false;
  }
}

/**
 * The pod's raw-socket guard brought to `enforce` (dropping what did not come through the
 * IP stack: the pod is isolated) when it holds something else or is not known; nothing
 * when the kernel has no guard.
 */
export async function syncGuard(
  d: Pick<PodTableDeps, "devices" | "guard">,
  att: Att,
  netns: string,
  enforce: boolean,
): Promise<void> {
  if (!d.guard || att.guard === enforce) return;
  await d.devices.loadRuleset(netns, guardRuleset(att.eni, enforce));
  att.guard = enforce;
}

/** The deltas of the pod's sets, queued; a failed edit replaces those sets whole. */
export function editPod(d: PodTableDeps, att: Att, deltas: SetDelta[]): Promise<boolean> {
  const text = deltas.map(setDeltaCommands).join("");
  if (text === "" || att.netns === null) return Promise.resolve(true);
  const netns = att.netns;
  return d.loads.load(netns, text, { quiet: true }).then((ok) => {
    if (ok) return true;
    // An element to delete was missing (a burst of events: a later delta's element went
    // with an earlier replace): the sets' current members, whole. Not a failure unless
    // that fails too.
    const c = d.compile(att);
    const keys = new Set(deltas.map((x) => x.key));
    const sets = c?.sets.filter((s) => keys.has(s.key)) ?? [];
    return d.loads.load(netns, sets.map(setReplaceCommands).join("")).then((again) => {
      if (!again) att.stale = true;
      return again;
    });
  });
}
