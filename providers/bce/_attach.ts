/**
 * Attaching an ENI to this node and waiting until it is `inuse`, as the cloud
 * really behaves (issue 49; the bounds and their sources: docs/agent.md, "What
 * the provider waits for, and how long"): a new ENI refused with
 * `EniStatusException` is attached again under the same clientToken; the wait
 * decides on `status` (an attaching ENI may show no `instanceId`); an attach that
 * falls back to `available` fails at once.
 *
 * @module
 */
import { ProviderError } from "../contract.ts";
import type { BceEni } from "./client.ts";
import { sleep } from "../../lib/async.ts";
import { BceApiError, isEniGone } from "./errors.ts";
import { type BceCore, BceStuckError } from "./_core.ts";
import { slotsUsed } from "./_slots.ts";

/**
 * Attaches a new ENI to this node. BCE refuses the attach of an ENI that is not
 * ready yet with 400 `EniStatusException` ("The eni status is not allowed to operate",
 * cce-network-v2/pkg/bce/vpceni/node_bcc.go, branch v2.11): Baidu's older CNI waits 5 s
 * after a create "or attach may fail" (branch cce-network-v1, pkg/eniipam/ipam/bcc/eni.go
 * `ENIReadyTimeToAttach`), the current one retries in a later pass every second for up to
 * 5 minutes (cce-network-v2/pkg/bce/bcesync/eni.go, `ENIMaxCreateDuration`). So while the
 * ENI reads `available` and BCE says its state is wrong, the attach is sent again under
 * the same clientToken, backing off from `pollMs` (at most 1 s) doubling to 5 s, until
 * `deadline` (the attach bound, `timeouts.attachMs`); only then does it fail (and the ENI
 * is cleaned up).
 */
export async function attachNew(
  core: BceCore,
  id: string,
  token: string,
  visibleBy: number,
  deadline: number,
): Promise<void> {
  const c = core.client;
  const me = core.o.instanceId;
  let delay = Math.min(core.t.pollMs, 1000);
  let refusals = 0;
  const started = Date.now();
  for (;;) {
    try {
      await untilVisible(core, id, visibleBy, () => c.attachEni(id, me, token));
      if (refusals > 0) {
        core.log.info("BCE accepted the attach of a new ENI after refusing it", {
          eniId: id,
          refusals,
          waitedMs: Date.now() - started,
        });
      }
      return;
    } catch (e) {
      if (e instanceof ProviderError && e.reason === "quota_exceeded") {
        core.quotaBlockedUntil = Date.now() + core.t.quarantineRetryMs;
        core.log.warn(
          "BCE refused an attach: this instance is at its ENI quota; no new ENI for a while",
          {
            eniId: id,
            until: new Date(core.quotaBlockedUntil).toISOString(),
            slotsUsed: slotsUsed(core),
            maxEnisPerNode: core.limit.max,
            limitSource: core.limit.source,
            error: e,
          },
        );
        throw e;
      }
      if (!(e instanceof BceApiError) || e.retryable || e.status < 400 || e.status >= 500) {
        throw e;
      }
      // Refused: decide from the ENI itself. Its status says whether our attach went
      // through; its instanceId may still be "" while it is attaching (no source says
      // it is set before the attach is done), so only another instance's id refutes it.
      const d = await c.getEni(id);
      if (d.status === "attaching" || d.status === "inuse") {
        if (!d.instanceId || d.instanceId === me) return;
        throw e;
      }
      if (
        d.status !== "available" || e.reason !== "wrong_state" ||
        Date.now() + delay > deadline || core.closed.signal.aborted
      ) {
        throw e;
      }
      if (refusals++ === 0) {
        core.log.info("BCE refused to attach a new ENI that is not ready yet; attaching again", {
          eniId: id,
          code: e.code,
          untilMs: deadline - Date.now(),
        });
      }
      await sleep(delay, core.closed.signal);
      delay = Math.min(5000, delay * 2);
    }
  }
}

/** Runs `fn` again while BCE says the ENI does not exist, until `until` (eventual consistency). */
export async function untilVisible<T>(
  core: BceCore,
  eniId: string,
  until: number,
  fn: () => Promise<T>,
): Promise<T> {
  let delay = Math.min(core.t.pollMs, 1000);
  let logged = false;
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (!isEniGone(e) || Date.now() + delay > until || core.closed.signal.aborted) throw e;
      if (!logged) {
        logged = true;
        core.log.info("A new ENI is not visible yet; retrying", {
          eniId,
          code: e instanceof BceApiError ? e.code : undefined,
        });
      }
      await sleep(delay, core.closed.signal);
      delay = Math.min(1000, delay * 2);
    }
  }
}

/**
 * Reads after an accepted attach that say `available` before the provider gives up on
 * it: an attach that turned back into `available` failed (Baidu's older CNI treats
 * `available` after an attach as a failure at once, branch cce-network-v1,
 * pkg/eniipam/ipam/bcc/eni.go); a few reads allow for a cloud slow to show `attaching`.
 */
export const AVAILABLE_READS_AFTER_ATTACH = 3;

/** The ENI turned up attached (or attaching) to another instance while this one waited for it. */
export class BceAttachedElsewhereError extends ProviderError {
  /** The instance that has it. */
  readonly holder: string;
  constructor(eniId: string, status: string, holder: string, me: string) {
    super("wrong_state", `ENI "${eniId}" is ${status} on instance "${holder}", not "${me}"`);
    this.name = "BceAttachedElsewhereError";
    this.holder = holder;
  }
}

/**
 * Polls an ENI after its attach until it is `inuse` here (backoff from pollMs to 5 s).
 * Decides on `status`: its `instanceId` may be "" while attaching, and only another
 * instance's id fails it. Fails fast when the attach falls back to `available`
 * (see {@linkcode AVAILABLE_READS_AFTER_ATTACH}); fails at `deadline` when still
 * `attaching` (stuck).
 */

export async function waitAttached(
  core: BceCore,
  eniId: string,
  deadline: number,
): Promise<BceEni> {
  const me = core.o.instanceId;
  let delay = core.t.pollMs;
  const started = Date.now();
  let seenAttaching = false;
  let available = 0;
  for (;;) {
    const d = await core.client.getEni(eniId);
    if (d.instanceId && d.instanceId !== me) {
      throw new BceAttachedElsewhereError(eniId, d.status, d.instanceId, me);
    }
    if (d.status === "inuse") return d;
    if (d.status === "attaching") seenAttaching = true;
    if (d.status === "available") available++;
    if (d.status === "available" && (seenAttaching || available >= AVAILABLE_READS_AFTER_ATTACH)) {
      throw new ProviderError(
        "unavailable",
        `The attach of ENI "${eniId}" to instance "${me}" fell back: it is available again after ${
          Date.now() - started
        } ms${seenAttaching ? " of attaching" : ""} (BCE gave up on the attach)`,
      );
    }
    if (Date.now() + delay > deadline || core.closed.signal.aborted) {
      throw new BceStuckError(
        eniId,
        d.status,
        `ENI "${eniId}" did not become inuse in time (waited ${
          Date.now() - started
        } ms; it is ${d.status})`,
      );
    }
    await sleep(delay, core.closed.signal);
    delay = Math.min(5000, delay * 2);
  }
}
