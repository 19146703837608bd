"""The deployment examples checked without a cluster (tests/run calls this).

1. Every manifest in examples/kubernetes/ against the Kubernetes API's own schemas
   (kubernetes-validate, strict: unknown fields are errors), and the KEDA ScaledObject's
   shape; the kustomization lists every file and only files that exist.
2. What the manifests say of each other holds: the Deployment's ConfigMap, Secrets and keys
   exist, every Service's target port is a named container port, the PodDisruptionBudget and
   the Services select the gateway's pods, the ScaledObject scales the StatefulSet that
   exists, its query reads a metric the gateway exports, and the probes ask paths the gateway
   answers.
3. The ConfigMap's gateway.toml passes `ringmaster check-config` (the TLS files it names
   replaced by certificates of a CA made here), as the pods would start it.
4. Nothing that carries a token or the fleet's state crosses the cluster's network in clear
   text, and Redis is fenced: the gateway reaches Redis over rediss:// (trusting a CA, with a
   client certificate where Redis asks for one), Redis serves no plain port, the admin
   listener has a certificate (its probes and Prometheus's scrape then speak HTTPS), every
   certificate and key is a file of a mounted Secret, and the NetworkPolicies that select
   Redis's pods let in the gateway's pods and nothing else. These checks are then run against
   copies of the manifests each broken in one of those ways, and must fail on every one: a
   check that cannot fail would pass a cluster that sends the admin token in clear text.
5. Where redis-server is installed (tests/run requires it), the two run together as the pods
   would: Redis with its Deployment's own arguments, the gateway with the ConfigMap's
   configuration (their Secrets' files replaced by certificates of the CA made in 3, the
   addresses by free ports on loopback); the gateway must join Redis over rediss:// with its
   client certificate and answer GET /admin/cluster over HTTPS, naming itself, and Redis must
   refuse a TLS client without a certificate.

    python tests/deploy/check.py RINGMASTER_BINARY
"""

import copy
import json
import os
import pathlib
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
import urllib.request

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "examples" / "kubernetes"
KUBERNETES = "1.33.0"


def documents():
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def check_scaled_object(doc, fail):
    spec = doc.get("spec", {})
    if doc.get("apiVersion") != "keda.sh/v1alpha1":
        fail(f"ScaledObject apiVersion {doc.get('apiVersion')!r} is not keda.sh/v1alpha1")
    known = {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "cooldownPeriod",
             "pollingInterval", "triggers", "advanced", "fallback", "idleReplicaCount"}
    for key in spec:
        if key not in known:
            fail(f"ScaledObject: unknown spec field {key!r}")
    target = spec.get("scaleTargetRef", {})
    if not target.get("name"):
        fail("ScaledObject: scaleTargetRef.name is required")
    if not spec.get("triggers"):
        fail("ScaledObject: at least one trigger")
    for trigger in spec.get("triggers", []):
        metadata = trigger.get("metadata", {})
        if trigger.get("type") == "prometheus":
            for key in ("serverAddress", "query", "threshold"):
                if key not in metadata:
                    fail(f"ScaledObject: the prometheus trigger needs {key}")
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        fail("ScaledObject: minReplicaCount above maxReplicaCount")


def by_kind_of(docs):
    by_kind = {}
    for _, doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return by_kind


def selector_matches(selector, labels):
    """Whether a LabelSelector selects a pod with `labels` (an empty selector selects all)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if (op == "In" and labels.get(key) not in values) \
                or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) \
                or (op == "DoesNotExist" and key in labels):
            return False
    return True


def workloads(by_kind):
    """Every pod template: (kind/name, the template)."""
    for kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        for name, doc in by_kind.get(kind, {}).items():
            yield f"{kind} {name}", doc["spec"]["template"]


def secret_files(template, by_kind):
    """The files of the Secrets a pod template mounts: {path: (Secret, key)}."""
    volumes = {v["name"]: v["secret"]["secretName"]
               for v in template["spec"].get("volumes", []) if "secret" in v}
    files = {}
    for container in template["spec"]["containers"]:
        for mount in container.get("volumeMounts", []):
            secret = volumes.get(mount["name"])
            if secret is None:
                continue
            doc = by_kind.get("Secret", {}).get(secret, {})
            for key in (doc.get("stringData") or {}) | (doc.get("data") or {}):
                files[f"{mount['mountPath'].rstrip('/')}/{key}"] = (secret, key)
    return files


def flags(args):
    """`--name value` pairs of a command line."""
    return {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}


def check_transport(docs):
    """4. Returns what crosses the cluster's network in clear text, or reaches Redis that
    should not (see the module's documentation)."""
    failures = []
    fail = failures.append
    by_kind = by_kind_of(docs)
    gateway = by_kind["Deployment"]["ringmaster"]["spec"]["template"]
    labels = gateway["metadata"]["labels"]
    container = gateway["spec"]["containers"][0]
    config = tomllib.loads(by_kind["ConfigMap"]["ringmaster-config"]["data"]["gateway.toml"])
    mounted = secret_files(gateway, by_kind)

    def from_secret(key, path):
        if path not in mounted:
            fail(f"{key} = {path!r} is not a file of a Secret the gateway mounts")

    # Redis: the URL the pods use (--cluster or RINGMASTER_CLUSTER override [cluster] url).
    cluster = config.get("cluster", {})
    url = cluster.get("url")
    for env in container.get("env", []):
        if env["name"] == "RINGMASTER_CLUSTER":
            url = env.get("value", url)
    url = flags(container.get("args", [])).get("--cluster", url)
    if not url:
        fail("the gateway joins no Redis: [cluster] url, RINGMASTER_CLUSTER or --cluster")
        url = ""
    elif not url.startswith("rediss://"):
        fail(f"the gateway reaches Redis over {url.split('//')[0]}// ({url}): in clear text, "
             "although rediss:// exists")
    for key in ("ca_file", "client_cert", "client_key"):
        if key in cluster:
            from_secret(f"cluster.{key}", cluster[key])
    if "ca_file" not in cluster:
        fail("[cluster] names no ca_file: Redis's certificate is of the example's own CA, "
             "not of the system's roots")
    host = urllib.parse.urlsplit(url.replace("rediss://", "redis://", 1))
    service = by_kind.get("Service", {}).get((host.hostname or "").split(".")[0])
    redis = None
    if service is None:
        fail(f"no Service {host.hostname!r} for the Redis URL {url!r}")
    else:
        port = next((p for p in service["spec"]["ports"] if p["port"] == (host.port or 6379)), None)
        redis = [(name, t) for name, t in workloads(by_kind)
                 if selector_matches({"matchLabels": service["spec"]["selector"]},
                                     t["metadata"]["labels"])]
        if not redis or port is None:
            fail(f"Service {service['metadata']['name']} selects no Redis pods on port {host.port}")
            redis = None
        else:
            workload, template = redis[0]
            redis_container = template["spec"]["containers"][0]
            target = port.get("targetPort", port["port"])
            target = next((p["containerPort"] for p in redis_container.get("ports", [])
                           if target in (p.get("name"), p["containerPort"])), target)
            args = flags(redis_container.get("args", []))
            if args.get("--port") != "0":
                fail(f"{workload} serves a plain port ({args.get('--port', '6379 by default')}): "
                     "--port 0 leaves TLS only")
            if args.get("--tls-port") != str(target):
                fail(f"{workload} serves no TLS on the port its Service targets ({target}): "
                     f"--tls-port {args.get('--tls-port')}")
            redis_files = secret_files(template, by_kind)
            for flag in ("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"):
                if args.get(flag) not in redis_files:
                    fail(f"{workload}'s {flag} {args.get(flag)!r} is not a file of a Secret it mounts")
            if "--tls-port" not in args:
                pass  # no TLS at all: said above
            elif args.get("--tls-auth-clients", "yes") != "yes":
                fail(f"{workload} lets in clients without a certificate: --tls-auth-clients "
                     f"{args['--tls-auth-clients']}")
            elif not ("client_cert" in cluster and "client_key" in cluster):
                fail("Redis asks for a client certificate (tls-auth-clients yes) and [cluster] "
                     "names none (client_cert, client_key)")

    # The admin API: on its own listener with a certificate, or on the public TLS one.
    admin = config.get("admin", {})
    if admin.get("listen"):
        if not (admin.get("cert") and admin.get("key")):
            fail(f"the admin listener ({admin['listen']}) has no certificate (admin.cert, "
                 "admin.key): the admin token travels in clear text")
        for key in ("cert", "key", "client_ca"):
            if key in admin:
                from_secret(f"admin.{key}", admin[key])
        scheme = "HTTPS" if admin.get("cert") else "HTTP"
        admin_port = next((p["name"] for p in container["ports"]
                           if p["containerPort"] == int(admin["listen"].rsplit(":", 1)[1])), None)
        for probe in ("readinessProbe", "livenessProbe"):
            got = container.get(probe, {}).get("httpGet", {})
            if got.get("port") == admin_port and got.get("scheme", "HTTP") != scheme:
                fail(f"{probe} asks the admin port over {got.get('scheme', 'HTTP')}, which serves {scheme}")
        annotations = gateway["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scheme", "http").upper() != scheme:
            fail(f"Prometheus scrapes the admin port over {annotations.get('prometheus.io/scheme', 'http')}, "
                 f"which serves {scheme}")
    elif "tls" not in config:
        fail("the admin API is on the public listener, which has no [tls]")
    for key in ("cert", "key", "client_ca"):
        if key in config.get("tls", {}):
            from_secret(f"tls.{key}", config["tls"][key])

    # Who may reach Redis: every NetworkPolicy selecting its pods (they add up) lets in the
    # gateway's pods and nothing else, and at least one restricts ingress.
    if redis:
        workload, template = redis[0]
        redis_labels = template["metadata"]["labels"]
        others = [(name, t["metadata"]["labels"]) for name, t in workloads(by_kind)
                  if t["metadata"]["labels"] != labels]
        policies = [doc for doc in by_kind.get("NetworkPolicy", {}).values()
                    if selector_matches(doc["spec"].get("podSelector"), redis_labels)]
        restricting = [doc for doc in policies
                       if "Ingress" in doc["spec"].get("policyTypes", ["Ingress"])]
        if not restricting:
            fail(f"no NetworkPolicy restricts ingress to Redis's pods ({workload}): any pod "
                 "in the cluster can reach it")
        for doc in restricting:
            name = doc["metadata"]["name"]
            for rule in doc["spec"].get("ingress", []):
                peers = rule.get("from") or []
                if not peers:
                    fail(f"NetworkPolicy {name} has a rule with no `from`: it lets in every source")
                for peer in peers:
                    if set(peer) != {"podSelector"}:
                        fail(f"NetworkPolicy {name} lets in {sorted(set(peer) - {'podSelector'})}: "
                             "only the gateway's pods may reach Redis")
                        continue
                    selector = peer["podSelector"]
                    if not selector_matches(selector, labels):
                        fail(f"NetworkPolicy {name} does not let the gateway's pods in")
                    wider = [other for other, other_labels in others
                             if selector_matches(selector, other_labels)]
                    if not (selector.get("matchLabels") or selector.get("matchExpressions")) or wider:
                        fail(f"NetworkPolicy {name} lets in pods other than the gateway's: "
                             f"{wider or 'every pod of the namespace'}")
    return failures


def set_toml(docs, change):
    for _, doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["data"]["gateway.toml"] = change(doc["data"]["gateway.toml"])


def redis_args(docs, change):
    for _, doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "ringmaster-redis":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            container["args"] = change(container["args"])


def network_policies(docs, change):
    for _, doc in docs:
        if doc["kind"] == "NetworkPolicy":
            change(doc)


def gateway_env(docs, env):
    for _, doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "ringmaster":
            doc["spec"]["template"]["spec"]["containers"][0].setdefault("env", []).append(env)


# Each breaks one rule of check_transport on a copy of the manifests; each must be caught.
BROKEN = {
    "Redis reached over plain redis://":
        lambda docs: set_toml(docs, lambda t: t.replace("rediss://", "redis://")),
    "RINGMASTER_CLUSTER overriding with a plain redis:// URL":
        lambda docs: gateway_env(docs, {"name": "RINGMASTER_CLUSTER",
                                        "value": "redis://ringmaster-redis:6379/0"}),
    "Redis serving a plain port beside TLS":
        lambda docs: redis_args(docs, lambda a: [x for x in a if x not in ("--port", "0")]),
    "Redis letting in clients without a certificate":
        lambda docs: redis_args(docs, lambda a: a + ["--tls-auth-clients", "no"]),
    "the gateway presenting no client certificate":
        lambda docs: set_toml(docs, lambda t: re.sub(r"\n *client_(cert|key) = [^\n]*", "", t)),
    "the admin listener without a certificate":
        lambda docs: set_toml(docs, lambda t: re.sub(r"\n *(cert|key) = \"/etc/ringmaster/admin-tls/[^\n]*", "", t)),
    "the admin certificate from a path no Secret is mounted at":
        lambda docs: set_toml(docs, lambda t: t.replace("/etc/ringmaster/admin-tls/", "/etc/ringmaster/admin/")),
    "no NetworkPolicy":
        lambda docs: docs.__setitem__(slice(None), [d for d in docs if d[1]["kind"] != "NetworkPolicy"]),
    "a NetworkPolicy for egress only":
        lambda docs: network_policies(docs, lambda d: d["spec"].__setitem__("policyTypes", ["Egress"])),
    "a NetworkPolicy letting in every pod of the namespace":
        lambda docs: network_policies(docs, lambda d: d["spec"]["ingress"][0]["from"][0].__setitem__("podSelector", {})),
    "a NetworkPolicy letting in the model servers":
        lambda docs: network_policies(docs, lambda d: d["spec"]["ingress"][0]["from"].append(
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vllm"}}})),
    "a NetworkPolicy letting in another namespace":
        lambda docs: network_policies(docs, lambda d: d["spec"]["ingress"][0]["from"][0].__setitem__("namespaceSelector", {})),
    "a second NetworkPolicy letting everything in":
        lambda docs: docs.append(("extra.yaml", {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "allow-all"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}})),
}


def make_pki(tmp, directories):
    """A CA, and in each of `directories` a leaf it signed (tls.crt, tls.key) beside ca.crt,
    made as docs/deploying.md ("Kubernetes") makes them: a leaf that is no CA (rustls refuses
    a CA as an end entity), named by a subjectAltName, for servers and clients."""
    def openssl(*args):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", tmp / "ca.key", "-out", tmp / "ca.crt", "-days", "1", "-subj", "/CN=check CA")
    (tmp / "leaf.ext").write_text("subjectAltName=DNS:ringmaster,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
                          "extendedKeyUsage=serverAuth,clientAuth\n")
    for directory in directories:
        make_leaf(tmp, directory)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_together(binary, by_kind, tmp, fail):
    """5. Redis and the gateway started as their pods would (see the module's documentation),
    with the certificates `make_pki` made under `tmp` (one directory per /etc/ringmaster/
    folder); says what failed through `fail`."""
    redis_doc = by_kind["Deployment"]["ringmaster-redis"]["spec"]["template"]
    redis_container = redis_doc["spec"]["containers"][0]
    redis_port, listen, admin_listen = free_port(), free_port(), free_port()
    # Redis's Secret: a leaf of its own, and the CA (whose client certificates it lets in).
    redis_tls = tmp / "redis-server"
    make_leaf(tmp, redis_tls)
    secret_mounts = {path.rsplit("/", 1)[0] for path in secret_files(redis_doc, by_kind)}
    args = []
    for arg in redis_container["args"]:
        folder = arg.rsplit("/", 1)[0]
        args.append(str(redis_tls / arg.rsplit("/", 1)[1]) if folder in secret_mounts else arg)
    args[args.index("--tls-port") + 1] = str(redis_port)
    (tmp / "redis-data").mkdir()
    args += ["--bind", "127.0.0.1", "--dir", str(tmp / "redis-data"), "--save", ""]
    toml = by_kind["ConfigMap"]["ringmaster-config"]["data"]["gateway.toml"]
    toml = toml.replace("/etc/ringmaster/", f"{tmp}/").replace("/var/cache/ringmaster/", f"{tmp}/cache/")
    config = tomllib.loads(toml)
    url = urllib.parse.urlsplit(config["cluster"]["url"])
    toml = (toml.replace(config["listen"], f"127.0.0.1:{listen}")
                .replace(config["admin"]["listen"], f"127.0.0.1:{admin_listen}")
                .replace(url.netloc, f"localhost:{redis_port}"))
    (tmp / "live.toml").write_text(toml)
    token = "check-py-admin-token-0123456789abcdef"
    env = os.environ | {"RINGMASTER_ADMIN_TOKEN": token, "RINGMASTER_REPLICA": "check-0",
                        "RUST_LOG": "warn", "RUST_BACKTRACE": "0"}
    env.pop("RINGMASTER_CLUSTER", None)
    redis = subprocess.Popen(["redis-server", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    gateway = None
    try:
        for _ in range(100):
            if redis.poll() is not None or socket.socket().connect_ex(("127.0.0.1", redis_port)) == 0:
                break
            time.sleep(0.05)
        if redis.poll() is not None:
            fail(f"Redis does not start with its Deployment's arguments: {redis.stdout.read()[-600:]}")
            return
        # A TLS client without a certificate: Redis must refuse it.
        context = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        try:
            with socket.create_connection(("127.0.0.1", redis_port), timeout=5) as raw, \
                    context.wrap_socket(raw, server_hostname="localhost") as conn:
                conn.sendall(b"PING\r\n")
                answer = conn.recv(64)
            if answer.startswith(b"+PONG"):
                fail("Redis answers a TLS client without a certificate")
        except (ssl.SSLError, OSError):
            pass
        gateway = subprocess.Popen([binary, "serve", "-c", str(tmp / "live.toml")], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        context = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        request = urllib.request.Request(f"https://localhost:{admin_listen}/admin/cluster",
                                         headers={"authorization": f"Bearer {token}"})
        answer, error = None, None
        for _ in range(200):
            if gateway.poll() is not None:
                break
            try:
                with urllib.request.urlopen(request, context=context, timeout=5) as response:
                    answer = json.load(response)
                if answer.get("replicas"):
                    break
            except OSError as e:
                error = e
            time.sleep(0.1)
        if gateway.poll() is not None:
            fail(f"the gateway does not start with the ConfigMap's configuration: {gateway.stdout.read()[-1500:]}")
        elif not answer or not any(r.get("replica") == "check-0" for r in answer.get("replicas", [])):
            fail(f"the gateway's admin API over HTTPS does not show it joined Redis: {answer or error}")
    finally:
        for process in (gateway, redis):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()


def make_leaf(ca, target):
    """In `target`, a leaf signed by the CA `make_pki` made in `ca` (tls.crt, tls.key), beside
    that CA (ca.crt)."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", target / "tls.key", "-out", target / "tls.csr",
                    "-subj", "/CN=ringmaster"], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", target / "tls.csr", "-CA", ca / "ca.crt",
                    "-CAkey", ca / "ca.key", "-CAcreateserial", "-out", target / "tls.crt",
                    "-days", "1", "-extfile", ca / "leaf.ext"], check=True, capture_output=True)
    shutil.copy(ca / "ca.crt", target / "ca.crt")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/debug/ringmaster")
    failures = []
    fail = failures.append
    docs = list(documents())

    # 1. The schemas.
    for name, doc in docs:
        if doc.get("kind") == "ScaledObject":
            check_scaled_object(doc, fail)
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as e:
            fail(f"{name}: {doc.get('kind')} {doc['metadata'].get('name')}: {e.message} at {list(e.path)}")
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    if set(listed) != files:
        fail(f"kustomization.yaml lists {sorted(listed)}, the folder has {sorted(files)}")

    # 2. The manifests agree with each other.
    by_kind = by_kind_of(docs)
    gateway = by_kind["Deployment"]["ringmaster"]
    pod = gateway["spec"]["template"]
    labels = pod["metadata"]["labels"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"] for p in container["ports"]}
    for volume in pod["spec"]["volumes"]:
        if "configMap" in volume and volume["configMap"]["name"] not in by_kind.get("ConfigMap", {}):
            fail(f"the gateway mounts ConfigMap {volume['configMap']['name']}, which is not defined")
        if "secret" in volume and volume["secret"]["secretName"] not in by_kind.get("Secret", {}):
            fail(f"the gateway mounts Secret {volume['secret']['secretName']}, which is not defined")
    for env in container.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            secret = by_kind.get("Secret", {}).get(ref["name"])
            if secret is None or ref["key"] not in secret.get("stringData", {}) | secret.get("data", {}):
                fail(f"env {env['name']} reads {ref['name']}/{ref['key']}, which is not defined")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        got = container[probe]["httpGet"]
        if got["path"] != path or got["port"] not in ports:
            fail(f"{probe} asks {got['path']} on {got['port']}; the gateway answers {path} on {sorted(ports)}")
    for name, service in by_kind.get("Service", {}).items():
        if service["spec"]["selector"] == labels:
            for port in service["spec"]["ports"]:
                if port["targetPort"] not in ports:
                    fail(f"Service {name} targets port {port['targetPort']}, not a gateway container port")
    pdb = by_kind["PodDisruptionBudget"]["ringmaster"]
    if pdb["spec"]["selector"]["matchLabels"] != labels:
        fail("the PodDisruptionBudget does not select the gateway's pods")
    if pdb["spec"]["minAvailable"] >= gateway["spec"]["replicas"]:
        fail("the PodDisruptionBudget allows no voluntary disruption")
    scaled = by_kind["ScaledObject"]["vllm"]
    target = scaled["spec"]["scaleTargetRef"]
    if target["name"] not in by_kind.get(target.get("kind", "Deployment"), {}):
        fail(f"the ScaledObject scales {target.get('kind')} {target['name']}, which is not defined")
    collectors = (ROOT / "host/gateway/src/collectors.rs").read_text()
    for trigger in scaled["spec"]["triggers"]:
        for metric in re.findall(r"ringmaster_([a-z_]+)", trigger["metadata"]["query"]):
            if f'"{metric}"' not in collectors:
                fail(f"the ScaledObject's query reads ringmaster_{metric}, which the gateway does not export")
    grace = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    # 4. Nothing in clear text, Redis fenced; and each of those checks can fail.
    for failure in check_transport(docs):
        fail(failure)
    for broken, mutate in BROKEN.items():
        mutated = copy.deepcopy(docs)
        mutate(mutated)
        if not check_transport(mutated):
            fail(f"the transport checks pass manifests with {broken}")

    # 3. The ConfigMap's configuration, as a pod would start it.
    toml = by_kind["ConfigMap"]["ringmaster-config"]["data"]["gateway.toml"]
    match = re.search(r"shutdown_grace_seconds\s*=\s*(\d+)", toml)
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    if match and int(match.group(1)) + pre_stop > grace:
        fail(f"shutdown_grace_seconds {match.group(1)} + preStop {pre_stop} s exceed terminationGracePeriodSeconds {grace}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # Every directory under /etc/ringmaster/ the configuration names a file of.
        mounts = sorted({m.group(1) for m in re.finditer(r'"/etc/ringmaster/([^/"]+)/[^"]*"', toml)})
        make_pki(tmp, [tmp / mount for mount in mounts])
        config = tmp / "gateway.toml"
        config.write_text(toml.replace("/etc/ringmaster/", f"{tmp}/"))
        checked = subprocess.run([binary, "check-config", str(config)], capture_output=True, text=True)
        if checked.returncode != 0:
            fail(f"the ConfigMap's gateway.toml fails check-config: {checked.stderr.strip()}")
        else:
            for line in ("listen", "admin at"):
                shown = next((l for l in checked.stdout.splitlines() if l.strip().startswith(line)), "")
                if "(TLS" not in shown:
                    fail(f"check-config does not show the {line} listener over TLS: {checked.stdout}")
        # 5. Run together, once everything above holds.
        live = shutil.which("redis-server") is not None and not failures
        if live:
            run_together(binary, by_kind, tmp, fail)

    if failures:
        for failure in failures:
            print("FAIL", failure)
        sys.exit(1)
    kinds = sorted({doc["kind"] for _, doc in docs})
    print(f"ok: {len(docs)} manifests ({', '.join(kinds)}) valid against Kubernetes {KUBERNETES} "
          "(strict) and each other; the ConfigMap's configuration passes check-config; Redis over "
          "rediss:// with a client certificate behind a NetworkPolicy, the admin API over TLS "
          f"(and {len(BROKEN)} broken copies caught)" + (
              "; run together, the gateway joined Redis over TLS and answered its admin API over HTTPS"
              if live else "; NOT run together here: redis-server is not installed"))


if __name__ == "__main__":
    main()
