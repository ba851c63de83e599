import { assertEquals, assertThrows } from "../../lib/assert.ts";
import { answer, buildQuery, parseDnsMessage, TYPE_A, TYPE_AAAA } from "./dns.ts";
import { MANIFEST_DIR, readKustomization, strategicMerge } from "./k8s/manifests.ts";

Deno.test("dns: a query parsed, answered from the table (A, no data, NXDOMAIN), the answer parsed", () => {
  const table = { "bcc.bj.baidubce.com": "127.0.0.1" };
  const q = parseDnsMessage(buildQuery(0x1234, "BCC.bj.baidubce.com"));
  assertEquals([q.id, q.qr, q.name, q.qtype, q.rcode], [
    0x1234,
    false,
    "bcc.bj.baidubce.com",
    1,
    0,
  ]);
  const a = parseDnsMessage(answer(q, table));
  assertEquals([a.id, a.qr, a.rcode, a.addresses], [0x1234, true, 0, ["127.0.0.1"]]);
  const aaaa = parseDnsMessage(answer(parseDnsMessage(buildQuery(7, q.name, TYPE_AAAA)), table));
  assertEquals([aaaa.rcode, aaaa.ancount, aaaa.addresses], [0, 0, []]);
  const nx = parseDnsMessage(
    answer(parseDnsMessage(buildQuery(8, "other.example", TYPE_A)), table),
  );
  assertEquals([nx.rcode, nx.addresses], [3, []]);
});

Deno.test("dns: a short or malformed message is refused", () => {
  assertThrows(() => parseDnsMessage(new Uint8Array(5)));
  const q = buildQuery(1, "a.example");
  assertThrows(() => parseDnsMessage(q.subarray(0, q.length - 3)));
  const two = q.slice();
  two[5] = 2; // qdcount 2
  assertThrows(() => parseDnsMessage(two));
});

Deno.test("strategicMerge: containers, volumes by name, volumeMounts by mountPath, maps deep, other lists replaced", () => {
  const base = {
    spec: {
      containers: [{ name: "a", volumeMounts: [{ name: "x", mountPath: "/x" }], args: ["1"] }],
      volumes: [{ name: "x", emptyDir: {} }],
    },
  };
  const patch = {
    spec: {
      containers: [{ name: "a", volumeMounts: [{ name: "y", mountPath: "/y" }], args: ["2"] }],
      volumes: [{ name: "y", secret: { secretName: "s" } }],
    },
  };
  assertEquals(strategicMerge(base, patch), {
    spec: {
      containers: [{
        name: "a",
        volumeMounts: [{ name: "x", mountPath: "/x" }, { name: "y", mountPath: "/y" }],
        args: ["2"],
      }],
      volumes: [{ name: "x", emptyDir: {} }, { name: "y", secret: { secretName: "s" } }],
    },
  });
});

Deno.test("readKustomization: the BCE overlay as kubectl apply -k renders it", async () => {
  const docs = await readKustomization(`${MANIFEST_DIR}/bce`);
  const ds = JSON.parse(docs.find((d) => d.kind === "DaemonSet")!.text);
  const agent = ds.spec.template.spec.containers.find((c: { name: string }) => c.name === "agent");
  const paths = agent.volumeMounts.map((m: { mountPath: string }) => m.mountPath);
  assertEquals(paths.filter((p: string) => p.startsWith("/etc/enim")), [
    "/etc/enim",
    "/etc/enim-bce",
  ]);
  const cm = JSON.parse(docs.find((d) => d.name === "enim-agent-config")!.text);
  assertEquals(cm.data["agent.jsonc"].includes('"name": "bce"'), true);
  assertEquals(docs.filter((d) => d.kind === "Secret").map((d) => d.name), [
    "enim-bce-credentials",
  ]);
});
