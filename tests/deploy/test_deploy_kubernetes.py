"""Every Kubernetes manifest against the API's JSON schemas (shipped by kubernetes-validate,
nothing downloaded), plus the cross-references a schema cannot see."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ElementTree

import pytest
import yaml
from deploy_manifests import (
    INFERPATH_IMAGE,
    KUBERNETES_DIR,
    kubernetes_documents,
    pod_specs,
    workload,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")

# The oldest Kubernetes release the manifests target and the newest the package ships.
KUBERNETES_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
DOCUMENTS = [(name, doc) for name, doc in kubernetes_documents() if doc["kind"] != "Kustomization"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    ("file_name", "document"), DOCUMENTS, ids=[f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in DOCUMENTS]
)
def test_manifest_matches_kubernetes_schema_strictly(file_name: str, document: dict, version: str) -> None:
    # strict: unknown fields (typos such as `livenesProbe`) fail too.
    kubernetes_validate.validate(document, version, strict=True)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    broken = copy.deepcopy(workload("Deployment", "inferpath-server"))
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBERNETES_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in KUBERNETES_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_every_object_lives_in_the_inferpath_namespace() -> None:
    for _, document in DOCUMENTS:
        if document["kind"] != "Namespace":
            assert document["metadata"].get("namespace") == "inferpath", document["metadata"]["name"]


def test_secret_references_resolve_to_declared_keys() -> None:
    secrets = {d["metadata"]["name"]: set(d["stringData"]) for _, d in DOCUMENTS if d["kind"] == "Secret"}
    references = 0
    for where, spec in pod_specs():
        for container in spec.get("initContainers", []) + spec["containers"]:
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    references += 1
                    assert ref["key"] in secrets.get(ref["name"], set()), f"{where}: {ref}"
    assert references >= 8
    assert "token" in secrets["inferpath-ingest"]
    assert {"username", "password"} <= secrets["inferpath-clickhouse"]


def _containers(kind: str, name: str) -> dict[str, dict]:
    spec = workload(kind, name)["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _env(container: dict) -> dict[str, dict]:
    return {variable["name"]: variable for variable in container.get("env", [])}


def test_server_role_is_clickhouse_mode_with_token_and_healthz_probes() -> None:
    server = _containers("Deployment", "inferpath-server")["server"]
    assert server["image"] == INFERPATH_IMAGE
    assert server["command"] == ["inferpath", "up", "--no-dashboard"]
    env = _env(server)
    assert env["INFERPATH_STORE"]["value"].startswith("http://clickhouse.")
    assert env["INFERPATH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "inferpath-ingest"
    assert env["INFERPATH_HOST"]["value"] == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"]["path"] == "/healthz"
    hpa = workload("HorizontalPodAutoscaler", "inferpath-server")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "inferpath-server"}
    assert hpa["spec"]["minReplicas"] >= 2


def test_agent_keeps_node_and_pod_identity_from_the_downward_api() -> None:
    daemonset = workload("DaemonSet", "inferpath-agent")
    containers = _containers("DaemonSet", "inferpath-agent")
    agent, dcgm = containers["agent"], containers["dcgm-exporter"]
    assert agent["command"][:3] == ["inferpath", "collect", "--nvml"]
    assert "dcgm=http://127.0.0.1:9400/metrics" in agent["command"]
    env = _env(agent)
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    attributes = dict(item.split("=", 1) for item in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(","))
    assert attributes["host.name"] == attributes["k8s.node.name"] == "$(NODE_NAME)"
    assert attributes["k8s.pod.name"] == "$(POD_NAME)"
    # $(VAR) only expands for variables defined earlier in the list.
    names = [v["name"] for v in agent["env"]]
    assert names.index("NODE_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    dcgm_env = _env(dcgm)
    assert dcgm_env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert dcgm_env["DCGM_EXPORTER_KUBERNETES"]["value"] == "true"
    assert dcgm_env["DCGM_EXPORTER_LISTEN"]["value"].endswith(":9400")
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_dashboard_reads_through_the_server_service() -> None:
    dashboard = _containers("Deployment", "inferpath-dashboard")["dashboard"]
    env = _env(dashboard)
    assert env["INFERPATH_SERVER_URL"]["value"] == "http://inferpath-server.inferpath.svc:4318"
    service = workload("Service", "inferpath-server")
    assert service["spec"]["ports"][0]["port"] == 4318
    assert dashboard["readinessProbe"]["httpGet"]["path"] == "/_stcore/health"


def test_workloads_run_as_non_root() -> None:
    for where, spec in pod_specs():
        if where == "DaemonSet/inferpath-agent":
            continue  # dcgm-exporter needs SYS_ADMIN; the agent container itself is checked below
        context = spec.get("securityContext", {})
        assert context.get("runAsNonRoot") is True, where
        assert context.get("runAsUser", 0) > 0, where
    agent = _containers("DaemonSet", "inferpath-agent")["agent"]["securityContext"]
    assert agent["runAsNonRoot"] is True and agent["allowPrivilegeEscalation"] is False


def _pod_labels() -> list[dict[str, str]]:
    labels = []
    for _, document in DOCUMENTS:
        if document["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            labels.append(document["spec"]["template"]["metadata"]["labels"])
    return labels


def test_network_policies_select_real_pods_and_deny_by_default() -> None:
    policies = [d for _, d in DOCUMENTS if d["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny, "a default-deny ingress policy is missing"
    pods = _pod_labels()

    def selects(selector: dict) -> bool:
        wanted = selector.get("matchLabels", {})
        return any(all(labels.get(k) == v for k, v in wanted.items()) for labels in pods)

    exposed_ports = set()
    for policy in policies:
        if policy in deny:
            continue
        assert selects(policy["spec"]["podSelector"]), policy["metadata"]["name"]
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                if "podSelector" in peer:
                    assert selects(peer["podSelector"]), (policy["metadata"]["name"], peer)
            exposed_ports |= {port["port"] for port in rule["ports"]}
    # Only the server, the dashboard, ClickHouse and Keeper ports; never dcgm-exporter's 9400.
    assert exposed_ports == {4318, 8501, 8123, 9000, 9009, 9181, 9234}


def _config_xml(config_map: str, key: str) -> ElementTree.Element:
    return ElementTree.fromstring(workload("ConfigMap", config_map)["data"][key])


def test_clickhouse_remote_servers_name_every_statefulset_pod() -> None:
    root = _config_xml("clickhouse-config", "cluster.xml")
    configured = [
        [r.findtext("host") for r in shard.findall("replica")]
        for shard in root.find("remote_servers/inferpath").findall("shard")
    ]
    expected = []
    for _, document in DOCUMENTS:
        if (
            document["kind"] == "StatefulSet"
            and document["metadata"]["labels"].get("app.kubernetes.io/name") == "clickhouse"
        ):
            name, service = document["metadata"]["name"], document["spec"]["serviceName"]
            expected.append(
                [f"{name}-{i}.{service}.inferpath.svc.cluster.local" for i in range(document["spec"]["replicas"])]
            )
            shard_env = {
                v["name"]: v.get("value") for v in document["spec"]["template"]["spec"]["containers"][0]["env"]
            }
            assert shard_env["CLICKHOUSE_SHARD"] == name.rsplit("-", 1)[1]
    assert configured == expected and len(expected) >= 2
    assert root.find("macros/replica").get("from_env") == "HOSTNAME"
    keeper = workload("StatefulSet", "clickhouse-keeper")
    keeper_hosts = [n.findtext("host") for n in root.find("zookeeper").findall("node")]
    assert keeper_hosts == [
        f"clickhouse-keeper-{i}.clickhouse-keeper-headless.inferpath.svc.cluster.local"
        for i in range(keeper["spec"]["replicas"])
    ]
    raft = _config_xml("clickhouse-keeper-config", "keeper_config.xml")
    servers = raft.find("keeper_server/raft_configuration").findall("server")
    assert [s.findtext("hostname") for s in servers] == keeper_hosts
    assert [int(s.findtext("id")) for s in servers] == [1, 2, 3]


def test_cluster_user_matches_the_secret_username() -> None:
    users = _config_xml("clickhouse-config", "users.xml")
    secret = workload("Secret", "inferpath-clickhouse")
    assert users.find(f"users/{secret['stringData']['username']}/password") is not None


def test_schema_job_renders_the_cluster_ddl_with_the_storage_generator() -> None:
    containers = _containers("Job", "inferpath-cluster-schema")
    render = containers["render"]["command"]
    assert render[:2] == ["sh", "-c"]
    assert re.match(r"python -m inferpath\.storage\.cluster inferpath \w+ \d+ > /ddl/cluster\.sql$", render[2])
    assert "--queries-file /ddl/cluster.sql" in containers["apply"]["command"][2]
