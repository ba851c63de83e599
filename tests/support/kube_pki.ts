/**
 * A throwaway PKI for tests of HTTPS to a Kubernetes API server, made with the openssl
 * CLI (Debian's `openssl` package) by the test cluster's steps (`k8s/pki.ts`): a
 * self-signed CA, a server certificate for 127.0.0.1 to 127.0.0.3 and localhost signed by it, and a
 * client certificate (as kubeadm issues an admin's: `O=system:masters`), all ECDSA
 * P-256, valid for a day. A second, unrelated CA lets a test check that a server signed
 * by another CA is refused.
 *
 * @module
 */
import { issue, issueClient, selfSignedCa } from "./k8s/pki.ts";

/** PEM texts and the files holding them. */
export interface TestPki {
  dir: string;
  caCert: string;
  caCertFile: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientCertFile: string;
  clientKey: string;
  clientKeyFile: string;
  /** A CA that signed nothing here. */
  otherCaCert: string;
}

/** Makes the PKI in a new temporary folder (remove `dir` when done). */
export async function makeTestPki(): Promise<TestPki> {
  const dir = await Deno.makeTempDir({ prefix: "enim-kube-pki-" });
  try {
    await selfSignedCa(dir, "ca", "ca");
    await selfSignedCa(dir, "other-ca", "other-ca");
    await issue(dir, "server", "/CN=kube-apiserver", [
      "basicConstraints=CA:FALSE",
      "keyUsage=critical,digitalSignature",
      "extendedKeyUsage=serverAuth",
      "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost",
    ]);
    await issueClient(dir, "client", "enim-test", ["system:masters"]);
    const read = (f: string) => Deno.readTextFile(`${dir}/${f}`);
    return {
      dir,
      caCert: await read("ca.crt"),
      caCertFile: `${dir}/ca.crt`,
      serverCert: await read("server.crt"),
      serverKey: await read("server.key"),
      clientCert: await read("client.crt"),
      clientCertFile: `${dir}/client.crt`,
      clientKey: await read("client.key"),
      clientKeyFile: `${dir}/client.key`,
      otherCaCert: await read("other-ca.crt"),
    };
  } catch (err) {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw err;
  }
}
