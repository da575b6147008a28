"""deploy/kubernetes, rendered by the real `kubectl kustomize` and checked offline: every document
against the Kubernetes API's JSON schemas (kubernetes-validate, strict: unknown fields are
errors), and what the deployment's safety rests on: only nodes privileged, gateways non-root,
only gateways reaching nodes, the cluster secret a mounted file. No cluster is involved."""

import base64
import copy
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

BASE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The oldest and the newest API versions the validator ships schemas for.
API_VERSIONS = ["1.25", kubernetes_validate.latest_version()]
NODE = {"app.kubernetes.io/name": "airlock", "app.kubernetes.io/component": "node"}
GATEWAY = {"app.kubernetes.io/name": "airlock", "app.kubernetes.io/component": "gateway"}
SECRET_FILE_FLAG = "--cluster-secret-file="


def render(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: scripts/install-test-deps.sh installs it"
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], check=True, capture_output=True, text=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(BASE)


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(docs: list[dict]) -> dict[str, dict]:
    """The pod spec of each workload, by component."""
    return {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"][
            "template"
        ]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
    }


def secret_values(docs: list[dict]) -> dict[str, str]:
    secret = next(d for d in docs if d["kind"] == "Secret")
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_every_document_is_valid_for_the_kubernetes_api(docs):
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "DaemonSet", "Deployment", "Namespace", "NetworkPolicy", "Secret", "Service", "Service",
    ]
    for doc in docs:
        for version in API_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "airlock", doc["metadata"]["name"]


def test_the_validator_rejects_broken_manifests(docs):
    """The positive control: the same validation fails on what a cluster would refuse."""
    gateway = one(docs, "Deployment", "airlock-gateway")
    wrong_type = copy.deepcopy(gateway)
    wrong_type["spec"]["replicas"] = "two"
    unknown_field = copy.deepcopy(gateway)
    unknown_field["spec"]["template"]["spec"]["containers"][0]["privilegd"] = True
    for broken in (wrong_type, unknown_field):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, API_VERSIONS[-1], strict=True)


def test_only_nodes_are_privileged_and_gateways_run_as_non_root(docs):
    pods = workloads(docs)
    assert set(pods) == {"gateway", "node"}
    assert one(docs, "Deployment", "airlock-gateway")["spec"]["replicas"] == 2
    (node,) = pods["node"]["spec"]["containers"]
    assert node["securityContext"]["privileged"] is True
    gateway_pod = pods["gateway"]["spec"]
    assert gateway_pod["securityContext"]["runAsNonRoot"] is True
    assert gateway_pod["securityContext"]["runAsUser"] != 0
    for container in gateway_pod["containers"]:
        context = container["securityContext"]
        assert not context.get("privileged")
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
    for pod in pods.values():
        assert not pod["spec"].get("hostNetwork") and not pod["spec"].get("hostPID")
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_only_gateway_pods_reach_node_pods(docs):
    pods = workloads(docs)
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert selects(spec["podSelector"], pods["node"]["metadata"]["labels"])
    assert not selects(spec["podSelector"], pods["gateway"]["metadata"]["labels"])
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    # One peer, a pod selector alone: no namespaceSelector or ipBlock widening it.
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    assert selects(peer["podSelector"], pods["gateway"]["metadata"]["labels"])
    assert not selects(peer["podSelector"], pods["node"]["metadata"]["labels"])
    assert rule["ports"] == [{"protocol": "TCP", "port": 3000}]


def test_every_container_has_resources_and_probes(docs):
    for component, pod in workloads(docs).items():
        for container in pod["spec"]["containers"]:
            assert container["resources"]["requests"].keys() >= {"cpu", "memory"}, component
            for probe in ("readinessProbe", "livenessProbe"):
                check = container[probe]["httpGet"]
                assert (check["path"], check["port"]) == ("/health", "http"), (component, probe)
    gateway = workloads(docs)["gateway"]["spec"]["containers"][0]
    assert "memory" in gateway["resources"]["limits"]
    # A node's first start builds the built-in templates before it listens.
    node = workloads(docs)["node"]["spec"]["containers"][0]
    assert node["startupProbe"]["httpGet"]["path"] == "/health"


def test_the_cluster_secret_is_a_mounted_file_never_an_argument(docs):
    values = secret_values(docs)
    for component, pod in workloads(docs).items():
        (container,) = pod["spec"]["containers"]
        line = " ".join(container.get("command", []) + container["args"])
        (flag,) = [word for word in line.split() if word.startswith(SECRET_FILE_FLAG)]
        path = flag.removeprefix(SECRET_FILE_FLAG)
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == os.path.dirname(path)]
        assert mount["readOnly"] is True
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
        items = volume["secret"]["items"]
        assert {"key": "AIRLOCK_CLUSTER_SECRET", "path": os.path.basename(path)} in items
        env = [e.get("value", "") for e in container["env"]]
        for value in values.values():
            assert value not in line and value not in env, component
        names = {e["name"] for e in container["env"]}
        assert "AIRLOCK_CLUSTER_SECRET" not in names, component


def test_gateways_find_nodes_through_the_headless_service(docs):
    nodes = one(docs, "Service", "airlock-nodes")
    assert nodes["spec"]["clusterIP"] == "None"
    assert nodes["spec"]["selector"] == NODE
    (port,) = nodes["spec"]["ports"]
    gateway = workloads(docs)["gateway"]["spec"]["containers"][0]
    address = f"airlock-nodes.{nodes['metadata']['namespace']}.svc.cluster.local:{port['port']}"
    assert f"--nodes={address}" in gateway["args"]
    assert "--role=gateway" in gateway["args"]
    api = one(docs, "Service", "airlock")
    assert api["spec"]["type"] == "ClusterIP" and api["spec"]["selector"] == GATEWAY
    assert api["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]


def test_nodes_keep_their_data_and_name_on_their_machine(docs):
    pod = workloads(docs)["node"]["spec"]
    (container,) = pod["containers"]
    assert "--role=node" in container["args"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["AIRLOCK_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    (data,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert data["hostPath"]["path"] == env["AIRLOCK_DATA_DIR"]["value"] == "/var/lib/airlock"


def test_the_placeholders_never_start_and_an_overlay_replaces_them(docs, tmp_path):
    # Shorter than the 32 characters Airlock demands: a deployment of the example fails to start.
    assert len(secret_values(docs)["AIRLOCK_CLUSTER_SECRET"]) < 32
    mine = {
        "AIRLOCK_CLUSTER_SECRET": "0123456789abcdef" * 4,
        "AIRLOCK_DATABASE_URL": "postgres://airlock:pw@db:5432/airlock",
        "AIRLOCK_OBJECT_STORE": "s3://bucket/airlock",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "key",
        "AIRLOCK_DATABASE_CA": "/etc/airlock-database-ca/ca.pem",
    }
    (tmp_path / "secrets.env").write_text("".join(f"{k}={v}\n" for k, v in mine.items()))
    # The overlay README.md shows; `bases:` so that Debian's kubectl 1.20 reads it too.
    (tmp_path / "kustomization.yaml").write_text(
        f"""\
bases:
- {os.path.relpath(BASE, tmp_path)}
images:
- name: airlock
  newName: registry.example.com/airlock
  newTag: "1.2.3"
secretGenerator:
- name: airlock
  behavior: replace
  env: secrets.env
"""
    )
    rendered = render(tmp_path)
    assert secret_values(rendered) == mine
    secret_name = next(d for d in rendered if d["kind"] == "Secret")["metadata"]["name"]
    for pod in workloads(rendered).values():
        (container,) = pod["spec"]["containers"]
        assert container["image"] == "registry.example.com/airlock:1.2.3"
        refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]
                if "secretKeyRef" in e.get("valueFrom", {})]
        refs += [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v]
        assert refs and set(refs) == {secret_name}
        # The ConfigMap the operator may make (README.md) is mounted, if it exists, where
        # AIRLOCK_DATABASE_CA (from the Secret, if set) points.
        (ca,) = [v for v in pod["spec"]["volumes"] if "configMap" in v]
        assert ca["configMap"] == {"name": "airlock-database-ca", "optional": True}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == ca["name"]]
        assert os.path.dirname(mine["AIRLOCK_DATABASE_CA"]) == mount["mountPath"]
        (env,) = [e for e in container["env"] if e["name"] == "AIRLOCK_DATABASE_CA"]
        assert env["valueFrom"]["secretKeyRef"]["optional"] is True
