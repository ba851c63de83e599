/**
 * Placeholder for the BCE provider (being written separately; this file will be replaced).
 *
 * @module
 */
import { z } from "zod";
import type { ProviderModule } from "../contract.ts";

/** The BCE provider's factory (placeholder: `create` throws). */
const mod: ProviderModule<Record<string, unknown>> = {
  configSchema: z.record(z.string(), z.unknown()),
  create() {
    return Promise.reject(new Error('The "bce" provider is not implemented in this build'));
  },
};
export default mod;
