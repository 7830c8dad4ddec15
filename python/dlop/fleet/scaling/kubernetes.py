"""The Kubernetes actuator: the fleet is a Deployment, sized through the API's scale subresource.

    actuator = KubernetesActuator.from_text("default/dlop-offloader")
    actuator.scale(6)   # PATCH .../deployments/dlop-offloader/scale {"spec": {"replicas": 6}}

It runs in the trainer's pod, as the pod's ServiceAccount: the API server's
address from KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, the token,
the cluster's CA and the pod's namespace from the files the kubelet mounts
at /var/run/secrets/kubernetes.io/serviceaccount/. Its only requests are GET
and PATCH (a JSON merge patch of ``spec.replicas``) on
``/apis/apps/v1/namespaces/NS/deployments/NAME/scale``, so a Role granting
``get`` and ``patch`` on ``deployments/scale`` of that one Deployment is all
it needs (examples/kubernetes/trainer-rbac.yaml).

New pods join the trainers through the headless Service's DNS records
(``dlop run --offloaders-dns``), never through the actuator. The Deployment
replaces pods that die, and the Role lets the trainer see no pod, so
:meth:`check` has nothing to report.

The standard library only (urllib, ssl): the requests are two, and the
``kubernetes`` client package would be a large dependency for them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dlop.fleet.scaling.actuator import Actuator, ActuatorError

#: Where the kubelet mounts a pod's ServiceAccount credentials.
ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# A namespace is a DNS label (RFC 1123); a Deployment's name a DNS subdomain.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def parse_deployment(text: str, default_namespace: str | None = None) -> tuple[str, str]:
    """(namespace, name) of "NAMESPACE/NAME", or of "NAME" in ``default_namespace``;
    ValueError naming the text and what is wrong with it."""
    namespace, slash, name = text.strip().rpartition("/")
    if not slash:
        namespace = default_namespace or ""
        if not namespace:
            raise ValueError(f"deployment {text!r}: give it as NAMESPACE/NAME")
    if not name or "/" in namespace:
        raise ValueError(f"deployment {text!r} is not NAMESPACE/NAME")
    if len(namespace) > 63 or not _LABEL.fullmatch(namespace):
        raise ValueError(f"deployment {text!r}: namespace {namespace!r} is not a Kubernetes namespace name "
                         "(at most 63 lower-case letters, digits and '-', a letter or digit at each end)")
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        raise ValueError(f"deployment {text!r}: {name!r} is not a Kubernetes object name "
                         "(lower-case letters, digits, '-' and '.', a letter or digit at each end)")
    return namespace, name


class KubernetesActuator(Actuator):
    """Sizes Deployment ``namespace/deployment`` to the controller's target.

    :meth:`size` is the Deployment's ``spec.replicas``: the pods asked for, ready or not.
    ``floor``: replicas it never goes below, and leaves when closed (default 0: at the
    end of the job the fleet is scaled to nothing). ``server``: the API's URL
    (default: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``).
    ``timeout``: seconds each request may take."""

    name = "kubernetes"

    def __init__(self, namespace: str, deployment: str, *, floor: int = 0, server: str | None = None,
                 account_dir: str | os.PathLike = ACCOUNT_DIR, timeout: float = 10.0) -> None:
        parse_deployment(f"{namespace}/{deployment}")
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"floor {floor!r}: a whole number of replicas, not negative")
        self.namespace, self.deployment, self._floor = namespace, deployment, floor
        self.account_dir, self.timeout = Path(account_dir), float(timeout)
        if server is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise ActuatorError("kubernetes: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: "
                                    "--scaler kubernetes runs in a pod of the cluster")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.server = server.rstrip("/")
        self.path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale"

    @classmethod
    def from_text(cls, text: str, **kwargs: Any) -> "KubernetesActuator":
        """From ``--deployment`` text, "NAMESPACE/NAME" (or "NAME": the pod's own namespace)."""
        account = Path(kwargs.get("account_dir", ACCOUNT_DIR))
        try:
            own = (account / "namespace").read_text().strip()
        except OSError:
            own = None
        return cls(*parse_deployment(text, own), **kwargs)

    @property
    def floor(self) -> int:
        return self._floor

    def size(self) -> int:
        return self._request("GET")

    def scale(self, target: int) -> str:
        want = max(int(target), self._floor)
        before = self.size()
        if before == want:
            return f"deployment {self.namespace}/{self.deployment} has {want} replicas"
        return f"deployment {self.namespace}/{self.deployment}: {before} -> {self._set(want)} replicas"

    def close(self) -> None:
        if self.size() > self._floor:
            self._set(self._floor)

    # ------------------------------------------------------------ the API

    def _set(self, replicas: int) -> int:
        return self._request("PATCH", {"spec": {"replicas": replicas}})

    def _context(self, where: str) -> ssl.SSLContext:
        # Made per request, as the token is read: the kubelet rewrites both files when they rotate.
        ca = self.account_dir / "ca.crt"
        try:
            return ssl.create_default_context(cafile=str(ca))
        except (OSError, ssl.SSLError) as e:
            raise ActuatorError(f"{where}: the cluster's CA {ca}: {getattr(e, 'strerror', None) or e}") from None

    def _request(self, verb: str, body: dict | None = None) -> int:
        """The request, and the replicas of the Scale the API answers."""
        where = f"kubernetes: {verb} deployment {self.namespace}/{self.deployment} scale"
        token_file = self.account_dir / "token"
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise ActuatorError(f"{where}: the ServiceAccount token {token_file}: {e.strerror}") from None
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
            data = json.dumps(body).encode()
        request = urllib.request.Request(self.server + self.path, data=data, headers=headers, method=verb)
        # No proxy: the API server is the cluster's own Service, reached directly from every pod.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=self._context(where)))
        try:
            with opener.open(request, timeout=self.timeout) as response:
                answer = response.read()
        except urllib.error.HTTPError as e:
            raise ActuatorError(f"{where}: {e.code} {_status_message(e.read(), e.reason)}") from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise ActuatorError(f"{where}: {self.server} did not answer within {self.timeout:g} s") from None
            if isinstance(reason, ssl.SSLCertVerificationError):
                reason = f"TLS: {reason.reason}: {reason.verify_message}"
            elif isinstance(reason, ssl.SSLError):
                reason = f"TLS: {reason.reason or reason}"
            raise ActuatorError(f"{where}: cannot reach {self.server}: {reason}") from None
        except (TimeoutError, socket.timeout):
            raise ActuatorError(f"{where}: {self.server} did not answer within {self.timeout:g} s") from None
        except OSError as e:
            raise ActuatorError(f"{where}: {self.server}: {e}") from None
        try:
            scale = json.loads(answer)
        except ValueError:
            scale = None
        # autoscaling/v1 Scale leaves spec.replicas out when it is 0 (omitempty).
        is_scale = isinstance(scale, dict) and scale.get("kind") == "Scale" and isinstance(scale.get("spec", {}), dict)
        replicas = scale.get("spec", {}).get("replicas", 0) if is_scale else None
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise ActuatorError(f"{where}: the answer is not a Scale: {answer[:200].decode('utf-8', 'replace')}")
        return replicas


def _status_message(body: bytes, reason: str) -> str:
    """The API's answer: its Status's reason and message, else the HTTP reason and the body's start."""
    try:
        status = json.loads(body)
        return f"{status.get('reason') or reason}: {status['message']}"
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip()[:200]
        return f"{reason}: {text}" if text else str(reason)


__all__ = ["ACCOUNT_DIR", "KubernetesActuator", "parse_deployment"]
