/**
 * The Kubernetes list-and-watch cache (kube/) against the test API server
 * (tests/support/kube_apiserver.ts, built from the published API): convergence, paging,
 * bookmarks, 410 Gone in each of its forms, a server that goes down, cut connections,
 * token rotation, malformed events, the direct GET of one pod, TLS and client certificates.
 */
import { assert, assertEquals, assertMatch, assertRejects } from "../lib/assert.ts";
import { poll } from "../lib/async.ts";
import { Logger } from "../lib/log.ts";
import { makeTestPki, type TestPki } from "./support/kube_pki.ts";
import { KubeApiServer, type KubeApiServerOptions } from "./support/kube_apiserver.ts";
import { makeNamespace, makeNetworkPolicy, makePod } from "./support/kube_objects.ts";
import { Kube, type KubeOptions } from "../kube/mod.ts";
import { KubeRequestError } from "../kube/client.ts";
import type { KubeAccess } from "../kube/access.ts";
import type { Pod } from "../kube/objects.ts";

/** Fast retries: the tests wait for outcomes, never assert on durations. */
const FAST: KubeOptions = { backoff: { initialMs: 20, maxMs: 100 }, pageSize: 2 };

async function withServer(
  fn: (server: KubeApiServer, pki: TestPki) => Promise<void>,
  o: Omit<KubeApiServerOptions, "pki"> = {},
): Promise<void> {
  const pki = await makeTestPki();
  const server = KubeApiServer.start({ pki, ...o });
  try {
    await fn(server, pki);
  } finally {
    await server.close();
    await Deno.remove(pki.dir, { recursive: true });
  }
}

function accessTo(server: KubeApiServer, token: KubeAccess["token"] = { value: "test-token" }) {
  return { server: server.url, caCerts: [server.pki.caCert], token, source: "test" };
}

async function until(what: string, check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const ok = await poll(() => Promise.resolve(check() ? true : null), {
    timeoutMs,
    intervalMs: 10,
  });
  if (ok === null) throw new Error(`Timed out waiting for ${what}`);
}

/** A handler that writes each change as `old -> new` (name@resourceVersion, `-` for none). */
function recorder(): { events: string[]; handler: (o?: Pod, n?: Pod) => void } {
  const events: string[] = [];
  const at = (p?: Pod) => (p ? `${p.metadata.name}@${p.metadata.resourceVersion}` : "-");
  return { events, handler: (o, n) => events.push(`${at(o)} -> ${at(n)}`) };
}

function pod(name: string, ip: string, labels: Record<string, string> = { app: name }) {
  return makePod({ namespace: "default", name, ip, labels, nodeName: "n1" });
}

/** The list requests of `path`: their resourceVersion, limit, continue (set or not), source. */
function listsOf(server: KubeApiServer, path = "/api/v1/pods") {
  return server.requests.filter((r) => !r.watch && r.path === path).map((r) => [
    r.status,
    r.query.resourceVersion ?? null,
    r.query.limit ?? null,
    r.query.continue !== undefined,
    r.source ?? null,
  ]);
}

Deno.test("the first list asks resourceVersion=0 and takes the whole collection the watch cache answers at once", async () => {
  await withServer(async (server) => {
    for (let i = 0; i < 5; i++) server.put("pods", pod(`p${i}`, `10.1.0.${i}`));
    server.put("namespaces", makeNamespace("a"));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.pods.waitSynced(10_000), "synced");
      assert(await kube.namespaces.waitSynced(10_000), "synced");
      assertEquals(kube.pods.size, 5);
      // limit=2 asked, and ignored by the watch cache: one request, no etcd read.
      assertEquals(listsOf(server), [[200, "0", "2", false, "watchCache"]]);
      assertEquals(listsOf(server, "/api/v1/namespaces"), [[200, "0", "2", false, "watchCache"]]);
      assertEquals(kube.pods.stats().resourceVersion, server.resourceVersion);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a server without a watch cache pages the first list from etcd; the later pages carry continue alone", async () => {
  await withServer(async (server) => {
    for (let i = 0; i < 5; i++) server.put("pods", pod(`p${i}`, `10.1.0.${i}`));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.pods.waitSynced(10_000), "synced");
      assertEquals(kube.pods.size, 5);
      assertEquals(listsOf(server), [
        [200, "0", "2", false, "etcd"],
        [200, null, "2", true, "etcd"],
        [200, null, "2", true, "etcd"],
      ]);
      // After a watch's 410 a server that pages lists the latest in pages (an exact read
      // of the gone version would be gone too).
      await until("the watch", () => server.watchCount("pods") === 1);
      server.put("pods", pod("p9", "10.1.0.9"));
      server.compact();
      server.expireWatches("pods");
      await until("a relist", () => kube.pods.stats().relists === 1);
      assertEquals(listsOf(server).slice(3), [
        [200, null, "2", false, "etcd"],
        [200, null, "2", true, "etcd"],
        [200, null, "2", true, "etcd"],
      ]);
      assertEquals(kube.pods.size, 6);
    } finally {
      await kube.close();
    }
  }, { watchCache: false });
});

Deno.test("the cache follows creates, updates and deletes", async () => {
  await withServer(async (server) => {
    for (let i = 0; i < 5; i++) server.put("pods", pod(`p${i}`, `10.1.0.${i}`));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.pods.waitSynced(10_000), "synced");
      assertEquals(kube.pods.size, 5);
      const rec = recorder();
      kube.pods.subscribe(rec.handler, { replay: false });
      const added = server.put("pods", pod("p9", "10.1.0.9"));
      const before = server.get("pods", "default/p2")!.metadata.resourceVersion;
      const changed = server.put("pods", pod("p2", "10.1.0.2", { app: "p2", tier: "db" }));
      server.remove("pods", "default", "p3");
      const deletedRv = server.resourceVersion;
      await until("three events", () => rec.events.length === 3);
      assertEquals(rec.events, [
        `- -> p9@${added.metadata.resourceVersion}`,
        `p2@${before} -> p2@${changed.metadata.resourceVersion}`,
        `p3@${deletedRv} -> -`,
      ]);
      assertEquals(kube.pods.get("default/p2")?.metadata.labels, { app: "p2", tier: "db" });
      assertEquals(kube.pods.get("default/p3"), undefined);
      assertEquals(kube.pods.byIndex("ip", "10.1.0.9").map((p) => p.metadata.name), ["p9"]);
      assertEquals(kube.pods.byIndex("namespace", "default").length, 5);
      assertEquals(kube.pods.byIndex("node", "n1").length, 5);
      const s = kube.pods.stats();
      assertEquals([s.synced, s.objects, s.lists, s.relists, s.events], [true, 5, 1, 0, 3]);
      assertEquals(s.resourceVersion, deletedRv);
      assert(s.lastEventAt !== null);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a handler subscribed late hears the objects already held, as adds", async () => {
  await withServer(async (server) => {
    server.put("namespaces", makeNamespace("a", { team: "a" }));
    server.put("namespaces", makeNamespace("b"));
    server.put("networkpolicies", makeNetworkPolicy("a", "web"));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.namespaces.waitSynced(10_000));
      assert(await kube.networkPolicies.waitSynced(10_000));
      assert(kube.namespaces === kube.namespaces, "one shared cache per kind");
      const names: string[] = [];
      kube.namespaces.subscribe((o, n) =>
        names.push(`${o?.metadata.name ?? "-"}>${n?.metadata.name}`)
      );
      assertEquals(names.sort(), ["->a", "->b"]);
      assertEquals(kube.namespaces.get("a")?.metadata.labels?.team, "a");
      assertEquals(
        kube.networkPolicies.byIndex("namespace", "a").map((p) => p.metadata.name),
        ["web"],
      );
      assertEquals(kube.stats().map((s) => s.resource).sort(), ["namespaces", "networkpolicies"]);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a bookmark moves the resourceVersion on, and the next watch starts there", async () => {
  await withServer(async (server) => {
    server.put("pods", pod("a", "10.1.0.1"));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("the watch", () => server.watchCount("pods") === 1);
      // Other kinds' writes move the shared resourceVersion; pods hear of it by bookmark only.
      server.put("namespaces", makeNamespace("x"));
      server.put("namespaces", makeNamespace("y"));
      const rv = server.resourceVersion;
      assert(kube.pods.stats().resourceVersion !== rv);
      server.bookmark();
      await until("the bookmark", () => kube.pods.stats().bookmarks === 1);
      assertEquals(kube.pods.stats().resourceVersion, rv);
      server.endWatches();
      await until("a new watch", () => server.count("pods", "watch") === 2);
      const watches = server.requests.filter((r) => r.watch && r.path === "/api/v1/pods");
      assertEquals(watches[1].query.resourceVersion, rv);
      assertEquals(watches[0].query.allowWatchBookmarks, "true");
      assert(Number(watches[0].query.timeoutSeconds) > 0);
      const s = kube.pods.stats();
      assertEquals([s.lists, s.relists, s.watchRestarts, s.errors], [1, 0, 1, 0]);
    } finally {
      await kube.close();
    }
  });
});

/**
 * While the cache cannot watch, `a` changes, `b` goes, `d` comes and `c` stays; the server
 * compacts. When the cache is back its watch is gone (410): it lists again and hears
 * exactly those three differences, nothing for `c`.
 */
async function goneWhileAway(server: KubeApiServer): Promise<void> {
  for (const n of ["a", "b", "c"]) server.put("pods", pod(n, `10.1.0.${n.charCodeAt(0)}`));
  const kube = new Kube(accessTo(server), "n1", FAST);
  try {
    assert(await kube.pods.waitSynced(10_000));
    const rec = recorder();
    kube.pods.subscribe(rec.handler, { replay: false });
    await until("the watch", () => server.watchCount("pods") === 1);
    const aBefore = server.get("pods", "default/a")!.metadata.resourceVersion;
    const bBefore = server.get("pods", "default/b")!.metadata.resourceVersion;
    const rvBefore = kube.pods.stats().resourceVersion;
    await server.down();
    const a = server.put("pods", pod("a", "10.1.0.97", { app: "a", v: "2" }));
    server.remove("pods", "default", "b");
    const d = server.put("pods", pod("d", "10.1.0.100"));
    server.compact();
    server.up();
    await until("a relist", () => kube.pods.stats().relists === 1);
    // The relist asks "not older than" the last version seen, whole, from the watch
    // cache: no quorum read, and never back in time.
    assertEquals(listsOf(server).at(-1), [200, rvBefore, null, false, "watchCache"]);
    assertEquals(rec.events.sort(), [
      `- -> d@${d.metadata.resourceVersion}`,
      `a@${aBefore} -> a@${a.metadata.resourceVersion}`,
      `b@${bBefore} -> -`,
    ]);
    assertEquals([...kube.pods.values()].map((p) => p.metadata.name).sort(), ["a", "c", "d"]);
    await until("a watch after the relist", () => server.watchCount("pods") === 1);
    const more = server.put("pods", pod("e", "10.1.0.101"));
    await until("the next event", () => rec.events.length === 4);
    assertEquals(rec.events[3], `- -> e@${more.metadata.resourceVersion}`);
  } finally {
    await kube.close();
  }
}

Deno.test("a 410 Gone status when the watch starts lists again; handlers hear only the differences", async () => {
  await withServer(async (server) => {
    await goneWhileAway(server);
    assert(server.requests.some((r) => r.watch && r.status === 410), "the server answered 410");
  }, { watchGone: "status" });
});

Deno.test("a 410 ERROR event when the watch starts lists again; handlers hear only the differences", async () => {
  await withServer(async (server) => {
    await goneWhileAway(server);
    assert(!server.requests.some((r) => r.status === 410), "the server answered 200 and an ERROR");
  }, { watchGone: "event" });
});

Deno.test("a 410 ERROR event in the middle of a stream lists again without repeating events", async () => {
  await withServer(async (server) => {
    server.put("pods", pod("a", "10.1.0.1"));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.pods.waitSynced(10_000));
      const rec = recorder();
      kube.pods.subscribe(rec.handler, { replay: false });
      await until("the watch", () => server.watchCount("pods") === 1);
      const b = server.put("pods", pod("b", "10.1.0.2"));
      await until("b", () => rec.events.length === 1);
      server.compact();
      server.expireWatches("pods");
      await until("a relist", () => kube.pods.stats().relists === 1);
      await until("a watch after the relist", () => server.watchCount("pods") === 1);
      // The relist found a and b unchanged: no event repeated.
      assertEquals(rec.events, [`- -> b@${b.metadata.resourceVersion}`]);
      assertEquals(kube.pods.size, 2);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("an expired continue token starts the list again from its first page", async () => {
  await withServer(async (server) => {
    for (let i = 0; i < 6; i++) server.put("pods", pod(`p${i}`, `10.1.0.${i}`));
    let compacted = false;
    server.beforeRequest = (r) => {
      // A write, and a compaction past the first page's snapshot, before its token is used.
      if (r.query.continue !== undefined && !compacted) {
        compacted = true;
        server.put("pods", pod("p6", "10.1.0.6"));
        server.compact();
      }
    };
    const kube = new Kube(accessTo(server), "n1", { ...FAST, pageSize: 4 });
    try {
      assert(await kube.pods.waitSynced(10_000));
      assertEquals(kube.pods.size, 7);
      // The list's own version is gone: the next asks the latest (resourceVersion "").
      assertEquals(listsOf(server), [
        [200, "0", "4", false, "etcd"],
        [410, null, "4", true, null],
        [200, null, "4", false, "etcd"],
        [200, null, "4", true, "etcd"],
      ]);
    } finally {
      await kube.close();
    }
  }, { watchCache: false });
});

Deno.test("when the API server goes down the cache backs off; when it comes back it catches up by watching", async () => {
  await withServer(async (server) => {
    server.put("pods", pod("a", "10.1.0.1"));
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const kube = new Kube(accessTo(server), "n1", { ...FAST, log });
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("the watch", () => server.watchCount("pods") === 1);
      await server.down();
      await until("two failed tries", () => kube.pods.stats().errors >= 2);
      const waits = lines.filter((l) => l.includes("after a backoff")).map((l) =>
        JSON.parse(l).waitMs
      );
      assert(waits.length >= 2 && waits.every((w) => w >= 20 && w <= 200), JSON.stringify(waits));
      server.put("pods", pod("b", "10.1.0.2"));
      server.up();
      await until("b", () => kube.pods.get("default/b") !== undefined);
      // Nothing was compacted: the cache watched again from where it was, no relist.
      const s = kube.pods.stats();
      assertEquals([s.relists, s.lists], [0, 1]);
      assert(s.watchRestarts >= 1);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a connection cut mid-stream is watched again from the last resourceVersion", async () => {
  await withServer(async (server) => {
    server.put("pods", pod("a", "10.1.0.1"));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("the watch", () => server.watchCount("pods") === 1);
      const rv = kube.pods.stats().resourceVersion;
      await server.cut();
      server.put("pods", pod("b", "10.1.0.2"));
      await until("b", () => kube.pods.get("default/b") !== undefined);
      const watches = server.requests.filter((r) => r.watch);
      assertEquals(watches.at(-1)?.query.resourceVersion, rv);
      assertEquals(kube.pods.stats().relists, 0);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a malformed event is logged and skipped, and the cache goes on", async () => {
  await withServer(async (server) => {
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const kube = new Kube(accessTo(server), "n1", { ...FAST, log });
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("the watch", () => server.watchCount("pods") === 1);
      const bad = pod("bad", "10.1.0.3");
      bad.spec.containers[0].ports[0].containerPort = "eighty";
      server.inject("pods", "this is not JSON");
      server.inject("pods", JSON.stringify({ type: "RENAMED", object: {} }));
      server.inject(
        "pods",
        JSON.stringify({ type: "ADDED", object: { metadata: { namespace: "x" } } }),
      );
      server.put("pods", bad);
      server.inject("pods", JSON.stringify({ type: "BOOKMARK", object: { metadata: {} } }));
      server.put("pods", pod("good", "10.1.0.4"));
      await until("good", () => kube.pods.get("default/good") !== undefined);
      assertEquals(kube.pods.stats().malformed, 5);
      assertEquals(kube.pods.get("default/bad"), undefined);
      const warned = lines.map((l) => JSON.parse(l)).filter((l) => l.msg.startsWith("Skipped"));
      assertEquals(warned.map((l) => l.what), [
        "watch line",
        "watch event",
        "ADDED event",
        "ADDED event",
        "bookmark",
      ]);
      assertMatch(warned[3].why, /containerPort/);
      assertEquals(kube.pods.stats().errors, 0);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a malformed list item is skipped and the rest is cached", async () => {
  await withServer(async (server) => {
    const bad = pod("bad", "10.1.0.3");
    bad.metadata.labels = { app: 7 };
    server.put("pods", bad);
    server.put("pods", pod("good", "10.1.0.4"));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.pods.waitSynced(10_000));
      assertEquals([...kube.pods.values()].map((p) => p.metadata.name), ["good"]);
      assertEquals(kube.pods.stats().malformed, 1);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a NetworkPolicy the agent cannot read is cached, marked unreadable, never skipped (list and watch)", async () => {
  await withServer(async (server) => {
    const future = (name: string) => {
      const p = makeNetworkPolicy("default", name);
      p.spec.ingress[0].ports[0].protocol = "FOO";
      return p;
    };
    server.put("networkpolicies", future("listed"));
    server.put("networkpolicies", makeNetworkPolicy("default", "fine"));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assert(await kube.networkPolicies.waitSynced(10_000));
      await until("the watch", () => server.watchCount("networkpolicies") === 1);
      server.put("networkpolicies", future("watched"));
      await until("watched", () => kube.networkPolicies.get("default/watched") !== undefined);
      for (const name of ["listed", "watched"]) {
        const p = kube.networkPolicies.get(`default/${name}`)!;
        assertMatch(p.unreadable?.reason ?? "", /^spec\.ingress\.0\.ports\.0\.protocol: .*"FOO"/);
        assertEquals(p.spec, {
          podSelector: { matchLabels: { app: name } },
          policyTypes: ["Ingress"],
        });
      }
      assertEquals(kube.networkPolicies.get("default/fine")?.unreadable, undefined);
      assertEquals(kube.networkPolicies.stats().malformed, 0);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a handler that throws is logged and the other handlers still hear the change", async () => {
  await withServer(async (server) => {
    const lines: string[] = [];
    const kube = new Kube(accessTo(server), "n1", {
      ...FAST,
      log: new Logger((l) => lines.push(l)),
    });
    try {
      assert(await kube.pods.waitSynced(10_000));
      const rec = recorder();
      kube.pods.subscribe(() => {
        throw new Error("boom");
      });
      kube.pods.subscribe(rec.handler);
      server.put("pods", pod("a", "10.1.0.1"));
      await until("a", () => rec.events.length === 1);
      assert(lines.some((l) => l.includes("handler failed") && l.includes("boom")));
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a rotated token file is read again after a 401 and the new token is used", async () => {
  await withServer(async (server) => {
    const tokenFile = `${server.pki.dir}/token`;
    await Deno.writeTextFile(tokenFile, "first\n");
    server.tokens = new Set(["first"]);
    const kube = new Kube(accessTo(server, { file: tokenFile }), "n1", {
      ...FAST,
      tokenMaxAgeMs: 3_600_000,
    });
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("the watch", () => server.watchCount("pods") === 1);
      await Deno.writeTextFile(tokenFile, "second\n");
      server.tokens = new Set(["second"]);
      await server.cut();
      server.put("pods", pod("a", "10.1.0.1"));
      await until("a", () => kube.pods.get("default/a") !== undefined);
      const after = server.requests.filter((r) => r.token === "second");
      assert(after.length >= 1, "the new token was sent");
      assert(server.requests.some((r) => r.status === 401 && r.token === "first"));
      // The 401 is cured inside the request: only the cut may count as a failure.
      assert(kube.pods.stats().errors <= 1, JSON.stringify(kube.pods.stats()));
    } finally {
      await kube.close();
    }
  });
});

Deno.test("the token file is read again once its copy is old, before any 401", async () => {
  await withServer(async (server) => {
    const tokenFile = `${server.pki.dir}/token`;
    await Deno.writeTextFile(tokenFile, "first");
    server.tokens = new Set(["first", "second"]);
    const kube = new Kube(accessTo(server, { file: tokenFile }), "n1", {
      ...FAST,
      tokenMaxAgeMs: 0,
    });
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("the watch", () => server.watchCount("pods") === 1);
      await Deno.writeTextFile(tokenFile, "second");
      server.endWatches();
      await until(
        "a request with the new token",
        () => server.requests.some((r) => r.token === "second"),
      );
      assert(!server.requests.some((r) => r.status === 401));
    } finally {
      await kube.close();
    }
  });
});

Deno.test("getPod() fetches one pod, null when it does not exist, and gives up after its timeout", async () => {
  await withServer(async (server) => {
    server.put(
      "pods",
      makePod({ namespace: "ns 1", name: "web-0", ip: "10.1.0.1", ipv6: "fd00::1" }),
    );
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      const p = await kube.getPod("ns 1", "web-0");
      assertEquals(p?.ips, ["10.1.0.1", "fd00::1"]);
      assertEquals(await kube.getPod("ns 1", "web-1"), null);
      assertEquals(kube.stats(), [], "a GET starts no cache");
      server.stall(true);
      const err = await assertRejects(
        () => kube.getPod("ns 1", "web-0", { timeoutMs: 100 }),
        KubeRequestError,
      );
      assertMatch(err.message, /no answer in 100 ms/);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a wrong token is never synced and says 401 Unauthorized", async () => {
  await withServer(async (server) => {
    const kube = new Kube(accessTo(server, { value: "wrong" }), "n1", FAST);
    try {
      assertEquals(await kube.pods.waitSynced(300), false);
      await until("an error", () => kube.pods.stats().lastError !== null);
      assertMatch(kube.pods.stats().lastError!, /401 Unauthorized/);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a server whose certificate another CA signed is refused", async () => {
  await withServer(async (server, pki) => {
    const kube = new Kube({ ...accessTo(server), caCerts: [pki.otherCaCert] }, "n1", FAST);
    try {
      assertEquals(await kube.pods.waitSynced(300), false);
      await until("an error", () => kube.pods.stats().lastError !== null);
      assertMatch(kube.pods.stats().lastError!, /certificate|UnknownIssuer/i);
      assertEquals(server.requests.length, 0);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("close() while the server is down or stalled ends everything", async () => {
  await withServer(async (server) => {
    const kube = new Kube(accessTo(server), "n1", FAST);
    assert(await kube.pods.waitSynced(10_000));
    await server.down();
    await until("an error", () => kube.pods.stats().errors >= 1);
    server.up();
    server.stall(true);
    const waiting = kube.namespaces.waitSynced(60_000);
    await until(
      "the namespaces list asked",
      () => server.requests.some((r) => r.path === "/api/v1/namespaces"),
    );
    await kube.close();
    assertEquals(await waiting, false);
  });
});

Deno.test("a kubeconfig in YAML with a CA file and a token file reaches the server", async () => {
  await withServer(async (server, pki) => {
    await Deno.writeTextFile(`${pki.dir}/token`, "test-token\n");
    const kubeconfig = `${pki.dir}/kubeconfig`;
    await Deno.writeTextFile(
      kubeconfig,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "- name: test",
        "  cluster:",
        `    server: ${server.url}`,
        "    certificate-authority: ca.crt",
        "users:",
        "- name: agent",
        "  user:",
        "    tokenFile: token",
        "contexts:",
        "- name: test",
        "  context: {cluster: test, user: agent}",
        "current-context: test",
        "",
      ].join("\n"),
    );
    const kube = await Kube.connect({ ...FAST, kubeconfig, env: { NODE_NAME: "node-7" } });
    try {
      assertEquals(kube.nodeName, "node-7");
      server.put("pods", pod("a", "10.1.0.1"));
      assert(await kube.pods.waitSynced(10_000));
      assertEquals(kube.pods.size, 1);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a client certificate is presented to a server that requires one", async () => {
  const pki = await makeTestPki();
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  // openssl's s_server (not Deno's, which cannot ask for client certificates) serves files
  // from its folder and refuses a handshake without a certificate signed by the CA.
  await Deno.mkdir(`${pki.dir}/api/v1/namespaces/default/pods`, { recursive: true });
  await Deno.writeTextFile(
    `${pki.dir}/api/v1/namespaces/default/pods/web`,
    JSON.stringify(makePod({ namespace: "default", name: "web", ip: "10.2.0.1" })),
  );
  const child = new Deno.Command("/usr/bin/openssl", {
    args: [
      "s_server",
      "-accept",
      `127.0.0.1:${port}`,
      "-cert",
      "server.crt",
      "-key",
      "server.key",
      "-CAfile",
      "ca.crt",
      "-Verify",
      "1",
      "-WWW",
      "-quiet",
    ],
    cwd: pki.dir,
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  const server = `https://127.0.0.1:${port}`;
  const withCert: KubeAccess = {
    server,
    caCerts: [pki.caCert],
    clientCert: { cert: pki.clientCert, key: pki.clientKey },
    source: "test",
  };
  const withoutCert: KubeAccess = { server, caCerts: [pki.caCert], source: "test" };
  const a = new Kube(withCert, "n1");
  const b = new Kube(withoutCert, "n1");
  try {
    const got = await poll(async () => {
      try {
        return await a.getPod("default", "web", { timeoutMs: 2000 });
      } catch (err) {
        if (String(err).includes("Connection refused")) return null; // not listening yet
        throw err;
      }
    }, { timeoutMs: 10_000, intervalMs: 50 });
    assertEquals(got?.ips, ["10.2.0.1"]);
    await assertRejects(() => b.getPod("default", "web", { timeoutMs: 2000 }), KubeRequestError);
  } finally {
    await a.close();
    await b.close();
    child.kill("SIGTERM");
    await child.status;
    await Deno.remove(pki.dir, { recursive: true });
  }
});

Deno.test("a server the permission set does not allow is refused at connect, and stops a cache", async () => {
  await withServer(async (server, pki) => {
    // A process allowed to reach 127.0.0.2 only, as a set narrowed by an operator might.
    const code = `
      import { checkNetPermission, Kube } from ${
      JSON.stringify(new URL("../kube/mod.ts", import.meta.url).href)
    };
      const out = {};
      try { await checkNetPermission("https://10.96.0.1", "in-cluster"); } catch (e) { out.refused = e.message; }
      const kube = new Kube({ server: ${
      JSON.stringify(server.url)
    }, caCerts: [Deno.args[0]], token: { value: "test-token" }, source: "t" }, "n1");
      out.synced = await kube.pods.waitSynced(5000);
      out.stopped = kube.pods.stats().stopped;
      out.lastError = kube.pods.stats().lastError;
      await kube.close();
      console.log(JSON.stringify(out));
    `;
    const file = `${pki.dir}/probe.ts`;
    await Deno.writeTextFile(file, code);
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--quiet",
        "--no-prompt",
        "--config",
        new URL("./deno.json", import.meta.url).pathname,
        `--allow-read`,
        "--allow-net=127.0.0.2",
        file,
        pki.caCert,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assert(out.success, new TextDecoder().decode(out.stderr));
    const got = JSON.parse(text);
    assertEquals(
      got.refused,
      'enim\'s permission set does not allow connecting to the Kubernetes API server "10.96.0.1:443" ' +
        "(from in-cluster): the shipped set (permissions.enim in deno.json) allows every address; " +
        'a set narrowed since must list "10.96.0.1:443" in its net permission, and enim be built again',
    );
    assertEquals([got.synced, got.stopped], [false, true]);
    assertMatch(got.lastError, /Requires net access to "127\.0\.0\.1:\d+"/);
    assertEquals(server.requests.length, 0);
  });
});

Deno.test("a watch that hears nothing for two bookmark periods (a blackholed connection) is dropped and watched again on a new connection; what came meanwhile arrives", async () => {
  await withServer(async (server) => {
    server.put("pods", pod("a", "10.1.0.1"));
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const kube = new Kube(accessTo(server), "n1", { ...FAST, watchBookmarkSeconds: 0.3, log });
    try {
      assert(await kube.pods.waitSynced(10_000));
      assert(await kube.namespaces.waitSynced(10_000));
      await until(
        "a bookmark on each watch",
        () => kube.pods.stats().bookmarks >= 1 && kube.namespaces.stats().bookmarks >= 1,
      );
      assertEquals(kube.pods.stats().bookmarkSupport, "seen");
      const watchesBefore = server.count("pods", "watch");
      // Both watches share one HTTP/2 connection: it goes silent, no FIN, no RST.
      assert(server.blackhole() >= 1, "a connection to blackhole");
      const rv = kube.pods.stats().resourceVersion;
      const b = server.put("pods", pod("b", "10.1.0.2"));
      server.put("namespaces", makeNamespace("late"));
      await until("b, through a new watch", () => kube.pods.get("default/b") !== undefined);
      await until("the late namespace", () => kube.namespaces.get("late") !== undefined);
      const s = kube.pods.stats();
      // The cache that noticed first dropped the shared connection; the other's watch broke
      // with it, or noticed too.
      const silent = s.silentWatches + kube.namespaces.stats().silentWatches;
      assert(silent >= 1, JSON.stringify([s, kube.namespaces.stats()]));
      assertEquals(s.relists, 0, "watched again from where it was, not listed");
      assertEquals(
        s.resourceVersion !== null &&
          Number(s.resourceVersion) >= Number(b.metadata.resourceVersion),
        true,
      );
      const next = server.requests.filter((r) =>
        r.watch && r.path === "/api/v1/pods"
      )[watchesBefore];
      assertEquals(next.query.resourceVersion, rv);
      const dropped = lines.map((l) => JSON.parse(l)).filter((l) =>
        l.msg.startsWith("Dropping the connection")
      );
      // Whichever cache noticed first dropped the connection; the other found it dropped.
      assertEquals(dropped.length, 1, JSON.stringify(dropped));
      assertMatch(
        dropped[0].why,
        /heard nothing, not even a bookmark, for 600 ms \(two bookmark periods\)/,
      );
    } finally {
      await kube.close();
    }
  }, { bookmarkEveryMs: 100 });
});

Deno.test("a server that sends no bookmarks: one silent watch is watched again, a second keeps its watch to its timeout, and a bookmark later brings the short limit back", async () => {
  await withServer(async (server) => {
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const kube = new Kube(accessTo(server), "n1", { ...FAST, watchBookmarkSeconds: 0.1, log });
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("no bookmarks, found", () => kube.pods.stats().bookmarkSupport === "none");
      const s = kube.pods.stats();
      // The first silent watch was taken for dead (it might have been); the second told.
      assertEquals([s.silentWatches, s.watches], [1, 2], JSON.stringify(s));
      assert(
        lines.some((l) => l.includes("sends no watch bookmarks")),
        "the agent says it cannot notice a dead watch quickly",
      );
      // The second watch goes on, silent past the two periods.
      await new Promise((ok) => setTimeout(ok, 500));
      assertEquals(kube.pods.stats().watches, 2);
      assertEquals(server.watchCount("pods"), 1);
      server.put("pods", pod("a", "10.1.0.1"));
      await until("a", () => kube.pods.get("default/a") !== undefined);
      server.bookmark();
      await until("a bookmark", () => kube.pods.stats().bookmarkSupport === "seen");
      // Back to two periods: the next silence is a dead watch again.
      await until("a silent watch", () => kube.pods.stats().silentWatches >= 2);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a server that sends no bookmarks is found out by events that keep coming for two periods without one", async () => {
  await withServer(async (server) => {
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const kube = new Kube(accessTo(server), "n1", { ...FAST, watchBookmarkSeconds: 0.5, log });
    try {
      assert(await kube.pods.waitSynced(10_000));
      for (let i = 0; kube.pods.stats().bookmarkSupport === "unknown" && i < 500; i++) {
        server.put("pods", pod(`p${i}`, `10.1.${i >> 8}.${i & 255}`));
        await new Promise((ok) => setTimeout(ok, 20));
      }
      assertEquals(kube.pods.stats().bookmarkSupport, "none");
      const told = lines.map((l) => JSON.parse(l)).filter((l) =>
        l.msg.includes("sends no watch bookmarks")
      );
      assertEquals(told.map((l) => l.why), ["events came for two bookmark periods without one"]);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a GET that gets no answer in time drops the connection: the next opens a new one", async () => {
  await withServer(async (server) => {
    server.put("pods", makePod({ namespace: "default", name: "web", ip: "10.1.0.1" }));
    const kube = new Kube(accessTo(server), "n1", FAST);
    try {
      assertEquals((await kube.getPod("default", "web"))?.ips, ["10.1.0.1"]);
      assert(server.blackhole() >= 1);
      await assertRejects(
        () => kube.getPod("default", "web", { timeoutMs: 300 }),
        KubeRequestError,
        "no answer in 300 ms",
      );
      assertEquals((await kube.getPod("default", "web", { timeoutMs: 5_000 }))?.ips, ["10.1.0.1"]);
    } finally {
      await kube.close();
    }
  });
});

Deno.test("a watch that ends at once with no event is tried again after a backoff that grows, not in a loop", async () => {
  await withServer(async (server) => {
    server.put("pods", pod("a", "10.1.0.1"));
    const lines: string[] = [];
    const log = new Logger((l) => lines.push(l), "debug");
    const at: number[] = [];
    server.beforeRequest = (r) => {
      if (r.watch) at.push(performance.now());
    };
    const kube = new Kube(accessTo(server), "n1", {
      ...FAST,
      backoff: { initialMs: 20, maxMs: 5_000, random: () => 0 },
      log,
    });
    try {
      assert(await kube.pods.waitSynced(10_000));
      await until("six watches", () => at.length >= 6, 20_000);
      const gaps = at.slice(1, 6).map((t, i) => t - at[i]);
      const waits = lines.map((l) => JSON.parse(l)).filter((l) => l.msg.includes("after a backoff"))
        .map((l) => l.waitMs);
      assertEquals(waits.slice(0, 5), [20, 40, 80, 160, 320]);
      // Each watch came no sooner than the wait before it: the gaps grow with the waits.
      gaps.forEach((g, i) => assert(g >= waits[i] - 1, `gap ${i}: ${gaps} after waits ${waits}`));
      const s = kube.pods.stats();
      assert(s.shortWatches >= 5 && s.errors === s.shortWatches, JSON.stringify(s));
      assertMatch(s.lastError ?? "", /ended within a second with no event/);
      assertEquals(s.lists, 1);
    } finally {
      await kube.close();
    }
  }, { maxWatchSeconds: 0 });
});
