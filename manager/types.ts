/**
 * The ENI manager's public face, as the API server and the agent command see it.
 *
 * The manager throws {@linkcode ApiError} (from `api/schema.ts`) for every failure a
 * client should see with a stable code; anything else becomes `internal`.
 *
 * @module
 */
import type * as z from "zod/mini";
import type {
  AddRequestSchema,
  AddResponse,
  Attachment,
  CheckRequestSchema,
  DelRequestSchema,
  GcReport,
  GcRequestSchema,
  Status,
} from "../api/schema.ts";
import type { Eni } from "../providers/contract.ts";
import type { LockProgress } from "./mutex.ts";

/** A parsed ADD request (defaults applied). */
export type AddInput = z.output<typeof AddRequestSchema>;
/** A parsed DEL request. */
export type DelInput = z.output<typeof DelRequestSchema>;
/** A parsed CHECK request. */
export type CheckInput = z.output<typeof CheckRequestSchema>;
/** A parsed GC request. */
export type GcInput = z.output<typeof GcRequestSchema>;

/** What reconcile found and did at start-up. */
export interface ReconcileReport {
  /** Half-done ADDs rolled back. */
  rolledBack: number;
  /** Half-done DELs finished. */
  finished: number;
  /** Provider ENIs owned by nobody the state knows, freed. */
  orphansFreed: number;
  /** Divergences between the provider, the state and the kernel repaired (each logged). */
  repaired: number;
  /** Problems that could not be fixed now (retried by the next GC pass). */
  errors: string[];
}

/** The seed's ENIManager, extended with CHECK, status and reconcile. */
export interface EniManager {
  /** Selects an ENI for the attachment and (interface mode) plugs it into the pod. */
  add(req: AddInput): Promise<AddResponse>;
  /**
   * Recycles the attachment's ENI: device back to the node, ENI reusable. Idempotent.
   * May resolve before the device is home (the rest recorded and the pod's namespace
   * held): {@linkcode EniManager.settled} waits for that rest.
   */
  del(req: DelInput): Promise<void>;
  /** Compares the live pod with the record and `expected`; throws `check_failed` on a difference. */
  check(req: CheckInput): Promise<void>;
  /** Finds dead attachments and (unless dry run) reclaims their ENIs. */
  gc(req: GcInput): Promise<GcReport>;
  /** Finishes or rolls back what a crash left half done (run at start-up). */
  reconcile(): Promise<ReconcileReport>;
  /**
   * Resolves when every DEL that has answered has also finished its rest; with `boundMs`
   * (a read), no later than `boundMs` after the latest of those DELs answered.
   */
  settled?(boundMs?: number): Promise<void>;
  status(): Promise<Status>;
  /**
   * Whether its operations move (its locks: {@linkcode LockProgress}), for the agent's
   * liveness. Absent: not told (fakes).
   */
  progress?(): LockProgress;
  /** What `status().ready` says, read without the state (absent: ask `status()`). */
  readonly ready?: boolean;
  attachments(): Attachment[];
  enis(): Promise<Eni[]>;
  close(): Promise<void>;
}

/** The pod and its ENI as {@linkcode PolicyHook.prepare} sees them. */
export interface PolicyPod {
  /** The pod, `namespace/name`. */
  pod: string;
  /** The pod's uid (CNI_ARGS `K8S_POD_UID`; absent when the runtime did not pass it). */
  uid?: string;
  /** The attachment key, `containerId/ifName`. */
  key: string;
  /** The ENI's addresses (no prefix), one per family it has. */
  addresses: { ipv4?: string; ipv6?: string };
  /** The ENI's name in the pod (`eth0`). */
  eniIfName: string;
  /** The node end of the pod's host link (`enimh…`). */
  nodeIfName: string;
  /** The node's own addresses, as the host link routes them (always allowed). */
  nodeAddresses: string[];
}

/** A pod the state records as ready with a host link, as the manager hands it over at start-up. */
export interface RestoredPolicyPod extends Omit<PolicyPod, "nodeAddresses"> {
  /** The pod's network namespace (what later edits of its table enter). */
  netns: string;
}

/**
 * NetworkPolicy enforcement as the manager sees it (the agent's enforcer implements it;
 * the manager knows nothing of Kubernetes). Every call is about one attachment, by key.
 */
export interface PolicyHook {
  /**
   * Called by ADD (interface mode with a host link) before it takes an ENI, so that an
   * ADD that cannot know its pod's policy yet holds none while it waits: null when the
   * enforcer has synced (the ADD goes on at once), otherwise a wait that resolves once it
   * has, or rejects (an {@linkcode ApiError}: `policy_unavailable` after the enforcer's
   * bound, `networkPolicy.syncWaitSeconds`) with what {@linkcode PolicyHook.prepare}
   * would have thrown.
   */
  whenSynced(): Promise<void> | null;
  /**
   * Called by ADD (interface mode with a host link) once the ENI and the host link are
   * planned, before the device is plugged: settles whether the pod's policy can be known
   * (a throw fails the ADD before anything moves). It returns the pod's own ruleset as a
   * call (null: no policy for this pod), which the plug makes once, when the device's
   * move has started: it loads the node's part (the node end's chains) and gives the
   * text the plug loads in the pod's namespace before the device is configured. A throw,
   * of either, fails the ADD (rolled back as any failure): an {@linkcode ApiError}
   * reaches the runtime as it is.
   */
  prepare(p: PolicyPod): Promise<{ podRuleset: () => Promise<string> } | null>;
  /**
   * The ADD recorded the attachment ready, the pod in `netns`: later edits go there.
   * Resolves once the pod's node chains are in place; a throw fails the ADD.
   */
  committed(key: string, netns: string): Promise<void>;
  /** The attachment is released (DEL, GC, a failed ADD, reconcile): its rules go. Never throws. */
  removed(key: string): Promise<void>;
  /**
   * At start-up, as reconcile begins: the attachments the state records ready with a host
   * link. The enforcer touches no table before this first call (it would not know the
   * node's pods).
   */
  restore(pods: RestoredPolicyPod[]): void;
  /**
   * A released ENI is about to go back to the pool (DEL, GC): null when its addresses
   * may go to another pod now; else a wait, which resolves once the cluster no longer
   * shows a pod holding them (other nodes would take the next pod for that one), or
   * after the enforcer's bound, or when `signal` aborts. Never rejects.
   */
  reuseWait(addresses: string[], signal: AbortSignal): Promise<void> | null;
}
