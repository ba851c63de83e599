/**
 * What users expect of a node's life (issue 50, point 3), on the real node with the shipped
 * DaemonSet and enim's image (tests/support/k8s/enim_node.ts, as
 * tests/k8s_real_node_daemonset_test.ts installs it), one cluster and node for every case:
 *
 * 1. a container's restart (its process exits, kubelet starts it again in the same sandbox):
 *    the pod keeps its IP and is reached again; the runtime made no CNI call for it;
 * 2. a sandbox's re-creation (its pause process killed: kubelet stops the sandbox and makes a
 *    new one): the old sandbox's DEL, the new one's ADD with an ENI, the pod reached at its
 *    new address; no ENI leaked;
 * 3. kubelet's own restart with pods running: no CNI call, the pods keep their sandboxes and
 *    IPs and are reached, the Node is Ready again, the device plugin registers again and a
 *    new pod gets an ENI;
 * 4. a wedged agent (SIGSTOP to its process, found through its container's cgroup): the
 *    DaemonSet's liveness probe fails and the real kubelet restarts the agent; the Node is
 *    Ready and a new pod gets an ENI; the pods from before keep theirs (the time from SIGSTOP
 *    to the new agent is printed, not asserted);
 * 5. cluster DNS: a DNS server pod (tests/support/k8s/dnsd.ts, run by the deno of enim's
 *    image) behind the `kube-dns` Service at kubelet's clusterDNS (10.96.0.10), through the
 *    real kube-proxy; a workload pod resolves a Service's name by the resolv.conf kubelet
 *    gave it and fetches from the address.
 *
 * Pods are reached from a prober pod's network namespace (its ENI, over the simulated VPC),
 * entered by the PID of its pause process. What the runtime invoked is read from the
 * installed plugin's own log (`/var/log/enim/cni.log` of the node), the agent's state from
 * its API on its socket.
 *
 * Skips, saying why, without Go, gcc, or root.
 *
 * @module
 */
import { assert, assertEquals } from "../lib/assert.ts";
import { z } from "zod";
import { nodeBuildMissing } from "./support/k8s/build.ts";
import { NodeSchema } from "./support/k8s/kubelet.ts";
import type { RealNode } from "./support/k8s/real_node.ts";
import { StoredSchema } from "./support/k8s/rest.ts";
import {
  agentClient,
  agentPodOf,
  type CniInvocation,
  cniInvocations,
  EnimNode,
  isReady,
  type RealPod,
  RealPodSchema,
  runtimeId,
  SHIPPED_IMAGE,
  waitFor,
  workloadPod,
} from "./support/k8s/enim_node.ts";
import { ensureBuiltSync } from "../scripts/build.ts";

const ROOT = Deno.uid() === 0;
const MISSING = nodeBuildMissing() ?? (ROOT ? null : "needs root (namespaces, mounts, cgroups)");

const NODE = "real-node-life";
const ENIS = 5;
const CLUSTER_DNS = "10.96.0.10";
const WEB_SERVICE_IP = "10.96.0.80";
const WEB_NAME = "web.default.svc.cluster.local";
const PATH = "/usr/sbin:/usr/bin:/sbin:/bin";

const NodeHeartbeatSchema = NodeSchema.extend({
  status: z.looseObject({
    conditions: z.array(z.looseObject({
      type: z.string(),
      status: z.string(),
      lastHeartbeatTime: z.string(),
    })),
  }),
});

/** A pod serving `GET /` with its own name on port 8080. */
const serve = (name: string) =>
  `mkdir -p /www && echo ${name} > /www/index.html && exec httpd -f -p 8080 -h /www`;

const say = (l: string) => console.error(l);

Deno.test({
  name:
    "on a real kubelet with the shipped DaemonSet: container restart, sandbox re-creation, kubelet restart, a wedged agent restarted by its liveness probe, cluster DNS",
  ignore: MISSING !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn(t) {
    ensureBuiltSync();
    const t0 = performance.now();
    const figures: string[] = [];
    const figure = (f: string) => {
      figures.push(f);
      say(`figure: ${f}`);
    };
    await using env = await EnimNode.start({ name: NODE, enis: ENIS, progress: say });
    const { cluster, node } = env;
    figure(`setup (control plane, node, image, DaemonSet Ready): ${secs(t0)} s`);
    const api = agentClient(node);
    await node.serveKubernetesService();

    const getPod = (name: string, ns = "default") =>
      cluster.admin.get(`/api/v1/namespaces/${ns}/pods/${name}`, RealPodSchema);
    const createPod = (obj: unknown, ns = "default") =>
      cluster.admin.create(`/api/v1/namespaces/${ns}/pods`, obj, RealPodSchema);
    const running = (name: string, ns = "default") =>
      waitFor(`${ns}/${name} Running and Ready with an IP`, async () => {
        const p = await getPod(name, ns);
        return p.status?.phase === "Running" && p.status.podIP && isReady(p) ? p : null;
      }, node);
    /** Deletes pod `name` (if there) and waits until it is gone. */
    const deletePod = async (name: string) => {
      await cluster.admin.delete(`/api/v1/namespaces/default/pods/${name}`, {
        gracePeriodSeconds: 1,
      });
      await waitFor(`${name} gone`, async () => {
        const p = await cluster.admin.find(`/api/v1/namespaces/default/pods/${name}`, StoredSchema);
        return p === null ? true : null;
      }, node);
    };
    // The pods a step makes for itself, deleted when it ends, passed or failed (so that a
    // failed step leaves the next ones the node they expect).
    const temporary: string[] = [];
    const createTemporary = (obj: { metadata: { name: string } }) => {
      temporary.push(obj.metadata.name);
      return createPod(obj);
    };
    const step = (name: string, fn: () => Promise<void>) =>
      t.step(name, async () => {
        try {
          await fn();
        } finally {
          for (const p of temporary.splice(0)) await deletePod(p).catch(() => {});
        }
      });
    /** The pod's one ready sandbox. */
    const sandboxOf = async (p: RealPod) => {
      const ready = (await node.sandboxesOf(p.metadata.uid)).filter((s) => s.ready);
      assertEquals(ready.length, 1, `ready sandboxes of ${p.metadata.name}`);
      return ready[0].id;
    };
    const adds = (calls: CniInvocation[], id: string) =>
      calls.filter((c) => c.verb === "ADD" && c.containerId === id);
    const dels = (calls: CniInvocation[], id: string) =>
      calls.filter((c) => c.verb === "DEL" && c.containerId === id);
    const addsAndDels = async () =>
      (await cniInvocations(node)).filter((c) => c.verb === "ADD" || c.verb === "DEL");
    const attachmentOf = async (id: string) =>
      (await api.attachments()).filter((a) => a.containerId === id);
    /** The pool once every DEL finished: no ENI held by a pod that is gone. */
    /**
     * The pool once every DEL finished: one attachment, with an ENI, per ready sandbox of a
     * pod (the agent's own is hostNetwork), `pods` of them; every other ENI free or not
     * attached.
     */
    const assertNoLeak = async (pods: number, when: string) => {
      const s = await waitFor(`the agent's pool settled (${when})`, async () => {
        const s = await api.status();
        return s.pool.recycling === 0 && s.unfinishedDels.length === 0 ? s : null;
      }, node);
      const agentUid = (await agentPodOf(cluster))?.metadata.uid;
      const sandboxes = (await node.cri.listPodSandbox())
        .filter((b) =>
          b.state === "SANDBOX_READY" && b.labels["io.kubernetes.pod.uid"] !== agentUid
        )
        .map((b) => b.id).sort();
      const attachments = await api.attachments();
      assertEquals(
        attachments.map((a) => a.containerId).sort(),
        sandboxes,
        `${when}: ${JSON.stringify(attachments)}`,
      );
      assertEquals(attachments.length, pods, when);
      assert(attachments.every((a) => a.state === "ready" && a.eniId), when);
      assertEquals(s.pool.held, 0, when);
      assertEquals(
        s.pool.free + s.pool.attachable,
        ENIS - pods,
        `${when}: ${JSON.stringify(s.pool)}`,
      );
      figure(`${when}: pool ${JSON.stringify(s.pool)}`);
    };

    // The prober: its network namespace (its ENI) is where the test reaches pods from.
    await createPod(workloadPod("prober", "exec sleep 3600"));
    const prober = await running("prober");
    const proberPid = await node.sandboxPid(await sandboxOf(prober));
    /** `GET /` of ip:port from the prober's namespace (null: no answer). */
    const fetchFromProber = async (ip: string, port = 8080): Promise<string | null> => {
      const out = await new Deno.Command("/usr/bin/nsenter", {
        args: [
          `--net=/proc/${proberPid}/ns/net`,
          "--",
          "/bin/busybox",
          "sh",
          "-c",
          `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 ${ip} ${port}`,
        ],
        clearEnv: true,
        env: { PATH },
        stdout: "piped",
        stderr: "null",
      }).output();
      const body = new TextDecoder().decode(out.stdout).trim().split("\n").pop();
      return out.success && body ? body : null;
    };
    const reached = (what: string, ip: string, expect: string) =>
      waitFor(
        `${what} answers at ${ip}:8080`,
        async () => {
          const body = await fetchFromProber(ip);
          return body === expect ? body : null;
        },
        node,
        60_000,
      );

    // web's container exits once (after a while, serving), then serves: an emptyDir volume
    // (kept through the container's restart) remembers the first run.
    await createPod(workloadPod(
      "web",
      [
        "mkdir -p /www && echo web > /www/index.html",
        "if [ ! -e /data/ran ]; then touch /data/ran; httpd -p 8080 -h /www; sleep 8; exit 1; fi",
        "exec httpd -f -p 8080 -h /www",
      ].join("\n"),
      {
        spec: { volumes: [{ name: "data", emptyDir: {} }] },
        container: {
          ports: [{ name: "http", containerPort: 8080 }],
          volumeMounts: [{ name: "data", mountPath: "/data" }],
        },
      },
    ));

    let web = await running("web");
    let webIp = web.status!.podIP!;
    let webSandbox = await sandboxOf(web);
    assert(webIp.startsWith("10.200.0."), `web's IP ${webIp} is an ENI's of the VPC`);

    await step(
      "1. a container's restart: same sandbox, same IP, reached, no CNI call",
      async () => {
        const eni = (await attachmentOf(webSandbox))[0]?.eniId;
        assert(eni, "web's attachment has an ENI");
        const before = await addsAndDels();
        assertEquals(adds(before, webSandbox).length, 1);
        const restarted = await waitFor(
          "web's container restarted and Ready",
          async () => {
            const p = await getPod("web");
            const c = p.status?.containerStatuses?.[0];
            return c && c.restartCount >= 1 && c.ready && p.status?.podIP ? p : null;
          },
          node,
          120_000,
        );
        assertEquals(restarted.status?.containerStatuses?.[0].restartCount, 1);
        assertEquals(restarted.status?.podIP, webIp);
        assertEquals(await sandboxOf(restarted), webSandbox);
        await reached("web (restarted)", webIp, "web");
        const after = await addsAndDels();
        assertEquals(after.slice(before.length), [], "no ADD or DEL after the container's restart");
        assertEquals((await attachmentOf(webSandbox)).map((a) => a.eniId), [eni]);
      },
    );

    await step(
      "2. a sandbox's re-creation: DEL of the old, ADD of the new, reached, no leak",
      async () => {
        const old = webSandbox;
        const oldAttachment = (await attachmentOf(old))[0];
        const oldIp = webIp;
        const pause = await node.sandboxPid(old);
        const tKill = performance.now();
        Deno.kill(pause, "SIGKILL");
        const next = await waitFor(
          "web in a new sandbox, Running and Ready",
          async () => {
            const p = await getPod("web");
            const ready = (await node.sandboxesOf(p.metadata.uid)).filter((s) => s.ready);
            if (ready.length !== 1 || ready[0].id === old) return null;
            // The API's status is kubelet's last report: wait for the new sandbox's address
            // in it (it may say Ready at the old one a while).
            const ip = (await node.cri.podSandboxStatus(ready[0].id, false)).status.network?.ip;
            return ip && isReady(p) && p.status?.podIP === ip ? { p, id: ready[0].id } : null;
          },
          node,
          120_000,
        );
        figure(
          `sandbox re-creation: pause killed → web Ready in its new sandbox: ${secs(tKill)} s`,
        );
        const calls = await addsAndDels();
        assertEquals(dels(calls, old).filter((c) => c.code === 0).length >= 1, true, "old DEL");
        assertEquals(adds(calls, next.id).map((c) => c.code), [0], "the new sandbox's ADD");
        assertEquals(await attachmentOf(old), [], "the old sandbox's attachment is gone");
        const attachment = (await attachmentOf(next.id))[0];
        assert(attachment?.eniId, "the new sandbox's attachment has an ENI");
        const eni = (await api.status()).enis.find((e) => e.id === attachment.eniId);
        web = next.p;
        webSandbox = next.id;
        webIp = web.status!.podIP!;
        assertEquals(eni?.ipv4?.address, webIp, "the pod's IP is its ENI's");
        figure(
          `sandbox re-creation: ENI ${oldAttachment?.eniId} → ${attachment.eniId}, ` +
            `IP ${oldIp} → ${webIp}`,
        );
        await reached("web (new sandbox)", webIp, "web");
        await assertNoLeak(2, "after the sandbox's re-creation");
      },
    );

    await step(
      "3. kubelet's restart: no CNI call, same sandboxes and IPs, Node Ready, new pod ENI",
      async () => {
        const pods = await Promise.all(["prober", "web"].map((n) => getPod(n)));
        const sandboxes = await Promise.all(pods.map((p) => sandboxOf(p)));
        const agentBefore = await agentPodOf(cluster);
        const before = await addsAndDels();
        const oldPid = node.kubeletPid;
        const tRestart = new Date();
        await node.restartKubelet();
        assert(node.kubeletPid !== oldPid, "a new kubelet process");
        await waitFor(
          "a heartbeat of the new kubelet, Ready",
          async () => {
            const n = await cluster.admin.get(`/api/v1/nodes/${NODE}`, NodeHeartbeatSchema);
            const r = n.status.conditions.find((c) => c.type === "Ready");
            return r?.status === "True" &&
                Date.parse(r.lastHeartbeatTime) >= tRestart.getTime() - 1000
              ? true
              : null;
          },
          node,
          120_000,
        );
        // The new kubelet admits a pod asking for enim.dev/eni: the device plugin registered
        // again with it; the pod gets an ENI.
        await createTemporary(workloadPod("after-kubelet", serve("after-kubelet")));
        const fresh = await running("after-kubelet");
        assert(fresh.status!.podIP!.startsWith("10.200.0."), `${fresh.status?.podIP}`);
        await reached("after-kubelet", fresh.status!.podIP!, "after-kubelet");
        figure(
          `kubelet restart → a new pod Running with an ENI: ${secs(tRestart.getTime(), true)} s`,
        );
        for (const [i, p] of pods.entries()) {
          const now = await getPod(p.metadata.name);
          assertEquals(now.status?.podIP, p.status?.podIP, p.metadata.name);
          assertEquals(await sandboxOf(now), sandboxes[i], p.metadata.name);
          assertEquals(
            now.status?.containerStatuses?.[0].restartCount,
            p.status?.containerStatuses?.[0].restartCount,
            `${p.metadata.name}'s restarts`,
          );
        }
        const agentAfter = await agentPodOf(cluster);
        assertEquals(
          agentAfter?.status?.containerStatuses?.[0].restartCount,
          agentBefore?.status?.containerStatuses?.[0].restartCount,
          "the agent's restarts",
        );
        await reached("web (after kubelet's restart)", webIp, "web");
        const calls = (await addsAndDels()).slice(before.length);
        assertEquals(
          calls.map((c) => `${c.verb} ${c.containerId}`),
          [`ADD ${await sandboxOf(fresh)}`],
          "the only CNI call after kubelet's restart is the new pod's ADD",
        );
        await deletePod("after-kubelet");
        await assertNoLeak(2, "after kubelet's restart and after-kubelet's deletion");
      },
    );

    await step("4. a wedged agent: the real kubelet's liveness probe restarts it", async () => {
      const agent = (await agentPodOf(cluster))!;
      const status = agent.status!.containerStatuses!.find((c) => c.name === "agent")!;
      const id = runtimeId(status.containerID);
      assert(id, `the agent's container ID: ${status.containerID}`);
      const procs = node.containerProcesses(id);
      assert(procs.init, `the agent's init among ${procs.pids}`);
      const attachmentsBefore = await api.attachments();
      const tStop = performance.now();
      Deno.kill(procs.init, "SIGSTOP");
      say(`agent ${procs.init} (container ${id.slice(0, 12)}) stopped`);
      const restarted = await waitFor(
        "the agent's container restarted",
        async () => {
          const p = await agentPodOf(cluster);
          const c = p?.status?.containerStatuses?.find((c) => c.name === "agent");
          return c && c.restartCount > status.restartCount ? p : null;
        },
        node,
        240_000,
      );
      figure(`wedged agent: SIGSTOP → restartCount ${status.restartCount + 1}: ${secs(tStop)} s`);
      const probeFailures = (await node.kubeletLog()).split("\n")
        .filter((l) => l.includes("Probe failed") && l.includes('probeType="Liveness"')).length;
      assert(probeFailures >= 1, "kubelet logged the liveness probe's failures");
      figure(`wedged agent: kubelet logged ${probeFailures} liveness probe failure(s)`);
      await waitFor(
        "the new agent Ready",
        async () => {
          const p = await agentPodOf(cluster);
          return isReady(p) ? p : null;
        },
        node,
        180_000,
      );
      figure(`wedged agent: SIGSTOP → the new agent Ready: ${secs(tStop)} s`);
      assertEquals(
        restarted.metadata.uid,
        agent.metadata.uid,
        "the same pod, its container restarted",
      );
      await node.waitReady(120_000);
      // The pods from before keep their ENIs (the agent's state outlives it).
      assertEquals(
        (await api.attachments()).map((a) => `${a.containerId} ${a.eniId}`).sort(),
        attachmentsBefore.map((a) => `${a.containerId} ${a.eniId}`).sort(),
      );
      await reached("web (after the agent's restart)", webIp, "web");
      await createTemporary(workloadPod("after-agent", serve("after-agent")));
      const fresh = await running("after-agent");
      assert(fresh.status!.podIP!.startsWith("10.200.0."), `${fresh.status?.podIP}`);
      await reached("after-agent", fresh.status!.podIP!, "after-agent");
      figure(`wedged agent: SIGSTOP → a new pod Running with an ENI: ${secs(tStop)} s`);
      await deletePod("after-agent");
      await assertNoLeak(2, "after the agent's restart and after-agent's deletion");
    });

    await step(
      "5. cluster DNS: a pod resolves a Service through kube-dns at clusterDNS and reaches it",
      async () => {
        const dnsd = await Deno.readTextFile(new URL("./support/k8s/dnsd.ts", import.meta.url));
        await cluster.admin.create("/api/v1/namespaces/kube-system/configmaps", {
          apiVersion: "v1",
          kind: "ConfigMap",
          metadata: { name: "dnsd" },
          data: { "dnsd.ts": dnsd },
        }, StoredSchema);
        await createPod({
          apiVersion: "v1",
          kind: "Pod",
          metadata: { name: "dns", labels: { "k8s-app": "kube-dns" } },
          spec: {
            terminationGracePeriodSeconds: 1,
            containers: [{
              name: "dnsd",
              // The deno of enim's image runs the server (busybox-static has no dnsd).
              image: SHIPPED_IMAGE,
              imagePullPolicy: "Never",
              command: [
                "/usr/local/lib/enim/deno",
                "run",
                "--allow-net",
                "--allow-env",
                "/etc/dnsd/dnsd.ts",
                `${WEB_NAME}=${WEB_SERVICE_IP}`,
              ],
              env: [
                { name: "DENO_DIR", value: "/tmp/deno" },
                { name: "DENO_NO_UPDATE_CHECK", value: "1" },
              ],
              ports: [{ name: "dns", containerPort: 53, protocol: "UDP" }],
              volumeMounts: [{ name: "dnsd", mountPath: "/etc/dnsd" }],
              resources: { limits: { "enim.dev/eni": "1" }, requests: { "enim.dev/eni": "1" } },
            }],
            volumes: [{ name: "dnsd", configMap: { name: "dnsd" } }],
          },
        }, "kube-system");
        for (
          const [ns, name, ip, port, target, protocol, selector] of [
            ["kube-system", "kube-dns", CLUSTER_DNS, 53, 53, "UDP", { "k8s-app": "kube-dns" }],
            ["default", "web", WEB_SERVICE_IP, 80, 8080, "TCP", { app: "web" }],
          ] as const
        ) {
          await cluster.admin.create(`/api/v1/namespaces/${ns}/services`, {
            apiVersion: "v1",
            kind: "Service",
            metadata: { name },
            spec: {
              clusterIP: ip,
              selector,
              ports: [{ name: "p", port, targetPort: target, protocol }],
            },
          }, StoredSchema);
        }
        const dns = await waitFor("the DNS server Running", async () => {
          const p = await getPod("dns", "kube-system");
          return p.status?.phase === "Running" && p.status.podIP ? p : null;
        }, node);
        assert(dns.status!.podIP!.startsWith("10.200.0."), `the DNS pod's IP ${dns.status?.podIP}`);

        const script = [
          "set -e",
          "cat /etc/resolv.conf",
          // kube-proxy programs the Services a moment after their endpoints are ready.
          `for i in $(seq 1 30); do if a=$(nslookup ${WEB_NAME}); then break; fi; sleep 1; done`,
          'echo "$a"',
          `ip=$(echo "$a" | awk '/^Address: /{print $2}' | tail -n 1)`,
          'echo "resolved: $ip"',
          'test -n "$ip"',
          `r=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 "$ip" 80 | tail -n 1)`,
          'echo "fetched: $r"',
          'test "$r" = web',
          // The Service's short name, through the search list kubelet wrote (busybox's
          // nslookup tries every search domain and exits 1 when any fails: its output counts).
          `echo "short name web: $(nslookup web 2>&1 | awk '/^Address: /{print $2}' | tail -n 1)"`,
        ].join("\n");
        await createTemporary(workloadPod("dns-client", script, { never: true }));
        const client = await waitFor("dns-client finished", async () => {
          const p = await getPod("dns-client");
          return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : null;
        }, node);
        const log = podLog(node, client);
        say(log);
        assert(log.includes(`nameserver ${CLUSTER_DNS}`), `the pod's resolv.conf: ${log}`);
        assert(log.includes(`resolved: ${WEB_SERVICE_IP}`), log);
        assert(log.includes("fetched: web"), log);
        assertEquals(client.status?.phase, "Succeeded", log);
        assert(log.includes(`short name web: ${WEB_SERVICE_IP}`), log);
        // The question reached the server from the client's own address (kube-proxy DNATs,
        // it does not masquerade pod traffic).
        const served = podLog(node, dns, "dnsd").split("\n").filter((l) => l.includes(WEB_NAME));
        assert(
          served.some((l) => l.includes(`"from":"${client.status?.podIP}"`)),
          `the DNS server's log: ${served.join("\n")}`,
        );
        await deletePod("dns-client");
        await assertNoLeak(3, "with the DNS server, its client deleted");
      },
    );

    figure(`total wall time: ${secs(t0)} s`);
    say(`\nfigures:\n${figures.map((f) => `  ${f}`).join("\n")}`);
  },
});

/** Seconds since `from` (performance.now(), or a wall-clock ms when `wall`). */
function secs(from: number, wall = false): string {
  return (((wall ? Date.now() : performance.now()) - from) / 1000).toFixed(1);
}

/** A container's log, read from the node's /var/log/pods (kubelet writes it there). */
function podLog(node: RealNode, p: RealPod, container = "main"): string {
  const ns = p.metadata.namespace ?? "default";
  const dir = node.host(`/var/log/pods/${ns}_${p.metadata.name}_${p.metadata.uid}/${container}`);
  return [...Deno.readDirSync(dir)].map((e) => Deno.readTextFileSync(`${dir}/${e.name}`))
    .join("");
}
