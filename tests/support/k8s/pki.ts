/**
 * The certificates of a test cluster, made with the openssl CLI as kubeadm lays them out:
 * a CA, the API server's serving certificate (127.0.0.1, localhost and the `kubernetes`
 * Service's names and first address; the controller-manager and the scheduler serve with
 * it too, on 127.0.0.1), client certificates for the admin (`O=system:masters`), the
 * controller-manager, the scheduler, kube-proxy and each node (`CN=system:node:<name>`,
 * `O=system:nodes`, what the Node authorizer and NodeRestriction know a kubelet by), and
 * the ServiceAccount token signing key pair. ECDSA P-256, valid for a day, in one folder.
 *
 * @module
 */

/** A certificate and its key, as files. */
export interface CertFiles {
  cert: string;
  key: string;
}

/** The files of a cluster's PKI. */
export interface ClusterPki {
  dir: string;
  /** The CA's certificate (and key, which signs node certificates later). */
  ca: CertFiles;
  /** The serving certificate of every control-plane component. */
  serving: CertFiles;
  admin: CertFiles;
  controllerManager: CertFiles;
  scheduler: CertFiles;
  kubeProxy: CertFiles;
  /** The ServiceAccount token signing key (private) and its public half. */
  serviceAccount: { key: string; pub: string };
}

/** Runs `openssl` in `dir`; throws with its stderr when it fails. */
export async function openssl(dir: string, args: string[]): Promise<void> {
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

/** A self-signed CA, `<name>.crt`/`<name>.key` in `dir`, with the common name `cn`. */
export async function selfSignedCa(dir: string, name: string, cn: string): Promise<void> {
  await openssl(dir, [
    "req",
    "-x509",
    ...EC,
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.crt`,
    "-subj",
    `/CN=${cn}`,
    "-days",
    "1",
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,digitalSignature,keyCertSign,cRLSign",
  ]);
}

/**
 * Issues `<name>.crt`/`<name>.key` in `dir`, signed by its `ca.crt`, with subject `subj`
 * and the extensions `ext` (an openssl extension file's lines).
 */
export async function issue(
  dir: string,
  name: string,
  subj: string,
  ext: string[],
): Promise<CertFiles> {
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
  await Deno.writeTextFile(`${dir}/${name}.ext`, ext.join("\n") + "\n");
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-set_serial",
    `0x${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`,
    "-out",
    `${name}.crt`,
    "-days",
    "1",
    "-extfile",
    `${name}.ext`,
  ]);
  return { cert: `${dir}/${name}.crt`, key: `${dir}/${name}.key` };
}

const CLIENT = [
  "basicConstraints=CA:FALSE",
  "keyUsage=critical,digitalSignature,keyEncipherment",
  "extendedKeyUsage=clientAuth",
];

/** A client certificate for `cn` (in the groups `orgs`) signed by the cluster's CA. */
export function issueClient(
  dir: string,
  name: string,
  cn: string,
  orgs: string[] = [],
): Promise<CertFiles> {
  const subj = orgs.map((o) => `/O=${o}`).join("") + `/CN=${cn}`;
  return issue(dir, name, subj, CLIENT);
}

/**
 * Makes the PKI in `dir` (created): the CA, the serving certificate for 127.0.0.1, ::1,
 * localhost and the `kubernetes` Service (`serviceIP`, its names), the components'
 * client certificates and the ServiceAccount key pair.
 */
export async function makeClusterPki(dir: string, serviceIP: string): Promise<ClusterPki> {
  await Deno.mkdir(dir, { recursive: true });
  await selfSignedCa(dir, "ca", "enim-test-kubernetes-ca");
  const names = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
  ];
  const san = [
    "IP:127.0.0.1",
    "IP:0:0:0:0:0:0:0:1",
    `IP:${serviceIP}`,
    ...names.map((n) => `DNS:${n}`),
  ].join(",");
  const [serving, admin, controllerManager, scheduler, kubeProxy] = await Promise.all([
    issue(dir, "serving", "/CN=kube-apiserver", [
      "basicConstraints=CA:FALSE",
      "keyUsage=critical,digitalSignature,keyEncipherment",
      "extendedKeyUsage=serverAuth",
      `subjectAltName=${san}`,
    ]),
    issueClient(dir, "admin", "kubernetes-admin", ["system:masters"]),
    issueClient(dir, "controller-manager", "system:kube-controller-manager"),
    issueClient(dir, "scheduler", "system:kube-scheduler"),
    issueClient(dir, "kube-proxy", "system:kube-proxy"),
  ]);
  await openssl(dir, [
    "genpkey",
    "-algorithm",
    "EC",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-out",
    "sa.key",
  ]);
  await openssl(dir, ["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
  return {
    dir,
    ca: { cert: `${dir}/ca.crt`, key: `${dir}/ca.key` },
    serving,
    admin,
    controllerManager,
    scheduler,
    kubeProxy,
    serviceAccount: { key: `${dir}/sa.key`, pub: `${dir}/sa.pub` },
  };
}
