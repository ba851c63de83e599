/**
 * A throwaway PKI for tests of HTTPS to a Kubernetes API server, made with the openssl
 * CLI (Debian's `openssl` package): a self-signed CA, a server certificate for
 * 127.0.0.1 and localhost signed by it, and a client certificate (as kubeadm issues an
 * admin's: `O=system:masters`), all ECDSA P-256, valid for a day. A second,
 * unrelated CA lets a test check that a server signed by another CA is refused.
 *
 * @module
 */

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

async function openssl(dir: string, args: string[]): Promise<void> {
  const out = await new Deno.Command("/usr/bin/openssl", {
    args,
    cwd: dir,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(
      `openssl ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr).trim()}`,
    );
  }
}

const EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

async function selfSignedCa(dir: string, name: string): Promise<void> {
  await openssl(dir, [
    "req",
    "-x509",
    ...EC,
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.crt`,
    "-subj",
    `/CN=${name}`,
    "-days",
    "1",
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign,cRLSign",
  ]);
}

async function leaf(dir: string, name: string, subj: string, ext: string): Promise<void> {
  await openssl(dir, [
    "req",
    ...EC,
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.csr`,
    "-subj",
    subj,
  ]);
  await Deno.writeTextFile(`${dir}/${name}.ext`, ext);
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    `${name}.crt`,
    "-days",
    "1",
    "-extfile",
    `${name}.ext`,
  ]);
}

/** Makes the PKI in a new temporary folder (remove `dir` when done). */
export async function makeTestPki(): Promise<TestPki> {
  const dir = await Deno.makeTempDir({ prefix: "enim-kube-pki-" });
  try {
    await selfSignedCa(dir, "ca");
    await selfSignedCa(dir, "other-ca");
    await leaf(
      dir,
      "server",
      "/CN=kube-apiserver",
      "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n" +
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    );
    await leaf(
      dir,
      "client",
      "/O=system:masters/CN=enim-test",
      "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    );
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
