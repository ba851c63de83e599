import { parseAllDocuments } from "yaml";
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";
import { readPermissionSet } from "../scripts/_permissions.ts";

// deno-lint-ignore no-explicit-any
type Obj = any;

const docs = parseAllDocuments(
  await Deno.readTextFile(`${ROOT}/deploy/kubernetes/uninstall-job.yaml`),
);
assert(Array.isArray(docs));
for (const d of docs) assertEquals([...d.errors, ...d.warnings].map((e) => e.message), []);
const [job]: Obj[] = docs.map((d) => d.toJS());
const [ds]: Obj[] = parseAllDocuments(
  await Deno.readTextFile(`${ROOT}/deploy/kubernetes/daemonset.yaml`),
  // deno-lint-ignore no-explicit-any
).map((d: any) => d.toJS());

Deno.test("the uninstall Job runs enim uninstall on one node, in its network, with one choice of ENIs", () => {
  assertEquals(job.kind, "Job");
  const pod = job.spec.template.spec;
  assertEquals([pod.hostNetwork, pod.restartPolicy, pod.nodeName], [true, "Never", "NODE_NAME"]);
  const [c] = pod.containers;
  assertEquals(c.command.slice(0, 2), ["/usr/local/bin/enim", "uninstall"]);
  const choices = c.command.filter((a: string) => a === "--keep-enis" || a === "--release-enis");
  assertEquals(choices.length, 1);
  assertEquals(c.securityContext.privileged, true);
  assertEquals(c.image.split(":")[0], ds.spec.template.spec.containers[0].image.split(":")[0]);
});

Deno.test("the uninstall Job mounts what uninstall removes at the node's paths, which the permission set allows", () => {
  const pod = job.spec.template.spec;
  const mounts = new Map<string, string>(
    pod.containers[0].volumeMounts.map((m: Obj) => [m.name, m.mountPath]),
  );
  for (const v of pod.volumes.filter((v: Obj) => v.hostPath)) {
    assertEquals(mounts.get(v.name), v.hostPath.path, `${v.name} at the node's own path`);
  }
  const set = readPermissionSet();
  // A path is granted by itself or by a folder above it.
  const grants = (list: string[] | undefined, p: string) =>
    (list ?? []).some((g) => p === g || p.startsWith(`${g}/`));
  for (
    const p of ["/opt/cni/bin/enim", "/opt/cni/bin/enim.d", "/etc/cni/net.d/10-enim.conflist"]
  ) {
    assert(grants(set.write, p), `write ${p}`);
  }
  assert(grants(set.read, "/etc/cni/net.d"));
});
