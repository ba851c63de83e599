/**
 * The kube-proxy rule generator (tests/support/kube_proxy.ts): chain names as
 * kube-proxy's own tests show them, and rulesets the kernel's tools accept.
 */
import { assertEquals, assertStringIncludes } from "../lib/assert.ts";
import {
  installKubeProxy,
  iptablesRules,
  KUBE_PROXY_NEEDS,
  nftablesRules,
  nftEndpointBase,
  nftServiceBase,
  removeKubeProxy,
  sepChain,
  type ServicePort,
  svcChain,
} from "./support/kube_proxy.ts";
import { createNetns, deleteNetns, uniqueName } from "../netns/sim.ts";
import { ensureApt, isRoot } from "../scripts/_deps.ts";

const SVC1: ServicePort = {
  namespace: "ns1",
  name: "svc1",
  portName: "p80",
  protocol: "tcp",
  clusterIP: "172.30.0.41",
  port: 80,
  endpoints: [{ ip: "10.180.0.1", port: 80 }],
};

Deno.test("chain names are kube-proxy's: the hashes its own tests show", () => {
  assertEquals(svcChain(SVC1), "KUBE-SVC-XPGD46QRK7WJZT7O");
  assertEquals(sepChain(SVC1, SVC1.endpoints[0]), "KUBE-SEP-SXIVWICOYRO3J4NJ");
  const dns: ServicePort = {
    ...SVC1,
    namespace: "kube-system",
    name: "kube-dns",
    portName: "dns",
    protocol: "udp",
  };
  assertEquals(svcChain(dns), "KUBE-SVC-TCOU7JCQXEZGVUNU");
  assertEquals(nftServiceBase(SVC1), "ULMVA6XW-ns1/svc1/tcp/p80");
  assertEquals(
    nftEndpointBase(SVC1, SVC1.endpoints[0]),
    "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80",
  );
});

Deno.test("iptables mode: the DNAT chains, the hairpin mark and the masquerade of marked traffic", () => {
  const text = iptablesRules([SVC1], {
    family: 4,
    serviceCidr: "172.30.0.0/16",
    nodeIPs: [],
  });
  for (
    const line of [
      '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O',
      '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ',
      "-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ",
      "-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80",
      "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
      "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
    ]
  ) {
    assertStringIncludes(text, line + "\n");
  }
});

Deno.test("nftables mode: the service and endpoint chains and the service-ips map", () => {
  const text = nftablesRules([SVC1], {
    family: 4,
    serviceCidr: "172.30.0.0/16",
    nodeIPs: [],
  });
  for (
    const line of [
      "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }",
      "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade",
      "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80",
      "add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }",
      "add rule ip kube-proxy masquerading masquerade fully-random",
    ]
  ) {
    assertStringIncludes(text, line + "\n");
  }
});

const root = isRoot();
Deno.test({
  name: "both modes' rules load in a namespace, IPv4 and IPv6, and replace each other",
  ignore: !root,
  async fn() {
    const unmet = await ensureApt(KUBE_PROXY_NEEDS);
    if (unmet.length > 0) throw new Error(`Cannot install ${unmet.join(", ")}`);
    const ns = uniqueName("enim-t-kp");
    await createNetns(ns);
    try {
      const v6: ServicePort = {
        ...SVC1,
        clusterIP: "fd00:30::41",
        endpoints: [{ ip: "fd00:180::1", port: 80 }, {
          ip: "fd00:180::2",
          port: 80,
        }],
      };
      const opts = [
        {
          family: 4 as const,
          serviceCidr: "172.30.0.0/16",
          nodeIPs: ["10.99.0.250"],
        },
        {
          family: 6 as const,
          serviceCidr: "fd00:30::/108",
          nodeIPs: ["fd00:99::fa"],
        },
      ];
      await installKubeProxy(ns, "iptables", [SVC1, v6], opts);
      await installKubeProxy(ns, "nftables", [SVC1, v6], opts);
      await installKubeProxy(ns, "iptables", [SVC1, v6], opts);
      await removeKubeProxy(ns);
    } finally {
      await deleteNetns(ns);
    }
  },
});
