/**
 * `enim uninstall`: takes enim off a node whose agent is stopped (the DaemonSet deleted,
 * or `systemctl stop enim-agent`), printing each step: every pod's attachment undone as
 * its DEL would (the device home, the host link and its rules gone), the node's ENIs
 * given back to the cloud (`releaseEnis`) or kept attached and free, enim's nftables
 * tables, rules, routes and host links that are left removed, then the state (database,
 * lock, the agent's record and socket), the plugin and the conflist deleted. With
 * `dryRun` it only says what it would do, changing nothing (the state is read, not
 * migrated; no provider is started).
 *
 * @module
 */
import { dirname, join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import type { AgentConfig } from "./config.ts";
import { type AgentDeps, startParts } from "./agent.ts";
import type { Logger } from "../lib/log.ts";
import { unixRequest } from "../api/client.ts";
import { AGENT_RECORD_NAME, REPLACING_NAME } from "../api/wire.ts";
import { kernelLeftovers, removeLeftover } from "../netns/uninstall.ts";
import { POLICY_TABLE } from "../policy/nft.ts";
import { FENCE_TABLE } from "../policy/fence.ts";

/** What {@linkcode uninstall} is asked to do. */
export interface UninstallOptions {
  /** Give the node's free ENIs back to the cloud (else they stay attached, free). */
  releaseEnis: boolean;
  dryRun: boolean;
  /** Where the plugin binary is (`enim` in it). */
  cniBinDir: string;
  /** Where the conflist is (every `*enim*.conflist` in it). */
  cniConfDir: string;
}

/** One step: what it is, and how it went. */
export interface UninstallStep {
  what: string;
  outcome: "done" | "would do" | "failed" | "skipped";
  error?: string;
}

/** Why uninstall did not start (the agent still runs). */
export class UninstallRefused extends Error {}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

/** The attachments recorded in the state, read only (a dry run migrates nothing). */
function recorded(statePath: string): { pod: string; eni: string | null; state: string }[] {
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(statePath, { readOnly: true });
  } catch {
    return [];
  }
  try {
    return db.prepare("SELECT pod, eni_id, state FROM attachments ORDER BY pod").all()
      .map((r) => ({
        pod: String(r.pod),
        eni: r.eni_id === null ? null : String(r.eni_id),
        state: String(r.state),
      }));
  } catch {
    return [];
  } finally {
    db.close();
  }
}

/** Runs the uninstall; `step` is called as each step ends (the CLI prints it). */
export async function uninstall(
  cfg: AgentConfig,
  deps: AgentDeps,
  log: Logger,
  o: UninstallOptions,
  step: (s: UninstallStep) => void = () => {},
): Promise<UninstallStep[]> {
  const steps: UninstallStep[] = [];
  const say = (s: UninstallStep) => {
    steps.push(s);
    step(s);
  };
  const act = async (what: string, fn: () => Promise<void>) => {
    if (o.dryRun) return say({ what, outcome: "would do" });
    try {
      await fn();
      say({ what, outcome: "done" });
    } catch (err) {
      say({ what, outcome: "failed", error: err instanceof Error ? err.message : String(err) });
    }
  };

  const running = await unixRequest(cfg.socket, "GET", "/v1/healthz", undefined, 2000)
    .then(() => true, () => false);
  if (running) {
    throw new UninstallRefused(
      `The enim agent is running at "${cfg.socket}": delete the DaemonSet (or stop ` +
        "enim-agent.service) first; uninstall undoes what the stopped agent left",
    );
  }

  const onDisk = cfg.statePath !== ":memory:" && await exists(cfg.statePath);
  if (onDisk && o.dryRun) {
    for (const a of recorded(cfg.statePath)) {
      say({
        what: `undo ${a.pod}'s attachment (${a.eni ?? "no ENI"}, ${a.state})`,
        outcome: "would do",
      });
    }
    say({
      what: o.releaseEnis
        ? "give the node's ENIs back to the cloud"
        : "keep the node's ENIs attached (free)",
      outcome: "would do",
    });
  } else if (onDisk) {
    // The agent's own parts, NetworkPolicy off (its table goes below) and reconcile done
    // at start: what a crash left half done is finished first.
    const parts = await startParts(
      { ...cfg, networkPolicy: { ...cfg.networkPolicy, enabled: false } },
      deps,
      log,
    );
    try {
      for (const a of parts.manager.attachments()) {
        await act(
          `undo ${a.pod}'s attachment (${a.eniId ?? "no ENI"}, ${a.state})`,
          () =>
            parts.manager.del({
              containerId: a.containerId,
              ifName: a.ifName,
              netns: a.netns,
              network: a.network,
            }),
        );
      }
      // The DELs' rest (device home, provider release) runs after they answer: waited for.
      await parts.manager.settled?.();
      const enis = await parts.provider.list();
      if (o.releaseEnis) {
        const release = parts.provider.releaseENI;
        for (const e of enis) {
          if (!release) {
            say({
              what: `give ${e.id} back to the cloud`,
              outcome: "skipped",
              error:
                `the ${parts.provider.name} provider cannot release ENIs: detach it in the cloud`,
            });
            continue;
          }
          await act(`give ${e.id} (${e.mac}) back to the cloud`, () => release(e.id));
        }
      } else {
        for (const e of enis) {
          say({ what: `keep ${e.id} (${e.mac}) attached, free`, outcome: "done" });
        }
      }
    } finally {
      await parts.close();
    }
  }

  for (const l of await kernelLeftovers([POLICY_TABLE, FENCE_TABLE])) {
    await act(`remove ${l.what}`, () => removeLeftover(l));
  }

  const dir = cfg.statePath === ":memory:" ? null : dirname(cfg.statePath);
  const files = [
    ...(dir
      ? [cfg.statePath, `${cfg.statePath}-wal`, `${cfg.statePath}-shm`, join(dir, "enim.lock")]
      : []),
    join(dirname(cfg.socket), AGENT_RECORD_NAME),
    join(dirname(cfg.socket), REPLACING_NAME),
    cfg.socket,
    join(o.cniBinDir, "enim"),
  ];
  try {
    for await (const e of Deno.readDir(o.cniConfDir)) {
      if (/enim.*\.conflist$/.test(e.name)) files.push(join(o.cniConfDir, e.name));
    }
  } catch { /* no such folder: nothing there */ }
  for (const f of files) {
    if (!(await exists(f))) continue;
    await act(`delete ${f}`, () => Deno.remove(f));
  }
  // What the image's installer put beside the plugin (scripts/image.ts installScript): deno
  // and the bundle of each version the launcher named.
  const payload = join(o.cniBinDir, "enim.d");
  if (await exists(payload)) {
    await act(`delete ${payload}`, () => Deno.remove(payload, { recursive: true }));
  }
  return steps;
}
