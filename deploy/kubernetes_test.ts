import { parseAllDocuments } from "yaml";
import { parse as parseJsonc, type ParseError } from "jsonc-parser";
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";

// deno-lint-ignore no-explicit-any
type Obj = any;

/** Parses every document of a YAML file (failing on any YAML error or warning). */
async function load(rel: string): Promise<Obj[]> {
  const docs = parseAllDocuments(await Deno.readTextFile(`${ROOT}/${rel}`));
  if (!Array.isArray(docs)) throw new Error(`Expected YAML documents in "${rel}"`);
  for (const d of docs) {
    assertEquals([...d.errors, ...d.warnings].map((e) => e.message), [], rel);
  }
  return docs.map((d) => d.toJS());
}

function jsonc(text: string, what: string): Obj {
  const errors: ParseError[] = [];
  const value = parseJsonc(text, errors, { allowTrailingComma: true });
  assertEquals(errors, [], `${what} is valid JSONC`);
  return value;
}

const [ds] = await load("deploy/kubernetes/daemonset.yaml");
const configMaps = await load("deploy/kubernetes/configmap.yaml");
const cm = (name: string) =>
  configMaps.find((d) => d.kind === "ConfigMap" && d.metadata.name === name);
const pod = ds.spec.template.spec;
const agent = pod.containers.find((c: Obj) => c.name === "agent");
const init = pod.initContainers.find((c: Obj) => c.name === "install-cni");
const volume = (name: string) => pod.volumes.find((v: Obj) => v.name === name);
/** The host path behind a container's mount at `mountPath`, with the mount itself. */
function hostMount(c: Obj, mountPath: string): { mount: Obj; hostPath?: string } {
  const mount = c.volumeMounts.find((m: Obj) => m.mountPath === mountPath);
  assert(mount, `${c.name} mounts ${mountPath}`);
  return { mount, hostPath: volume(mount.name)?.hostPath?.path };
}

Deno.test("the DaemonSet runs the agent in the node's network namespace on every node", () => {
  assertEquals(ds.apiVersion, "apps/v1");
  assertEquals(ds.kind, "DaemonSet");
  assertEquals(ds.spec.selector.matchLabels, ds.spec.template.metadata.labels);
  assertEquals(pod.hostNetwork, true);
  assertEquals(pod.priorityClassName, "system-node-critical");
  assert(pod.tolerations.some((t: Obj) => t.operator === "Exists" && t.key === undefined));
  assertEquals(agent.command.slice(1), ["agent", "--config", "/etc/enim/agent.jsonc"]);
  // The environment the tests and the bench run the agent with (tests/support/agent_proc.ts),
  // and the node's name for the Kubernetes client (kubernetes.nodeName's default).
  assertEquals(agent.env, [
    { name: "MALLOC_ARENA_MAX", value: "2" },
    { name: "NODE_NAME", valueFrom: { fieldRef: { fieldPath: "spec.nodeName" } } },
  ]);
});

Deno.test("the agent runs as a service account that may read pods, namespaces and NetworkPolicies, and nothing else", async () => {
  const docs = await load("deploy/kubernetes/rbac.yaml");
  assertEquals(docs.map((d) => `${d.apiVersion} ${d.kind}`), [
    "v1 ServiceAccount",
    "rbac.authorization.k8s.io/v1 ClusterRole",
    "rbac.authorization.k8s.io/v1 ClusterRoleBinding",
  ]);
  const [sa, role, binding] = docs;
  assertEquals(pod.serviceAccountName, sa.metadata.name);
  assertEquals(sa.metadata.namespace, ds.metadata.namespace);
  assertEquals(pod.automountServiceAccountToken, true);
  assertEquals(role.rules, [
    { apiGroups: [""], resources: ["pods"], verbs: ["get", "list", "watch"] },
    { apiGroups: [""], resources: ["namespaces"], verbs: ["list", "watch"] },
    { apiGroups: ["networking.k8s.io"], resources: ["networkpolicies"], verbs: ["list", "watch"] },
  ]);
  assertEquals(binding.roleRef, {
    apiGroup: "rbac.authorization.k8s.io",
    kind: "ClusterRole",
    name: role.metadata.name,
  });
  assertEquals(binding.subjects, [{
    kind: "ServiceAccount",
    name: sa.metadata.name,
    namespace: sa.metadata.namespace,
  }]);
});

Deno.test("the agent can manage devices and namespaces: privileged or NET_ADMIN and SYS_ADMIN", () => {
  const sc = agent.securityContext;
  const caps: string[] = sc.capabilities?.add ?? [];
  assert(sc.privileged === true || (caps.includes("NET_ADMIN") && caps.includes("SYS_ADMIN")));
  assert(caps.includes("NET_ADMIN") && caps.includes("SYS_ADMIN"), "documented capabilities");
});

Deno.test("the agent mounts the host's netns directories with bidirectional propagation", async (t) => {
  for (const path of ["/run/netns", "/var/run/netns"]) {
    await t.step(path, () => {
      const { mount, hostPath } = hostMount(agent, path);
      assertEquals(hostPath, path);
      assertEquals(mount.mountPropagation, "Bidirectional");
    });
  }
  // Kubernetes allows Bidirectional only in privileged containers.
  assertEquals(agent.securityContext.privileged, true);
});

Deno.test("the agent keeps state, socket and logs on the host", async (t) => {
  for (const path of ["/var/lib/enim", "/run/enim", "/var/log/enim"]) {
    await t.step(path, () => assertEquals(hostMount(agent, path).hostPath, path));
  }
  const { mount } = hostMount(agent, "/etc/enim");
  assertEquals(volume(mount.name).configMap.name, "enim-agent-config");
});

Deno.test("the init container installs the plugin and the conflist onto the host", () => {
  assertEquals(init.image, agent.image);
  const bin = hostMount(init, "/host/opt/cni/bin");
  const netd = hostMount(init, "/host/etc/cni/net.d");
  assertEquals(bin.hostPath, "/opt/cni/bin");
  assertEquals(netd.hostPath, "/etc/cni/net.d");
  const cfg = init.volumeMounts.find((m: Obj) => m.mountPath === "/config/cni");
  assertEquals(volume(cfg.name).configMap.name, "enim-cni-config");
  const script = init.command.join(" ");
  for (
    const s of [
      "/host/opt/cni/bin/enim",
      "/config/cni/10-enim.conflist",
      "/host/etc/cni/net.d/10-enim.conflist",
    ]
  ) {
    assert(script.includes(s), `the init script mentions ${s}`);
  }
});

Deno.test("readiness is the agent's status", () => {
  assertEquals(agent.readinessProbe.exec.command.slice(1), ["status", "--json"]);
  assertEquals(agent.readinessProbe.exec.command[0], agent.command[0]);
});

Deno.test("the images are the documented placeholder", () => {
  for (const c of [...pod.initContainers, ...pod.containers]) {
    assertEquals(c.image, "ghcr.io/example/enim:0.1.0");
  }
});

Deno.test("the CNI ConfigMap holds a valid conflist of type enim, the same as deploy/'s", async () => {
  const data = cm("enim-cni-config").data;
  const conflist = JSON.parse(data["10-enim.conflist"]);
  assertEquals(conflist.plugins[0].type, "enim");
  // libcni < 1.2 (containerd 1.6/1.7) uses cniVersion; libcni >= 1.2 the newest of cniVersions
  // it knows (containerd 2.x: 1.1.0). See deploy/README.md, "Runtimes".
  assertEquals(conflist.cniVersion, "1.0.0");
  assertEquals(conflist.cniVersions, ["1.0.0", "1.1.0"]);
  // containerd passes the pod's annotations in runtimeConfig only when this is declared.
  assertEquals(conflist.plugins[0].capabilities, {
    "io.kubernetes.cri.pod-annotations": true,
    bandwidth: true,
  });
  assertEquals(
    conflist,
    JSON.parse(await Deno.readTextFile(`${ROOT}/deploy/10-enim.conflist`)),
  );
});

Deno.test("the agent ConfigMap and deploy/agent.jsonc are valid agent configs", async () => {
  const inCm = jsonc(cm("enim-agent-config").data["agent.jsonc"], "the agent ConfigMap");
  const file = jsonc(await Deno.readTextFile(`${ROOT}/deploy/agent.jsonc`), "deploy/agent.jsonc");
  for (const c of [inCm, file]) {
    assertEquals(c.socket, "/run/enim/enim.sock");
    assertEquals(c.statePath, "/var/lib/enim/enim.db");
    assert(["mock", "bce"].includes(c.provider.name));
  }
  const volumeMode = pod.volumes.find((v: Obj) => v.configMap?.name === "enim-agent-config")
    .configMap.defaultMode;
  assertEquals(volumeMode, 0o600);
});

Deno.test("the DaemonSet's agent serves the device plugin in kubelet's folder", () => {
  const inCm = jsonc(cm("enim-agent-config").data["agent.jsonc"], "the agent ConfigMap");
  assertEquals(inCm.devicePlugin.enabled, true);
  const dir = inCm.devicePlugin.dir ?? "/var/lib/kubelet/device-plugins";
  assertEquals(hostMount(agent, dir).hostPath, "/var/lib/kubelet/device-plugins");
  // kubelet's pod-resources socket, beside the folder: which pods hold a device.
  assertEquals(
    hostMount(agent, "/var/lib/kubelet/pod-resources").hostPath,
    "/var/lib/kubelet/pod-resources",
  );
});

Deno.test("the admission policies that add enim.dev/eni to pods parse, with the expected kinds", async (t) => {
  await t.step("MutatingAdmissionPolicy and its binding", async () => {
    const docs = await load("deploy/kubernetes/eni-request-policy.yaml");
    assertEquals(docs.map((d) => `${d.apiVersion} ${d.kind}`), [
      "admissionregistration.k8s.io/v1 MutatingAdmissionPolicy",
      "admissionregistration.k8s.io/v1 MutatingAdmissionPolicyBinding",
    ]);
    const [policy, binding] = docs;
    assertEquals(binding.spec.policyName, policy.metadata.name);
    assertEquals(policy.spec.matchConstraints.resourceRules[0].resources, ["pods"]);
    assertEquals(policy.spec.matchConstraints.resourceRules[0].operations, ["CREATE"]);
    const conditions = policy.spec.matchConditions.map((c: Obj) => c.expression).join("\n");
    assert(conditions.includes("object.spec.hostNetwork"), "hostNetwork pods are left alone");
    const [mutation] = policy.spec.mutations;
    assertEquals(mutation.patchType, "ApplyConfiguration");
    assert(mutation.applyConfiguration.expression.includes('"enim.dev/eni": "1"'));
    assertEquals(binding.spec.matchResources.namespaceSelector.matchLabels, {
      "enim.dev/eni-pods": "true",
    });
  });
  await t.step(
    "the raw-capabilities ValidatingAdmissionPolicy and its binding (issue 48)",
    async () => {
      const docs = await load("deploy/kubernetes/raw-capabilities-policy.yaml");
      assertEquals(docs.map((d) => `${d.apiVersion} ${d.kind}`), [
        "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy",
        "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding",
      ]);
      const [policy, binding] = docs;
      assertEquals(binding.spec.policyName, policy.metadata.name);
      assertEquals(binding.spec.validationActions, ["Deny"]);
      assertEquals(policy.spec.matchConstraints.resourceRules[0].resources, [
        "pods",
        "pods/ephemeralcontainers",
      ]);
      const conditions = policy.spec.matchConditions.map((c: Obj) => c.expression).join("\n");
      assert(conditions.includes("object.spec.hostNetwork"), "hostNetwork pods are left alone");
      assert(conditions.includes("'enim.dev/raw-sockets'"), "a pod can opt out");
      const vars = policy.spec.variables.map((v: Obj) => v.expression).join("\n");
      for (const kind of ["containers", "initContainers", "ephemeralContainers"]) {
        assert(vars.includes(`object.spec.${kind}`), `${kind} are judged`);
      }
      assert(vars.includes("'NET_ADMIN'") && vars.includes("'NET_RAW'"), vars);
      assertEquals(binding.spec.matchResources.namespaceSelector, {
        matchLabels: { "enim.dev/eni-pods": "true" },
        matchExpressions: [{ key: "enim.dev/raw-sockets", operator: "NotIn", values: ["allow"] }],
      });
    },
  );
  await t.step("the Kyverno alternative", async () => {
    const docs = await load("deploy/kubernetes/eni-request-kyverno.yaml");
    assertEquals(docs.map((d) => `${d.apiVersion} ${d.kind}`), ["kyverno.io/v1 ClusterPolicy"]);
    const [rule] = docs[0].spec.rules;
    assertEquals(rule.match.any[0].resources.kinds, ["Pod"]);
    assertEquals(rule.match.any[0].resources.namespaceSelector.matchLabels, {
      "enim.dev/eni-pods": "true",
    });
    assertEquals(
      rule.mutate.patchStrategicMerge.spec.containers[0].resources.limits["enim.dev/eni"],
      "1",
    );
  });
});
