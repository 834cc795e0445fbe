"""The three Kubernetes API calls the scheduler extender's bind makes (no Django; plain HTTPS).

With ``bindVerb`` set, kube-scheduler hands binding to the extender: it must write the pod's GPU choice
and create the pod's ``Binding`` itself. The calls:

* ``GET /api/v1/namespaces/{ns}/pods/{name}`` - the pod (its annotations name the model; bind's
  arguments carry only names and the UID);
* ``PATCH`` the same path (``application/merge-patch+json``) - the GPU annotations a device plugin reads;
* ``POST /api/v1/namespaces/{ns}/pods/{name}/binding`` - a ``v1.Binding`` to the node.

It authenticates with a service-account Bearer token and verifies the server against a CA file.
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["KubeApi", "KubeApiError", "in_cluster_url"]

MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class KubeApiError(RuntimeError):
    """The API server refused a call or could not be reached."""


def in_cluster_url() -> str:
    """The API server a pod reaches (``KUBERNETES_SERVICE_HOST``/``_PORT``), "" outside a cluster."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@dataclass(frozen=True)
class KubeApi:
    base_url: str
    token: str = ""
    ca_file: str = ""
    timeout_s: float = 10.0

    def _path(self, namespace: str, name: str, sub: str = "") -> str:
        q = urllib.parse.quote
        return f"/api/v1/namespaces/{q(namespace, safe='')}/pods/{q(name, safe='')}{sub}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              content_type: str = "application/json") -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url.rstrip("/") + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        context = None
        if self.base_url.startswith("https:"):
            context = ssl.create_default_context(cafile=self.ca_file or None)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=context) as resp:  # noqa: S310 - configured URL
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode(errors="replace")
            raise KubeApiError(f"{method} {path}: the API server answered {exc.code}: {detail[:300]}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise KubeApiError(f"{method} {path}: cannot reach the API server ({exc}).") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise KubeApiError(f"{method} {path}: the API server's answer is too large.")
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            raise KubeApiError(f"{method} {path}: the API server's answer is not JSON.") from None
        if not isinstance(answer, dict):
            raise KubeApiError(f"{method} {path}: the API server's answer is not a JSON object.")
        return answer

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call("GET", self._path(namespace, name))

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._call("PATCH", self._path(namespace, name), {"metadata": {"annotations": annotations}},
                   content_type="application/merge-patch+json")

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        self._call("POST", self._path(namespace, name, "/binding"), {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        })
