import { parseAllDocuments } from "yaml";
import { parse as parseJsonc, type ParseError } from "jsonc-parser";
import { assert, assertEquals } from "../lib/assert.ts";
import { ROOT } from "../scripts/_paths.ts";
import { resolveConfig, validateProviderConfig } from "../agent/config.ts";
import { bceModule } from "../providers/bce/mod.ts";
import { DEFAULT_PROBE_SOCKET } from "../api/wire.ts";

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
  assertEquals(agent.command.slice(1, 4), ["agent", "--config", "/etc/enim/agent.jsonc"]);
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
  assertEquals(
    volume(mount.name).projected.sources.map((s: Obj) => s.configMap.name),
    ["enim-agent-config", "enim-cni-config"],
  );
});

Deno.test("the init container installs the plugin onto the host, and not the conflist", () => {
  assertEquals(init.image, agent.image);
  const bin = hostMount(init, "/host/opt/cni/bin");
  assertEquals(bin.hostPath, "/opt/cni/bin");
  const script = init.command.join(" ");
  // The image's installer (scripts/image.ts installScript; run by scripts/image_test.ts).
  assert(
    script.includes("/usr/local/lib/enim/install-cni /host/opt/cni/bin /opt/cni/bin"),
    "the init script installs the plugin",
  );
  // The agent writes the conflist once it answers (issue 50): a runtime without CNI STATUS
  // would send pods to a node whose agent is not up.
  assert(!/conflist|net\.d/.test(script.replace(/#.*$/gm, "")), script);
  assert(!init.volumeMounts.some((m: Obj) => volume(m.name)?.hostPath?.path === "/etc/cni/net.d"));
});

Deno.test("the agent writes the ConfigMap's conflist onto the host's /etc/cni/net.d once it answers", () => {
  const inCm = jsonc(cm("enim-agent-config").data["agent.jsonc"], "the agent ConfigMap");
  const { source, destination } = inCm.cniConfig;
  assertEquals(destination, "/etc/cni/net.d/10-enim.conflist");
  // The source is the enim-cni-config ConfigMap's key, projected beside agent.jsonc.
  const etc = hostMount(agent, "/etc/enim");
  assertEquals(source, `/etc/enim/10-enim.conflist`);
  assert(
    volume(etc.mount.name).projected.sources.some((s: Obj) =>
      s.configMap.name === "enim-cni-config" && s.configMap.items === undefined
    ),
  );
  assert(cm("enim-cni-config").data["10-enim.conflist"]);
  const netd = hostMount(agent, "/etc/cni/net.d");
  assertEquals(netd.hostPath, "/etc/cni/net.d");
  assert(!netd.mount.readOnly);
});

Deno.test("the agent's metrics port: in its config, annotated and scraped by the PodMonitor, not declared (no hostPort)", async () => {
  const inCm = jsonc(cm("enim-agent-config").data["agent.jsonc"], "the agent ConfigMap");
  assertEquals(inCm.metrics, { enabled: true, address: "0.0.0.0", port: 9798 });
  // A declared port of a hostNetwork pod is a hostPort: the surge pod would not fit the node.
  for (const c of [...pod.initContainers, ...pod.containers]) {
    assertEquals(c.ports, undefined, `${c.name} declares no port`);
  }
  const annotations = ds.spec.template.metadata.annotations;
  assertEquals(annotations["prometheus.io/scrape"], "true");
  assertEquals(annotations["prometheus.io/port"], String(inCm.metrics.port));
  assertEquals(annotations["prometheus.io/path"], "/metrics");
  const [monitor] = await load("deploy/kubernetes/podmonitor.yaml");
  assertEquals(`${monitor.apiVersion} ${monitor.kind}`, "monitoring.coreos.com/v1 PodMonitor");
  assertEquals(monitor.spec.selector.matchLabels, ds.spec.template.metadata.labels);
  assertEquals(monitor.spec.namespaceSelector.matchNames, [ds.metadata.namespace]);
  const [endpoint] = monitor.spec.podMetricsEndpoints;
  assertEquals(monitor.spec.podMetricsEndpoints.length, 1);
  assertEquals([endpoint.port, endpoint.path], [undefined, "/metrics"]);
  // The target: the agent container only, at the pod's (the node's) address and the port.
  const relabel = (target: string) =>
    endpoint.relabelings.find((r: Obj) => r.targetLabel === target);
  assert(
    endpoint.relabelings.some((r: Obj) =>
      r.action === "keep" && r.regex === agent.name &&
      r.sourceLabels.join() === "__meta_kubernetes_pod_container_name"
    ),
    "keeps the agent container's target only",
  );
  assertEquals(relabel("__address__").sourceLabels, ["__meta_kubernetes_pod_ip"]);
  assertEquals(relabel("__address__").replacement, `\${1}:${inCm.metrics.port}`);
});

Deno.test("the probes ask this pod's agent on its own socket, in the pod's own folder", () => {
  const flag = agent.command.indexOf("--probe-socket");
  assert(flag > 0, "the agent serves its probe socket");
  const socket = agent.command[flag + 1];
  assertEquals(socket, DEFAULT_PROBE_SOCKET);
  const mount = agent.volumeMounts.find((m: Obj) => socket.startsWith(`${m.mountPath}/`));
  assert(mount, `a mount holds ${socket}`);
  // Not the node's: another pod's agent (a rollout's old one) must not answer there.
  assert(volume(mount.name).emptyDir, "the probe socket's folder is an emptyDir");
  // The permission set lets the agent and enim probe use it.
  const perms = jsonc(Deno.readTextFileSync(`${ROOT}/deno.json`), "deno.json").permissions.enim;
  for (const list of [perms.read, perms.write]) assert(list.includes(mount.mountPath));
  for (const probe of [agent.startupProbe, agent.livenessProbe]) {
    assertEquals(probe.exec.command, [agent.command[0], "probe"]);
  }
  assertEquals(agent.readinessProbe.exec.command, [agent.command[0], "probe", "--ready"]);
  // A wedged agent (the liveness probe failed) is killed sooner than a stopping one.
  assert(
    agent.livenessProbe.terminationGracePeriodSeconds < pod.terminationGracePeriodSeconds,
    "the liveness probe's grace period is shorter than the pod's",
  );
});

Deno.test("a rollout surges: the new pod starts beside the old one, which goes once it is Ready", () => {
  assertEquals(ds.spec.updateStrategy, {
    type: "RollingUpdate",
    rollingUpdate: { maxSurge: 1, maxUnavailable: 0 },
  });
  // The standby waits for the old agent's lock longer than the old pod may take to stop.
  const cfg = resolveConfig({
    file: { path: "configmap.yaml", text: cm("enim-agent-config").data["agent.jsonc"] },
    env: {},
  });
  assert(cfg.lockWaitSeconds > pod.terminationGracePeriodSeconds);
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
  const volumeMode =
    pod.volumes.find((v: Obj) =>
      v.projected?.sources.some((s: Obj) => s.configMap?.name === "enim-agent-config")
    ).projected.defaultMode;
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

Deno.test("the BCE overlay (deploy/kubernetes/bce): provider bce, credentials from a Secret mounted whole at 0400, the file the config names", async () => {
  const dir = "deploy/kubernetes/bce";
  const [k] = await load(`${dir}/kustomization.yaml`);
  assertEquals(k.kind, "Kustomization");
  assertEquals(k.resources, [
    "../rbac.yaml",
    "../configmap.yaml",
    "../daemonset.yaml",
    "credentials-secret.yaml",
  ]);
  assertEquals(k.patches.map((p: Obj) => p.path), ["agent-config.yaml", "agent-credentials.yaml"]);
  // The ConfigMap patch replaces the mock agent config with a BCE one that validates.
  const [cmPatch] = await load(`${dir}/agent-config.yaml`);
  assertEquals([cmPatch.kind, cmPatch.metadata.name], ["ConfigMap", "enim-agent-config"]);
  assert(cm("enim-agent-config"), "it patches a ConfigMap the base ships");
  const text = cmPatch.data["agent.jsonc"];
  const cfg = resolveConfig({ file: { path: `${dir}/agent-config.yaml`, text }, env: {} });
  assertEquals(cfg.provider.name, "bce");
  const bce = validateProviderConfig(cfg, bceModule);
  // The DaemonSet patch, merged as a strategic merge does (containers and volumes by name).
  const [dsPatch] = await load(`${dir}/agent-credentials.yaml`);
  assertEquals([dsPatch.kind, dsPatch.metadata.name], [ds.kind, ds.metadata.name]);
  const patchPod = dsPatch.spec.template.spec;
  const patchAgent = patchPod.containers.find((c: Obj) => c.name === "agent");
  assert(agent, "it patches a container the base ships");
  const mounts = [...agent.volumeMounts, ...patchAgent.volumeMounts];
  const volumes = [...pod.volumes, ...patchPod.volumes];
  assertEquals(new Set(mounts.map((m: Obj) => m.mountPath)).size, mounts.length, "no clash");
  assertEquals(new Set(volumes.map((v: Obj) => v.name)).size, volumes.length, "no clash");
  const mount = patchAgent.volumeMounts.find((m: Obj) =>
    bce.credentialsFile?.startsWith(`${m.mountPath}/`)
  );
  assert(mount, `a mount holds credentialsFile ${bce.credentialsFile}`);
  assertEquals(mount.subPath, undefined, "mounted whole: a subPath mount never sees a rotation");
  assertEquals(mount.readOnly, true);
  const vol = volumes.find((v: Obj) => v.name === mount.name);
  assertEquals(vol.secret.defaultMode, 0o400, "owner-only: the agent refuses anything wider");
  // The Secret holds the file the config names, with both keys.
  const [secret] = await load(`${dir}/credentials-secret.yaml`);
  assertEquals([secret.kind, secret.metadata.name], ["Secret", vol.secret.secretName]);
  const key = bce.credentialsFile!.slice(mount.mountPath.length + 1);
  const creds = JSON.parse(secret.stringData[key]);
  assertEquals(Object.keys(creds).sort(), ["accessKeyId", "secretAccessKey"]);
});

Deno.test("the BCE overlay's credentials file is in a folder the agent's permission set reads", async () => {
  // The agent runs with deno.json's "enim" set: a file outside its read paths is
  // NotCapable, and the agent exits ("Cannot read the BCE credentials file").
  const dir = "deploy/kubernetes/bce";
  const [cmPatch] = await load(`${dir}/agent-config.yaml`);
  const text = cmPatch.data["agent.jsonc"];
  const cfg = resolveConfig({ file: { path: `${dir}/agent-config.yaml`, text }, env: {} });
  const file = validateProviderConfig(cfg, bceModule).credentialsFile;
  assert(file, "the overlay names a credentials file");
  const read: string[] = jsonc(await Deno.readTextFile(`${ROOT}/deno.json`), "deno.json")
    .permissions.enim.read;
  assert(
    read.some((p) => file.startsWith(`${p}/`)),
    `${file} is under one of the permission set's read paths: ${read.join(", ")}`,
  );
});

Deno.test("the BCE overlay's agent config keeps what the DaemonSet needs of the base's: the metrics port and the conflist it writes", async () => {
  // The patch replaces agent.jsonc whole: without these nothing serves the port the
  // DaemonSet's annotations and the PodMonitor scrape, and no conflist is written (the node
  // never Ready).
  const dir = "deploy/kubernetes/bce";
  const [cmPatch] = await load(`${dir}/agent-config.yaml`);
  const text = cmPatch.data["agent.jsonc"];
  const bce = resolveConfig({ file: { path: `${dir}/agent-config.yaml`, text }, env: {} });
  const baseText = cm("enim-agent-config").data["agent.jsonc"];
  const base = resolveConfig({ file: { path: "configmap.yaml", text: baseText }, env: {} });
  assertEquals(bce.metrics, base.metrics);
  assertEquals(bce.metrics.enabled, true);
  assertEquals(bce.cniConfig, base.cniConfig);
  assert(bce.cniConfig, "the agent writes the conflist");
  // The rest the base sets, the same.
  assertEquals([bce.socket, bce.statePath, bce.devicePlugin], [
    base.socket,
    base.statePath,
    base.devicePlugin,
  ]);
});
