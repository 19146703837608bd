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
   replaced by a certificate made here), as the pods would start it.

    python tests/deploy/check.py RINGMASTER_BINARY
"""

import pathlib
import re
import subprocess
import sys
import tempfile

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
    by_kind = {}
    for _, doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
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

    # 3. The ConfigMap's configuration, as a pod would start it.
    toml = by_kind["ConfigMap"]["ringmaster-config"]["data"]["gateway.toml"]
    match = re.search(r"shutdown_grace_seconds\s*=\s*(\d+)", toml)
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    if match and int(match.group(1)) + pre_stop > grace:
        fail(f"shutdown_grace_seconds {match.group(1)} + preStop {pre_stop} s exceed terminationGracePeriodSeconds {grace}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", tmp / "tls.key", "-out", tmp / "tls.crt", "-days", "1",
             "-subj", "/CN=ringmaster"],
            check=True, capture_output=True)
        config = tmp / "gateway.toml"
        config.write_text(toml.replace("/etc/ringmaster/tls", str(tmp)))
        checked = subprocess.run([binary, "check-config", str(config)], capture_output=True, text=True)
        if checked.returncode != 0:
            fail(f"the ConfigMap's gateway.toml fails check-config: {checked.stderr.strip()}")
        elif "TLS" not in checked.stdout:
            fail(f"check-config does not show the TLS listener: {checked.stdout}")

    if failures:
        for failure in failures:
            print("FAIL", failure)
        sys.exit(1)
    kinds = sorted({doc["kind"] for _, doc in docs})
    print(f"ok: {len(docs)} manifests ({', '.join(kinds)}) valid against Kubernetes {KUBERNETES} "
          "(strict) and each other; the ConfigMap's configuration passes check-config")


if __name__ == "__main__":
    main()
