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
  attachments(): Attachment[];
  enis(): Promise<Eni[]>;
  close(): Promise<void>;
}
