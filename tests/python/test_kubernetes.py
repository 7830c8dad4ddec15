"""examples/kubernetes/: the offloader fleet's manifests, checked statically.

Each manifest is validated against the Kubernetes API's schemas
(kubernetes-validate, strict: unknown fields are errors), and the pieces
must fit together: the headless Service and the PodDisruptionBudget select
the Deployment's pods, the Service's port is the container's, the Secret the
pods mount is the one shipped. No cluster runs here; the one part that runs
is the offloader container's start command, with its two paths moved to
temporary folders, which must start a daemon from a Secret-like token file
(group-readable, as a Secret with fsGroup mounts it) and serve its metrics.
The ways to size the fleet are checked in test_kubernetes_autoscale.py.
"""

from __future__ import annotations

import copy
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate")

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
VERSION = "1.30.0"  # a version clusters run today; the schema ships with kubernetes-validate


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((FOLDER / name).read_text()) if d]


def _load(name: str) -> dict:
    (doc,) = docs(name)
    return doc


MANIFESTS = ["offloader-deployment.yaml", "offloader-service.yaml", "offloader-pdb.yaml", "token-secret.yaml",
             "trainer-job.yaml", "trainer-rbac.yaml", "autoscale-hpa/hpa.yaml"]
# YAML that is no object of the API's own: kustomize's files, KEDA's ScaledObject (a custom resource,
# checked in test_kubernetes_autoscale.py), the Prometheus adapter's configuration.
NOT_API_OBJECTS = ["kustomization.yaml", "autoscale-hpa/kustomization.yaml", "autoscale-keda/kustomization.yaml",
                   "autoscale-keda/scaledobject.yaml", "autoscale-hpa/adapter-rules.yaml"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_each_manifest_is_valid_against_the_api_schema(name):
    for doc in docs(name):
        kv.validate(doc, VERSION, strict=True)


def test_every_file_is_checked():
    found = sorted(str(p.relative_to(FOLDER)) for p in FOLDER.rglob("*") if p.is_file())
    assert found == sorted(MANIFESTS + NOT_API_OBJECTS)


def test_the_validator_catches_what_it_should():
    """The check above can fail: a misspelt field and a wrong type are errors."""
    deployment = _load("offloader-deployment.yaml")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["replica"] = misspelt["spec"].pop("replicas")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "seven thousand"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kv.ValidationError):
            kv.validate(bad, VERSION, strict=True)


def test_the_pieces_fit_together():
    deployment, service = _load("offloader-deployment.yaml"), _load("offloader-service.yaml")
    pdb, secret, job = _load("offloader-pdb.yaml"), _load("token-secret.yaml"), _load("trainer-job.yaml")
    pods = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pods.items()
    assert service["spec"]["selector"].items() <= pods.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods.items()
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS record per ready pod
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port = next(p for p in container["ports"] if p["name"] == "offload")
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"] and service_port["port"] == port["containerPort"]
    assert f"0.0.0.0:{port['containerPort']}" in container["args"][0]
    for pod in (deployment["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
        assert secrets == [secret["metadata"]["name"]]
    # The trainers name the Service and its port, and read the token where the Secret is mounted.
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--offloaders-dns") + 1] == f"{service['metadata']['name']}:{service_port['port']}"
    mount = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
    assert command[command.index("--token-file") + 1] == f"{mount}/{next(iter(secret['stringData']))}"
    for kustomization in ("kustomization.yaml", "autoscale-hpa/kustomization.yaml",
                          "autoscale-keda/kustomization.yaml"):
        folder = (FOLDER / kustomization).parent
        listed = _load(kustomization)["resources"]
        assert all((folder / f).is_file() for f in listed) and "token-secret.yaml" not in listed


def _daemon() -> Path:
    exe = Path(sys.executable).parent / "dlop-offloader"
    if not os.access(exe, os.X_OK):
        pytest.skip("dlop-offloader is not built (make build)")
    return exe


def test_the_shipped_secrets_placeholder_is_refused_as_a_token(tmp_path):
    """Applied by mistake, the example Secret must not give a fleet a token everyone knows."""
    token = tmp_path / "token"
    token.write_text(_load("token-secret.yaml")["stringData"]["token"])
    token.chmod(0o600)
    done = subprocess.run([str(_daemon()), "--listen", "127.0.0.1:0", "--token-file", str(token)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "a token needs at least" in done.stderr


def test_the_offloader_container_command_starts_a_daemon_from_a_mounted_secret(tmp_path):
    exe = _daemon()
    deployment = _load("offloader-deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    secret_dir, run_dir = tmp_path / "secret", tmp_path / "run"
    secret_dir.mkdir()
    run_dir.mkdir()
    (secret_dir / "token").write_text("0123456789abcdef" * 4)
    mode = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v)["secret"]["defaultMode"]
    (secret_dir / "token").chmod(mode)  # as the kubelet writes it: group-readable
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = (container["args"][0].replace(mounts["secret"], str(secret_dir)).replace(mounts["run"], str(run_dir))
              .replace("0.0.0.0:7001", f"127.0.0.1:{port}").replace("--metrics-port 9400", "--metrics-port 0"))
    assert str(secret_dir) in script and str(run_dir) in script
    env = {**os.environ, "PATH": f"{exe.parent}{os.pathsep}{os.environ['PATH']}", "THREADS": "1"}
    proc = subprocess.Popen(container["command"] + [script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        ready = re.match(rf"dlop-offloader \(metrics on (127\.0\.0\.1:\d+)\) listening on 127\.0\.0\.1:{port}$",
                         line.strip())
        assert ready, (line, proc.stderr.read())
        assert (run_dir / "token").stat().st_mode & 0o777 == 0o600
        # What an autoscaler's query reads of the offloaders (autoscale-keda/, autoscale-hpa/).
        with urllib.request.urlopen(f"http://{ready.group(1)}/metrics", timeout=10) as response:
            assert re.search(r"^dlop_offloader_busy_ratio 0(\.0*)?$", response.read().decode(), re.M)
    finally:
        proc.kill()
        proc.wait()
