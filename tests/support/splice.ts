/**
 * One connection relayed to another, both ways: what the test relays (the API server's
 * front, the bridge into a node, the loopback relay between namespaces) each do per
 * accepted connection.
 *
 * @module
 */

/**
 * A switch on one relayed connection: while `dropping`, the bytes read from either side
 * are thrown away (the connection stays open, with no FIN and no RST: a half-open path,
 * as a load balancer's failover or a NAT's timeout leaves one).
 */
export interface Gate {
  dropping: boolean;
}

/** A pass-through of chunks that throws them away while `gate.dropping`. */
function gated(gate: Gate): TransformStream<Uint8Array, Uint8Array> {
  return new TransformStream({
    transform(chunk, controller) {
      if (!gate.dropping) controller.enqueue(chunk);
    },
  });
}

/**
 * Copies bytes both ways between `conn` and the connection `connect` opens, until
 * either side ends, then closes both. Both are in `conns` while open (so that the
 * caller can cut them all); when `connect` fails, `conn` is closed: its client sees its
 * connection close, as when the other side went away. With a `gate`, the copy drops
 * what it reads, both ways, while the gate says so.
 */
export async function splice(
  conn: Deno.Conn,
  connect: () => Promise<Deno.Conn>,
  conns: Set<Deno.Conn>,
  gate?: Gate,
): Promise<void> {
  conns.add(conn);
  let up: Deno.Conn | null = null;
  try {
    up = await connect();
    conns.add(up);
    const from = (c: Deno.Conn) => gate ? c.readable.pipeThrough(gated(gate)) : c.readable;
    await Promise.all([
      from(conn).pipeTo(up.writable).catch(() => {}),
      from(up).pipeTo(conn.writable).catch(() => {}),
    ]);
  } catch {
    /* the other side is gone */
  } finally {
    for (const c of [conn, up]) {
      if (c === null) continue;
      conns.delete(c);
      try {
        c.close();
      } catch { /* closed by a pipe, or cut by the caller */ }
    }
  }
}
