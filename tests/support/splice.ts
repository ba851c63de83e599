/**
 * One connection relayed to another, both ways: what the test relays (the API server's
 * front, the bridge into a node, the loopback relay between namespaces) each do per
 * accepted connection.
 *
 * @module
 */

/**
 * Copies bytes both ways between `conn` and the connection `connect` opens, until
 * either side ends, then closes both. Both are in `conns` while open (so that the
 * caller can cut them all); when `connect` fails, `conn` is closed: its client sees its
 * connection close, as when the other side went away.
 */
export async function splice(
  conn: Deno.Conn,
  connect: () => Promise<Deno.Conn>,
  conns: Set<Deno.Conn>,
): Promise<void> {
  conns.add(conn);
  let up: Deno.Conn | null = null;
  try {
    up = await connect();
    conns.add(up);
    await Promise.all([
      conn.readable.pipeTo(up.writable).catch(() => {}),
      up.readable.pipeTo(conn.writable).catch(() => {}),
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
