/**
 * The manager's side of NetworkPolicy (the hook of `types.ts`, which the agent's enforcer
 * implements): ADD waits for the enforcer's first sync before it takes an ENI, asks for
 * the pod's ruleset before the plug and reports the attachment ready after it; a release
 * forgets it; reconcile hands over the pods the state holds ready. Nothing here knows
 * Kubernetes.
 *
 * @module
 */
import type { HostLinkSpec } from "../netns/types.ts";
import { AddResponseSchema, ApiError } from "../api/schema.ts";
import { userMessage } from "../lib/message.ts";
import { type AttachmentKey, keyOf } from "../providers/schema.ts";
import type { ManagerContext } from "./context.ts";
import type { OpTimer } from "./op_timer.ts";
import { type AttachmentRow, hostLinkOf } from "./state.ts";
import type { AddInput, RestoredPolicyPod } from "./types.ts";

/** The enforcer's own {@linkcode ApiError} as it is; anything else as `device_error`. */
function asPolicyError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  return new ApiError(
    "device_error",
    `NetworkPolicy: cannot put the pod's policy in place: ${userMessage(err)}`,
    undefined,
    { cause: err },
  );
}

/**
 * ADD's wait for the enforcer's first sync, before the ADD records its intent or takes an
 * ENI (interface mode with a host link), so that an ADD that cannot know its pod's policy
 * yet pins no ENI of the pool: null when there is nothing to wait for (policy off, no
 * host link, or synced: the ADD goes on without an await), otherwise the wait, timed as
 * the `policy_sync` phase. A failure is an {@linkcode ApiError}, as
 * {@linkcode preparePolicy}'s: the enforcer's own (`policy_unavailable` past its bound).
 */
export function policySynced(
  ctx: ManagerContext,
  req: Pick<AddInput, "mode" | "hostLink">,
  t: OpTimer,
): Promise<void> | null {
  if (!ctx.policy || req.mode !== "interface" || !req.hostLink) return null;
  const wait = ctx.policy.whenSynced();
  return wait && t.time("policy_sync", () => wait).catch((err) => {
    throw asPolicyError(err);
  });
}

/**
 * ADD's policy step, before the plug (interface mode with a host link): whether the
 * pod's policy can be known, and the pod's ruleset as a call the plug makes once, when
 * the device's move has started (undefined: policy is off); that call loads the node's
 * part and gives the text, timed as the `policy` phase with this step. A failure of
 * either is an {@linkcode ApiError}: the enforcer's own, or `device_error` naming
 * NetworkPolicy.
 */
export async function preparePolicy(
  ctx: ManagerContext,
  key: AttachmentKey,
  pod: { key: string; uid?: string },
  eniIfName: string,
  link: HostLinkSpec,
  t: OpTimer,
): Promise<(() => Promise<string>) | undefined> {
  if (!ctx.policy) return undefined;
  // Listed already for the link (HostLinks keeps them 30 s): no spawn here.
  const node = await ctx.hostLinks.nodeAddresses().then((n) => n.addresses, () => []);
  const rethrow = (err: unknown): never => {
    throw asPolicyError(err);
  };
  const r = await ctx.policy.prepare({
    pod: pod.key,
    ...(pod.uid ? { uid: pod.uid } : {}),
    key: keyOf(key),
    addresses: { ...link.podAddresses },
    eniIfName,
    nodeIfName: link.nodeIfName,
    nodeAddresses: node,
  }).catch(rethrow);
  if (!r) return undefined;
  let text: Promise<string> | undefined;
  return () => text ??= t.time("policy", () => r.podRuleset()).catch(rethrow);
}

/**
 * ADD recorded the attachment ready: the enforcer's later edits of its table go to
 * `netns`, and the ADD answers only once the pod's node chains are in place (a failure
 * fails the ADD, which is rolled back).
 */
export async function policyCommitted(
  ctx: ManagerContext,
  key: AttachmentKey,
  netns: string,
): Promise<void> {
  try {
    await ctx.policy?.committed(keyOf(key), netns);
  } catch (err) {
    throw asPolicyError(err);
  }
}

/** An attachment was released: the enforcer forgets it (never throws). */
export async function policyRemoved(ctx: ManagerContext, key: AttachmentKey): Promise<void> {
  await ctx.policy?.removed(keyOf(key)).catch((err) =>
    ctx.log.warn("NetworkPolicy: a released pod's rules could not be removed", {
      key: keyOf(key),
      error: userMessage(err),
    })
  );
}

/** The attachments `rows` holds ready with a host link, as the enforcer takes them over. */
export function restoredPolicyPods(rows: AttachmentRow[]): RestoredPolicyPod[] {
  const out: RestoredPolicyPod[] = [];
  for (const r of rows) {
    if (r.state !== "ready" || r.mode !== "interface" || r.result === null) continue;
    try {
      const link = hostLinkOf(r);
      const result = AddResponseSchema.parse(JSON.parse(r.result));
      if (!link) continue;
      const addresses: RestoredPolicyPod["addresses"] = {};
      for (const ip of result.ips) {
        const a = ip.address.split("/")[0];
        if (a.includes(":")) addresses.ipv6 ??= a;
        else addresses.ipv4 ??= a;
      }
      out.push({
        pod: r.pod,
        ...(r.podUid ? { uid: r.podUid } : {}),
        key: keyOf(r),
        addresses,
        eniIfName: r.ifName,
        nodeIfName: link.nodeIfName,
        netns: r.netns,
      });
    } catch {
      // A record this agent cannot read: reconcile and GC deal with it, not policy.
    }
  }
  return out;
}
