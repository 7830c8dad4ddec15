"""dlop.fleet.scaling.kubernetes: the actuator's requests, answers and errors, over HTTPS.

It talks to an HTTPS server made here that answers the one resource the
actuator uses, a Deployment's scale subresource, as kube-apiserver answers it:
an autoscaling/v1 Scale (``spec.replicas`` left out at 0), a JSON merge patch
updating it, RBAC as a Role with resourceNames grants it (403 with the API's
Status and message), 401 for an unknown token, 404 for a Deployment that does
not exist, 415 for another patch type. A real API server cannot run here:
neither Debian nor PyPI packages kube-apiserver (and it needs etcd and a
container runtime around it), so the server's answers are checked against the
API's own Scale schema (kubernetes-validate) instead. The TLS is real: a CA
and a certificate for 127.0.0.1 made with openssl, verified by the actuator.
"""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from dlop.fleet.scaling.actuator import ActuatorError
from dlop.fleet.scaling.kubernetes import KubernetesActuator, parse_deployment

NS, NAME = "training", "dlop-offloader"
PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}/scale"
TOKENS = {"token-a": "trainer", "token-b": "trainer", "token-other": "other", "token-reader": "reader"}
# user -> (verbs, resourceNames) on deployments/scale in NS: what each one's Role grants.
GRANTS = {"trainer": ({"get", "patch"}, {NAME, "gone"}), "reader": ({"get"}, {NAME}), "other": (set(), set())}


class ScaleAPI(http.server.BaseHTTPRequestHandler):
    deployments: dict[str, int]  # name in NS -> spec.replicas
    requests: list[tuple[str, str, dict[str, str], object]]

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._answer(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code})

    def _handle(self, verb: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append((self.command, self.path, dict(self.headers), body))
        auth = self.headers.get("Authorization", "")
        user = TOKENS.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
        if user is None:
            return self._status(401, "Unauthorized", "Unauthorized")
        parts = self.path.split("/")  # '', apis, apps, v1, namespaces, NS, deployments, NAME, scale
        if len(parts) != 9 or parts[:5] != ["", "apis", "apps", "v1", "namespaces"] or parts[6::2] != [
                "deployments", "scale"]:
            return self._status(404, "NotFound", "the server could not find the requested resource")
        ns, name = parts[5], parts[7]
        verbs, names = GRANTS[user]
        if ns != NS or verb not in verbs or name not in names:
            return self._status(403, "Forbidden", f'deployments.apps "{name}" is forbidden: User '
                                f'"system:serviceaccount:{NS}:{user}" cannot {verb} resource "deployments/scale" '
                                f'in API group "apps" in the namespace "{ns}"')
        if name not in self.deployments:
            return self._status(404, "NotFound", f'deployments.apps "{name}" not found')
        if verb == "patch":
            if self.headers.get("Content-Type") != "application/merge-patch+json":
                return self._status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
            self.deployments[name] = body["spec"]["replicas"]
        self._answer(200, scale(name, self.deployments[name]))

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._handle("get")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("patch")

    def log_message(self, *args) -> None:
        pass


def scale(name: str, replicas: int) -> dict:
    """A Scale as the API serves it (Go's omitempty drops spec.replicas at 0)."""
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": "1", "uid": "5c4b3a29-0000-4000-8000-1"},
            "spec": {"replicas": replicas} if replicas else {},
            "status": {"replicas": replicas, "selector": "app.kubernetes.io/name=dlop-offloader"}}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(folder: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=folder)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Path:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    _ca(folder, "ca")
    _ca(folder, "other-ca")
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                       "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                       "authorityKeyIdentifier=keyid\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key",
             "-out", "server.csr", "-subj", "/CN=kube-apiserver", cwd=folder)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
             "-extfile", "server.ext", "-out", "server.crt", cwd=folder)
    return folder


@pytest.fixture
def api(certificates):
    handler = type("Handler", (ScaleAPI,), {"deployments": {NAME: 4}, "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates / "server.crt", certificates / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


@pytest.fixture
def pod(tmp_path, certificates, api, monkeypatch) -> Path:
    """The pod's view: the ServiceAccount's files as the kubelet mounts them, the API's address in its environment."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("token-a")
    (account / "namespace").write_text(NS)
    shutil.copy(certificates / "ca.crt", account / "ca.crt")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api[0].server_address[1]))
    return account


def test_the_servers_scale_is_the_apis(api):
    kv = pytest.importorskip("kubernetes_validate")
    for replicas in (0, 4):
        kv.validate(scale(NAME, replicas), "1.30.0", strict=True)


def test_it_reads_and_patches_the_scale_subresource(api, pod):
    server, handler = api
    actuator = KubernetesActuator.from_text(NAME, account_dir=pod)  # the pod's own namespace
    assert (actuator.name, actuator.namespace, actuator.floor) == ("kubernetes", NS, 0)
    assert actuator.size() == 4
    assert actuator.scale(6) == f"deployment {NS}/{NAME}: 4 -> 6 replicas"
    assert actuator.scale(6) == f"deployment {NS}/{NAME} has 6 replicas"
    assert handler.deployments[NAME] == 6
    verbs = [(method, path, headers.get("Content-Type"), body) for method, path, headers, body in handler.requests]
    assert verbs == [("GET", PATH, None, None), ("GET", PATH, None, None),
                     ("PATCH", PATH, "application/merge-patch+json", {"spec": {"replicas": 6}}),
                     ("GET", PATH, None, None)]
    assert {h["Authorization"] for _, _, h, _ in handler.requests} == {"Bearer token-a"}
    assert {h["Accept"] for _, _, h, _ in handler.requests} == {"application/json"}


def test_the_floor_holds_and_closing_goes_back_to_it(api, pod):
    _, handler = api
    actuator = KubernetesActuator(NS, NAME, floor=2, account_dir=pod)
    assert actuator.scale(0) == f"deployment {NS}/{NAME}: 4 -> 2 replicas"
    actuator.scale(5)
    actuator.close()
    assert handler.deployments[NAME] == 2
    actuator = KubernetesActuator(NS, NAME, account_dir=pod)
    actuator.close()
    assert handler.deployments[NAME] == 0 and actuator.size() == 0  # a Scale without spec.replicas


def test_the_token_is_read_again_for_each_request(api, pod):
    _, handler = api
    actuator = KubernetesActuator(NS, NAME, account_dir=pod)
    actuator.size()
    (pod / "token").write_text("token-b\n")  # the kubelet rotated the projected token
    actuator.size()
    assert [h["Authorization"] for _, _, h, _ in handler.requests] == ["Bearer token-a", "Bearer token-b"]


def _error(actuator: KubernetesActuator, call=lambda a: a.size()) -> str:
    with pytest.raises(ActuatorError) as e:
        call(actuator)
    return str(e.value)


def test_the_apis_refusals_are_errors_naming_the_deployment_the_verb_and_the_answer(api, pod):
    _, handler = api
    (pod / "token").write_text("token-other")
    assert _error(KubernetesActuator(NS, NAME, account_dir=pod)) == (
        f'kubernetes: GET deployment {NS}/{NAME} scale: 403 Forbidden: deployments.apps "{NAME}" is forbidden: '
        f'User "system:serviceaccount:{NS}:other" cannot get resource "deployments/scale" in API group "apps" '
        f'in the namespace "{NS}"')
    (pod / "token").write_text("token-reader")  # a Role that grants get only
    assert _error(KubernetesActuator(NS, NAME, account_dir=pod), lambda a: a.scale(7)) == (
        f'kubernetes: PATCH deployment {NS}/{NAME} scale: 403 Forbidden: deployments.apps "{NAME}" is forbidden: '
        f'User "system:serviceaccount:{NS}:reader" cannot patch resource "deployments/scale" in API group "apps" '
        f'in the namespace "{NS}"')
    assert handler.deployments[NAME] == 4
    (pod / "token").write_text("token-expired")
    assert _error(KubernetesActuator(NS, NAME, account_dir=pod)) == (
        f"kubernetes: GET deployment {NS}/{NAME} scale: 401 Unauthorized: Unauthorized")
    (pod / "token").write_text("token-a")
    assert _error(KubernetesActuator(NS, "gone", account_dir=pod)) == (
        f'kubernetes: GET deployment {NS}/gone scale: 404 NotFound: deployments.apps "gone" not found')


def test_an_api_it_cannot_reach_or_trust_is_an_error(api, pod, certificates, monkeypatch):
    port = api[0].server_address[1]
    shutil.copy(certificates / "other-ca.crt", pod / "ca.crt")
    assert _error(KubernetesActuator(NS, NAME, account_dir=pod)) == (
        f"kubernetes: GET deployment {NS}/{NAME} scale: cannot reach https://127.0.0.1:{port}: "
        "TLS: CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate")
    (pod / "ca.crt").unlink()
    assert _error(KubernetesActuator(NS, NAME, account_dir=pod)) == (
        f"kubernetes: GET deployment {NS}/{NAME} scale: the cluster's CA {pod / 'ca.crt'}: No such file or directory")
    shutil.copy(certificates / "ca.crt", pod / "ca.crt")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = closed.getsockname()[1]
    message = _error(KubernetesActuator(NS, NAME, account_dir=pod, server=f"https://127.0.0.1:{refused}"))
    assert message == (f"kubernetes: GET deployment {NS}/{NAME} scale: cannot reach https://127.0.0.1:{refused}: "
                       "[Errno 111] Connection refused")
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        assert _error(KubernetesActuator(NS, NAME, account_dir=pod, server=url, timeout=0.5)) == (
            f"kubernetes: GET deployment {NS}/{NAME} scale: {url} did not answer within 0.5 s")
    (pod / "token").unlink()
    assert _error(KubernetesActuator(NS, NAME, account_dir=pod)) == (
        f"kubernetes: GET deployment {NS}/{NAME} scale: the ServiceAccount token {pod / 'token'}: "
        "No such file or directory")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ActuatorError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"):
        KubernetesActuator(NS, NAME, account_dir=pod)


def test_deployment_text():
    assert parse_deployment("ml/dlop-offloader") == ("ml", "dlop-offloader")
    assert parse_deployment("offloaders.v2", "ml") == ("ml", "offloaders.v2")
    bad = {
        "dlop-offloader": "deployment 'dlop-offloader': give it as NAMESPACE/NAME",
        "ml/": "deployment 'ml/' is not NAMESPACE/NAME",
        "a/b/c": "deployment 'a/b/c' is not NAMESPACE/NAME",
        "ML/x": "deployment 'ML/x': namespace 'ML' is not a Kubernetes namespace name",
        "ml/-x": "deployment 'ml/-x': '-x' is not a Kubernetes object name",
        f"{'n' * 64}/x": f"deployment '{'n' * 64}/x': namespace '{'n' * 64}' is not",
    }
    for text, message in bad.items():
        with pytest.raises(ValueError) as e:
            parse_deployment(text)
        assert str(e.value).startswith(message), (text, str(e.value))
    with pytest.raises(ValueError, match="floor -1"):
        KubernetesActuator("ml", "x", floor=-1, server="https://127.0.0.1:1")
