import { assertEquals, assertStringIncludes } from "../lib/assert.ts";
import { PodPolicyViewSchema } from "../api/schema.ts";
import { renderPolicy } from "./policy.ts";

const VIEW = PodPolicyViewSchema.parse({
  pod: "shop/db",
  addresses: ["10.99.0.12"],
  nodeAddresses: ["10.99.0.250"],
  policies: [{ name: "db", ingress: true, egress: true, ingressRules: 1, egressRules: 0 }],
  ingress: {
    isolated: true,
    rules: [{
      kind: "pods",
      peer: "pods app=web in namespace shop",
      ports: ["TCP 5432", "TCP port http"],
      members: ["10.99.0.11", "10.99.0.13", "10.99.0.14", "10.99.0.15", "10.99.0.16"],
    }, { kind: "any", peer: "any address", ports: ["UDP 53"], members: [] }],
  },
  egress: { isolated: true, rules: [] },
  warnings: ['db: ingress port "dns"/TCP names no port of the pod: matches nothing'],
});

Deno.test("enim policy prints a pod's policies, each direction and each rule with its peer's members", () => {
  const text = renderPolicy(VIEW);
  assertEquals(text.split("\n").slice(0, 5), [
    "pod shop/db (10.99.0.12)",
    "selected by 1 policy: db (Ingress, Egress)",
    "always allowed: the node (10.99.0.250), the pod itself, replies",
    "ingress: isolated: 2 rules admit (besides replies, the node and the pod itself)",
    "egress: isolated: nothing is admitted (besides replies, the node and the pod itself)",
  ]);
  assertStringIncludes(
    text,
    "ingress    pods app=web in namespace shop  TCP 5432, TCP port http  5: 10.99.0.11, 10.99.0.13, 10.99.0.14, 10.99.0.15, …",
  );
  assertStringIncludes(
    text,
    "ingress    any address                     UDP 53                   -",
  );
  assertStringIncludes(text, 'WARNING: db: ingress port "dns"/TCP names no port of the pod');
});

Deno.test("enim policy says when a pod is selected by no policy", () => {
  const text = renderPolicy({
    ...VIEW,
    policies: [],
    ingress: { isolated: false, rules: [] },
    egress: { isolated: false, rules: [] },
    warnings: [],
  });
  assertStringIncludes(text, "selected by no NetworkPolicy\n");
  assertStringIncludes(text, "ingress: not isolated: everything is admitted\n");
});

Deno.test("enim policy marks a policy the agent cannot read, and its warning says what it does instead", () => {
  const text = renderPolicy(PodPolicyViewSchema.parse({
    ...VIEW,
    policies: [{
      name: "future",
      ingress: true,
      egress: false,
      ingressRules: 0,
      egressRules: 0,
      unreadable: 'spec.ingress.0.ports.0.protocol: Invalid option (got "FOO")',
    }],
    ingress: { isolated: true, rules: [] },
    egress: { isolated: false, rules: [] },
    warnings: [
      'future: cannot be read (spec.ingress.0.ports.0.protocol: Invalid option (got "FOO")): it isolates the pods app=db for ingress and admits nothing',
    ],
  }));
  assertStringIncludes(
    text,
    "selected by 1 policy: future (Ingress, UNREADABLE: admits nothing)\n",
  );
  assertStringIncludes(text, "ingress: isolated: nothing is admitted");
  assertStringIncludes(text, "WARNING: future: cannot be read (");
});
