"""The deployment files keep the invariants that matter: grace periods longer than the worker's
checkpoint grace, GPUs reserved, no secrets inline, images pinned, every variable documented."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from baton.schemas.settings import BatonSettings
from tests.helpers import REPO

DEPLOY = REPO / "deploy"
SECRET_NAME = re.compile(r"(SECRET|PASSWORD|ACCESS_KEY|TOKEN)", re.I)


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def k8s_docs() -> list[dict]:
    return [doc for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]


def seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", str(text))
    assert match, f"unparsed duration {text!r}"
    return int(match[1]) * (60 if match[2] == "m" else 1)


def interpolated_default(value: str) -> str:
    match = re.fullmatch(r"\$\{\w+:-([^}]*)\}", str(value))
    return match[1] if match else str(value)


def pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def test_compose_worker_has_gpus_a_long_enough_grace_and_shared_memory():
    worker = compose()["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices)
    grace = float(interpolated_default(worker["environment"]["BATON_PREEMPT_GRACE_S"]))
    assert grace == BatonSettings().preempt_grace_s
    assert seconds(worker["stop_grace_period"]) >= grace + 15  # time to exit after the release
    assert worker["shm_size"] and "--gpus" in worker["command"]
    # root, to run each job as a user of its own, with only what that needs, and no way back for the job's user
    assert (worker["user"], worker["cap_drop"]) == ("0", ["ALL"])
    assert worker["cap_add"] == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]
    assert worker["security_opt"] == ["no-new-privileges:true"]


def test_compose_redis_persists_and_the_bucket_is_created():
    services = compose()["services"]
    assert "--appendonly yes" in " ".join(services["redis"]["command"])
    assert "mc mb" in " ".join(services["create-bucket"]["command"])
    assert services["worker"]["depends_on"]["create-bucket"]["condition"] == "service_completed_successfully"
    assert "flower" in services


def test_compose_images_are_pinned_and_secrets_come_from_the_env_file():
    for name, service in compose()["services"].items():
        if "image" in service:
            assert pinned(service["image"]), f"{name}: {service['image']} is not pinned to a tag"
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                assert str(value).startswith("${"), f"{name}.{key}: a secret written inline"


def test_every_variable_the_deployment_reads_is_documented():
    documented = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", (DEPLOY / ".env.example").read_text(), re.M))
    used = set(re.findall(r"\$\{(\w+)", (DEPLOY / "docker-compose.yml").read_text()))
    settings = {f"BATON_{name.upper()}" for name in BatonSettings.model_fields} - {"BATON_REDIS_URL", "BATON_STORAGE_URL"}
    assert used - documented == set()
    assert settings - documented == set()  # the compose file sets the two URLs itself


def test_kubernetes_worker_grace_gpus_probes_and_secrets():
    docs = k8s_docs()
    deployments = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] != "baton-server"]
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert {d["metadata"]["name"] for d in deployments} == {"baton-worker", "baton-worker-multinode"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        grace = float(config["data"]["BATON_PREEMPT_GRACE_S"])
        assert pod["terminationGracePeriodSeconds"] >= grace + 15
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        assert container["readinessProbe"]["exec"]["command"] == ["baton", "health"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/metrics"
        assert pinned(container["image"])
        assert {"secretRef": {"name": "baton-secrets"}} in container["envFrom"]
        assert not [e for e in container.get("env", []) if SECRET_NAME.search(e["name"]) and "value" in e]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        # root in its container, to run each job as a uid of its own, with only what that needs
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}  # (the runtime's filter: no keyrings, no namespaces)
        assert pod["securityContext"]["runAsUser"] == 0 and container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]}}
    assert not any(SECRET_NAME.search(key) for key in config["data"])
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    assert all("REPLACE_ME" in value for data in secrets.values() for value in data.values())  # examples only
    # each names its own Redis user (docs/security.md's ACL lines)
    assert secrets["baton-secrets"]["BATON_REDIS_URL"].startswith("rediss://baton-worker:")
    assert secrets["baton-server-secrets"]["BATON_REDIS_URL"].startswith("rediss://baton-server:")


def test_the_multinode_pool_is_one_pod_a_host_reachable_from_itself_on_its_own_queue():
    docs = k8s_docs()
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("multinode"))
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    command = container["command"]
    queue, per_job = command[command.index("--queues") + 1], int(command[command.index("--gpus-per-job") + 1])
    assert queue != "default" and int(container["resources"]["limits"]["nvidia.com/gpu"]) == per_job
    env = {e["name"]: e for e in container["env"]}
    assert env["BATON_NODE_ADDRESS"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NCCL_SOCKET_IFNAME"]["value"] == env["GLOO_SOCKET_IFNAME"]["value"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"].items() <= labels.items()
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    peers = [rule for rule in policy["spec"]["ingress"] if "from" in rule and "ports" not in rule]
    assert peers and peers[0]["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()  # every port


def test_dockerfile_is_pinned_unprivileged_and_healthchecked():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M)[1]
    assert pinned(base) and "cuda" in base
    assert re.search(r"^USER\s+(?!root)\w+", text, re.M)
    assert 'HEALTHCHECK' in text and '"baton", "health"' in text
    assert re.search(r'^CMD \["baton", "worker"\]', text, re.M) and "PYTHONUNBUFFERED=1" in text


@pytest.mark.skipif(shutil.which("docker") is None or subprocess.run(["docker", "compose", "version"],
                    capture_output=True).returncode != 0, reason="no docker compose client")
def test_docker_compose_accepts_the_file(tmp_path):
    env = tmp_path / ".env"
    env.write_text((DEPLOY / ".env.example").read_text())
    result = subprocess.run(["docker", "compose", "-f", str(DEPLOY / "docker-compose.yml"), "--env-file", str(env), "config"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_scaled_object_scales_the_worker_deployment_on_the_metric_workers_export():
    from baton.workers.tracking import prometheus

    docs = k8s_docs()
    scaled = next(doc for doc in docs if doc["kind"] == "ScaledObject")
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "baton-worker")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    metric = prometheus.QUEUE_JOBS._name  # the gauge the worker that made the scheduler's turn sets
    assert query.count(f"max({metric}{{") == 2 and 'state="waiting"' in query and 'state="running"' in query
    assert float(trigger["metadata"]["threshold"]) >= 1
    # the workers serve their metrics where Prometheus scrapes them
    ports = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert "metrics" in ports
    # a scale-down stops a busy worker now and then: its SIGTERM grace must cover the checkpoint
    assert spec["cooldownPeriod"] >= 60


def test_the_server_is_internal_holds_only_its_own_secret_and_names_the_hosts_it_is_reached_by():
    docs = k8s_docs()
    server = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "baton-server")
    container = server["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:2] == ["baton", "server"] and "--allowed-host" in command  # bound to 0.0.0.0 in its pod only
    assert {"secretRef": {"name": "baton-server-secrets"}} in container["envFrom"] and pinned(container["image"])
    assert {"secretRef": {"name": "baton-secrets"}} not in container["envFrom"]  # not the workers' Redis user
    assert not [e for e in container.get("env", []) if SECRET_NAME.search(e["name"])]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/api/health" and {"name": "Host", "value": "localhost"} in probe["httpHeaders"]
    assert "localhost" in command  # (the probe's Host is one the server allows)
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "baton-server")
    assert service["spec"]["type"] == "ClusterIP"
    compose_server = compose()["services"]["server"]
    assert compose_server["command"][:2] == ["baton", "server"] and "--allowed-host" in compose_server["command"]
    for name in ("server", "flower"):  # published on the host's loopback (a TLS proxy in front to share the server)
        assert all(port.startswith("127.0.0.1:") for port in compose()["services"][name]["ports"]), name


def test_the_grafana_dashboard_queries_only_metrics_the_workers_export():
    import json

    board = json.loads((DEPLOY / "grafana" / "baton-dashboard.json").read_text())
    queried = set(re.findall(r"\b(baton_[a-z_]+)", " ".join(t["expr"] for p in board["panels"] for t in p["targets"])))
    exported = set(re.findall(r'"(baton_[a-z_]+)"', (REPO / "workers" / "tracking" / "prometheus.py").read_text()))
    assert queried and {re.sub(r"_bucket$", "", name) for name in queried} <= exported
