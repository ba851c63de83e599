/**
 * The raw-socket guard (issue 48 point 1): what keeps a pod's packet sockets from
 * walking past its policy on its ENI. The policy's own chains (`policy/nft.ts`) are in
 * the IP stack's hooks (`inet` `input`/`output`); a packet socket (`AF_PACKET`, which
 * `CAP_NET_RAW` opens) hands frames to the device below all of them, with or without
 * `PACKET_QDISC_BYPASS`. What every frame leaving by the ENI does pass is the `netdev`
 * family's `egress` hook of the device (Linux 5.16; for `PACKET_QDISC_BYPASS` frames 5.17,
 * upstream "af_packet: Introduce egress hook"); a pod without `CAP_NET_ADMIN` can
 * neither see nor change a table there.
 *
 * That hook cannot tell a reply from a new flow (no `ct` expression in the `netdev`
 * family: the kernel refuses it), so it does not judge the policy again. It asks one
 * thing: did the frame come through the IP stack, whose hooks judged it? The stack's
 * frames carry a stamp that only netfilter can set: table `inet enim_guard`'s last
 * `postrouting` chain sets the packet's security mark (`skb->secmark`, which no socket
 * option sets; without an LSM that labels packets nothing else reads it either) on what
 * leaves by the ENI, and table `netdev enim_guard`'s `egress` chain on the ENI lets
 * through what carries it, and ARP (not IP, which no NetworkPolicy speaks of). Anything
 * else, a packet socket's IP frame whatever its destination, is counted
 * (`drop_raw`) and dropped: a pod its policy isolates (in either direction) speaks IP
 * on its ENI through the IP stack only. A pod no policy isolates keeps its packet
 * sockets (the chain is empty).
 *
 * Written as `nft -j` JSON: nft 1.0.6's text parser takes `meta secmark set` only with
 * a named secmark object, which needs an LSM's label; its JSON takes a number. The egress
 * chain copies the security mark to the packet mark to compare it (the text parser will
 * not compare a security mark with a number either) and clears it after.
 *
 * @module
 */

/** The two tables' name (families `inet` and `netdev`). */
export const GUARD_TABLE = "enim_guard";

/** The stamp: "enim" in ASCII, as the security mark of what the IP stack sends. */
export const GUARD_STAMP = 0x656e696d;

/** The counter of frames the guard dropped, in table `netdev enim_guard`. */
export const GUARD_COUNTER = "drop_raw";

/** The `postrouting` priority of the stamp: after everything (SELinux's last hook is 225). */
const STAMP_PRIORITY = 1000;

const IFNAME = /^[A-Za-z0-9_.-]{1,15}$/;

type Expr = Record<string, unknown>;
const meta = (key: string) => ({ meta: { key } });
const match = (left: unknown, right: unknown, op = "=="): Expr => ({ match: { op, left, right } });
const mangle = (key: string, value: unknown): Expr => ({ mangle: { key: meta(key), value } });

/**
 * The guard of one pod's ENI (`eni`, its name in the pod), as `nft -j -f` input:
 * declared (a no-op when there), both chains flushed and filled again in one
 * transaction. `enforce`: the pod's policy isolates it (frames without the stamp are
 * dropped); false: the stamp stays, the egress chain is empty.
 *
 * `device`: the device the `egress` chain hooks (the ENI; the probe names another).
 */
export function guardRuleset(eni: string, enforce: boolean, device = eni): string {
  for (const n of [eni, device]) {
    if (!IFNAME.test(n)) throw new TypeError(`Invalid interface name "${n}"`);
  }
  const inet = { family: "inet", table: GUARD_TABLE };
  const netdev = { family: "netdev", table: GUARD_TABLE };
  const rule = (where: typeof inet, chain: string, expr: Expr[]) => ({
    add: { rule: { ...where, chain, expr } },
  });
  const cmds: unknown[] = [
    { add: { table: { family: "inet", name: GUARD_TABLE } } },
    {
      add: {
        chain: {
          ...inet,
          name: "stamp",
          type: "filter",
          hook: "postrouting",
          prio: STAMP_PRIORITY,
          policy: "accept",
        },
      },
    },
    { flush: { chain: { ...inet, name: "stamp" } } },
    rule(inet, "stamp", [match(meta("oifname"), eni), mangle("secmark", GUARD_STAMP)]),
    { add: { table: { family: "netdev", name: GUARD_TABLE } } },
    { add: { counter: { ...netdev, name: GUARD_COUNTER } } },
    {
      add: {
        chain: {
          ...netdev,
          name: "egress",
          type: "filter",
          hook: "egress",
          dev: device,
          prio: 0,
          policy: "accept",
        },
      },
    },
    { flush: { chain: { ...netdev, name: "egress" } } },
  ];
  if (enforce) {
    cmds.push(
      rule(netdev, "egress", [match(meta("protocol"), "arp"), { accept: null }]),
      rule(netdev, "egress", [mangle("mark", meta("secmark"))]),
      rule(netdev, "egress", [
        match(meta("mark"), GUARD_STAMP),
        mangle("mark", 0),
        { accept: null },
      ]),
      rule(netdev, "egress", [{ counter: GUARD_COUNTER }, { drop: null }]),
    );
  }
  return JSON.stringify({ nftables: cmds }) + "\n";
}

/**
 * What the agent checks at start (`nft -c -j`, which the kernel validates and never
 * commits) to learn whether this kernel has the guard's hooks and expressions: the
 * guard with its stamp on a device name nothing has and its egress chain on `lo`.
 */
export function guardProbe(): string {
  return guardRuleset("enim-probe-0", true, "lo");
}
