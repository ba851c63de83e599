/**
 * Kubernetes objects as an API server returns them, for the test API server: built
 * from the OpenAPI shapes of `v1.Pod`, `v1.Namespace` and
 * `networking.k8s.io/v1.NetworkPolicy` (not from enim's schemas), with the fields a real
 * cluster fills in (managedFields, a container's image, resources, probes and volume
 * mounts, the status's conditions and containerStatuses), so that a pod weighs about
 * what a real one does on the wire (~3.5 KB of JSON).
 *
 * @module
 */
import type { Obj } from "./kube_apiserver.ts";

/** What a test says about a pod; the rest is filled in. */
export interface PodSpecLite {
  namespace: string;
  name: string;
  labels?: Record<string, string>;
  nodeName?: string;
  ip?: string;
  ipv6?: string;
  hostNetwork?: boolean;
  phase?: string;
  ports?: { name?: string; containerPort: number; protocol?: string }[];
}

/** A full pod, as `GET /api/v1/namespaces/{ns}/pods/{name}` returns it (less resourceVersion and uid). */
export function makePod(p: PodSpecLite): Obj {
  const started = "2026-01-01T00:00:00Z";
  const image = `registry.example.com/${p.namespace}/${p.name.replace(/-[a-z0-9]+$/, "")}:1.4.2`;
  const ips = [p.ip, p.ipv6].filter((x): x is string => x !== undefined);
  return {
    metadata: {
      name: p.name,
      namespace: p.namespace,
      labels: p.labels ?? { app: p.name },
      annotations: {
        "kubernetes.io/psp": "restricted",
        "enim.dev/profile": "default",
      },
      ownerReferences: [{
        apiVersion: "apps/v1",
        kind: "ReplicaSet",
        name: `${p.name}-rs`,
        uid: "7a1b2c3d-0000-4000-8000-000000000001",
        controller: true,
        blockOwnerDeletion: true,
      }],
      generateName: `${p.name}-`,
      managedFields: [{
        manager: "kube-controller-manager",
        operation: "Update",
        apiVersion: "v1",
        time: started,
        fieldsType: "FieldsV1",
        fieldsV1: {
          "f:metadata": { "f:generateName": {}, "f:labels": { ".": {}, "f:app": {} } },
          "f:spec": { "f:containers": { 'k:{"name":"main"}': { ".": {}, "f:image": {} } } },
        },
      }, {
        manager: "kubelet",
        operation: "Update",
        apiVersion: "v1",
        time: started,
        fieldsType: "FieldsV1",
        subresource: "status",
        fieldsV1: { "f:status": { "f:conditions": {}, "f:podIP": {}, "f:podIPs": {} } },
      }],
    },
    spec: {
      ...(p.nodeName ? { nodeName: p.nodeName } : {}),
      ...(p.hostNetwork ? { hostNetwork: true } : {}),
      containers: [{
        name: "main",
        image,
        imagePullPolicy: "IfNotPresent",
        ports: (p.ports ?? [{ name: "http", containerPort: 8080 }]).map((x) => ({
          protocol: "TCP",
          ...x,
        })),
        env: [{ name: "LOG_LEVEL", value: "info" }, {
          name: "POD_IP",
          valueFrom: { fieldRef: { apiVersion: "v1", fieldPath: "status.podIP" } },
        }],
        resources: {
          requests: { cpu: "100m", memory: "128Mi" },
          limits: { memory: "256Mi" },
        },
        readinessProbe: {
          httpGet: { path: "/healthz", port: 8080, scheme: "HTTP" },
          periodSeconds: 10,
          timeoutSeconds: 1,
          successThreshold: 1,
          failureThreshold: 3,
        },
        volumeMounts: [{
          name: "kube-api-access-abcde",
          readOnly: true,
          mountPath: "/var/run/secrets/kubernetes.io/serviceaccount",
        }],
        terminationMessagePath: "/dev/termination-log",
        terminationMessagePolicy: "File",
      }],
      restartPolicy: "Always",
      terminationGracePeriodSeconds: 30,
      dnsPolicy: "ClusterFirst",
      serviceAccountName: "default",
      serviceAccount: "default",
      securityContext: {},
      schedulerName: "default-scheduler",
      tolerations: [
        {
          key: "node.kubernetes.io/not-ready",
          operator: "Exists",
          effect: "NoExecute",
          tolerationSeconds: 300,
        },
        {
          key: "node.kubernetes.io/unreachable",
          operator: "Exists",
          effect: "NoExecute",
          tolerationSeconds: 300,
        },
      ],
      volumes: [{
        name: "kube-api-access-abcde",
        projected: {
          sources: [
            { serviceAccountToken: { expirationSeconds: 3607, path: "token" } },
            { configMap: { name: "kube-root-ca.crt", items: [{ key: "ca.crt", path: "ca.crt" }] } },
          ],
          defaultMode: 420,
        },
      }],
      priority: 0,
      enableServiceLinks: true,
      preemptionPolicy: "PreemptLowerPriority",
    },
    status: {
      phase: p.phase ?? "Running",
      conditions: ["Initialized", "Ready", "ContainersReady", "PodScheduled"].map((type) => ({
        type,
        status: "True",
        lastProbeTime: null,
        lastTransitionTime: started,
      })),
      hostIP: "10.0.0.10",
      hostIPs: [{ ip: "10.0.0.10" }],
      ...(ips.length > 0 ? { podIP: ips[0], podIPs: ips.map((ip) => ({ ip })) } : {}),
      startTime: started,
      containerStatuses: [{
        name: "main",
        state: { running: { startedAt: started } },
        lastState: {},
        ready: true,
        restartCount: 0,
        image,
        imageID: `${image}@sha256:${"ab".repeat(32)}`,
        containerID: `containerd://${"cd".repeat(32)}`,
        started: true,
      }],
      qosClass: "Burstable",
    },
  };
}

/** A namespace with its labels (and the automatic `kubernetes.io/metadata.name`). */
export function makeNamespace(name: string, labels: Record<string, string> = {}): Obj {
  return {
    metadata: { name, labels: { "kubernetes.io/metadata.name": name, ...labels } },
    spec: { finalizers: ["kubernetes"] },
    status: { phase: "Active" },
  };
}

/** A NetworkPolicy admitting `from` pods of `app` on `port` to pods of `to`. */
export function makeNetworkPolicy(
  namespace: string,
  name: string,
  o: { to?: Record<string, string>; fromApp?: string; port?: number; cidr?: string } = {},
): Obj {
  return {
    metadata: { name, namespace, generation: 1 },
    spec: {
      podSelector: { matchLabels: o.to ?? { app: name } },
      ingress: [{
        from: [
          { podSelector: { matchLabels: { app: o.fromApp ?? "client" } } },
          { namespaceSelector: { matchLabels: { team: "a" } } },
          ...(o.cidr ? [{ ipBlock: { cidr: o.cidr, except: [] } }] : []),
        ],
        ports: [{ protocol: "TCP", port: o.port ?? 8080 }],
      }],
      policyTypes: ["Ingress"],
    },
  };
}
