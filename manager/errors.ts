/**
 * How a failure becomes the API error a client sees: storage failures, provider
 * reasons and device errors each get their stable code (`api/schema.ts`), anything
 * else is `internal`.
 *
 * @module
 */
import { ProviderError } from "../providers/contract.ts";
import { DeviceError } from "../netns/types.ts";
import { CommandTimeoutError } from "../netns/child.ts";
import { storageFailure, storageFailureMessage } from "../lib/sqlite.ts";
import { userMessage as message } from "../lib/message.ts";
import { ApiError } from "../api/schema.ts";

/**
 * Maps anything thrown by a step to the API error a client sees. `statePath`
 * names the database in a storage failure (a full disk, a read-only store).
 */
export function toApiError(err: unknown, statePath = "the state database"): ApiError {
  if (err instanceof ApiError) return err;
  const storage = storageFailure(err);
  if (storage) {
    return new ApiError("state_unavailable", storageFailureMessage(storage, statePath), undefined, {
      cause: err,
    });
  }
  if (err instanceof ProviderError) {
    if (
      err.reason === "no_eni_available" || err.reason === "requested_ip_unavailable" ||
      err.reason === "sticky_conflict" || err.reason === "wrong_zone"
    ) {
      return new ApiError(err.reason, err.message, undefined, { cause: err });
    }
    return new ApiError(
      "provider_error",
      `The provider failed (${err.reason}): ${err.message}`,
      err.requestId,
      {
        cause: err,
      },
    );
  }
  if (err instanceof DeviceError) {
    const code = err.reason === "ifname_exists"
      ? "ifname_exists"
      : err.reason === "netns_invalid" || err.reason === "netns_node"
      ? "netns_invalid"
      : "device_error";
    return new ApiError(code, err.message, `step: ${err.step}`, { cause: err });
  }
  // A child past its deadline that no step wrapped (a namespace's stat, say): the device
  // layer did not answer, as for any device error.
  if (err instanceof CommandTimeoutError) {
    return new ApiError("device_error", err.message, undefined, { cause: err });
  }
  return new ApiError("internal", message(err), undefined, { cause: err });
}
