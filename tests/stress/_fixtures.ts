/**
 * Hand-made kernel views for the stress checkers' unit tests.
 *
 * @module
 */
import type { KernelLink } from "./_kernel.ts";

/** An ENI's device on the node as the kernel view shows it: named after its MAC, down, bare. */
export function nodeLink(mac: string, over: Partial<KernelLink> = {}): KernelLink {
  return {
    ifname: `en${mac.replaceAll(":", "")}`,
    mac,
    alias: null,
    up: false,
    addrs: [],
    globalAddrs: [],
    routes: [],
    nodeEnd: false,
    ...over,
  };
}
