"""A stand-in Kubernetes API server: real HTTP + JSON, enough of the REST API for sdeth.cluster,
so the unchanged `kubernetes` client is exercised. Deployments become ready `ready_after` seconds
after their replicas change, except those named in `never_ready` (their pods stay Pending,
Unschedulable)."""
from __future__ import annotations

import itertools
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

_ROUTES = [  # (regex, plural)
    (r"^/apis/apps/v1/namespaces/([^/]+)/(deployments)(?:/([^/]+))?(/scale)?$", "deployments"),
    (r"^/api/v1/namespaces/([^/]+)/(services)(?:/([^/]+))?()$", "services"),
    (r"^/apis/batch/v1/namespaces/([^/]+)/(jobs)(?:/([^/]+))?()$", "jobs"),
    (r"^/api/v1/namespaces/([^/]+)/(configmaps)(?:/([^/]+))?()$", "configmaps"),
    (r"^/api/v1/namespaces/([^/]+)/(secrets)(?:/([^/]+))?()$", "secrets"),
    (r"^/apis/networking.k8s.io/v1/namespaces/([^/]+)/(networkpolicies)(?:/([^/]+))?()$", "networkpolicies"),
    (r"^/api/v1/namespaces/([^/]+)/(serviceaccounts)(?:/([^/]+))?()$", "serviceaccounts"),
    (r"^/apis/rbac.authorization.k8s.io/v1/namespaces/([^/]+)/(roles)(?:/([^/]+))?()$", "roles"),
    (r"^/apis/rbac.authorization.k8s.io/v1/namespaces/([^/]+)/(rolebindings)(?:/([^/]+))?()$", "rolebindings"),
    (r"^/apis/batch/v1/namespaces/([^/]+)/(cronjobs)(?:/([^/]+))?()$", "cronjobs"),
    (r"^/apis/coordination.k8s.io/v1/namespaces/([^/]+)/(leases)(?:/([^/]+))?()$", "leases"),
]


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message, "code": code}


def _matches(labels: dict, selector: str) -> bool:
    for term in filter(None, (selector or "").split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


class StandIn:
    def __init__(self, ready_after: float = 0.3, never_ready: tuple = (), logs: dict | None = None):
        self.logs = logs or {}        # pod name prefix -> log text
        self.objects: dict[tuple, dict] = {}
        self.changed_at: dict[tuple, float] = {}
        self.ready_after, self.never_ready = ready_after, set(never_ready)
        self.requests: list[tuple[str, str]] = []
        self._rv = itertools.count(1)
        self.lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def _handle(self, method):
                url = urlparse(self.path)
                standin.requests.append((method, url.path))
                with standin.lock:
                    code, body = standin.handle(method, url.path, parse_qs(url.query),
                                                self._body() if method in ("POST", "PUT", "PATCH") else None)
                if isinstance(body, str):
                    data = body.encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self._send(code, body)

            def do_GET(self): self._handle("GET")            # noqa: E704
            def do_POST(self): self._handle("POST")          # noqa: E704
            def do_PUT(self): self._handle("PUT")            # noqa: E704
            def do_PATCH(self): self._handle("PATCH")        # noqa: E704
            def do_DELETE(self): self._handle("DELETE")      # noqa: E704

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()

    def client(self):
        from kubernetes import client
        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    # ------------------------------------------------------------ the API
    def _deployment_view(self, key, obj):
        d = json.loads(json.dumps(obj))
        want = d["spec"].get("replicas", 1)
        ready = want if (key[2] not in self.never_ready and
                         time.time() - self.changed_at.get(key, 0) >= self.ready_after) else 0
        d["status"] = {"replicas": want, "readyReplicas": ready, "availableReplicas": ready, "observedGeneration": 1}
        return d

    def handle(self, method, path, query, body):
        if path == "/api/v1/nodes":
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [
                {"metadata": {"name": n, "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
                 "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}
                for n in ("gpu-node-a", "gpu-node-b")]}
        m = re.match(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/log)?$", path)
        if m:
            return self._pods(m.group(1), m.group(2), query)
        for rx, plural in _ROUTES:
            m = re.match(rx, path)
            if m:
                ns, _, name, scale = m.groups()
                return self._objects(method, plural, ns, name, bool(scale), query, body)
        return 404, _status(404, "NotFound", f"no route {path}")

    def _objects(self, method, plural, ns, name, scale, query, body):
        if name is None:
            if method == "GET":
                sel = query.get("labelSelector", [""])[0]
                items = [self._deployment_view(k, o) if plural == "deployments" else o
                         for k, o in self.objects.items() if k[:2] == (plural, ns)
                         and _matches(o["metadata"].get("labels", {}), sel)]
                return 200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
            if method == "POST":
                key = (plural, ns, body["metadata"]["name"])
                if key in self.objects:
                    return 409, _status(409, "AlreadyExists", f"{plural} {key[2]} already exists")
                body["metadata"].update(namespace=ns, resourceVersion=str(next(self._rv)), uid=f"uid-{key[2]}")
                self.objects[key], self.changed_at[key] = body, time.time()
                return 201, body
        key = (plural, ns, name)
        if key not in self.objects:
            return 404, _status(404, "NotFound", f"{plural} {name} not found")
        obj = self.objects[key]
        if scale:
            if method == "PATCH":
                obj["spec"]["replicas"] = body["spec"]["replicas"]
                self.changed_at[key] = time.time()
            r = obj["spec"].get("replicas", 1)
            return 200, {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name, "namespace": ns},
                         "spec": {"replicas": r}, "status": {"replicas": r}}
        if method == "GET":
            if plural == "jobs":    # a job succeeds once ready_after has passed
                done = time.time() - self.changed_at[key] >= self.ready_after
                return 200, {**obj, "status": {"succeeded": 1} if done else {"active": 1}}
            return 200, self._deployment_view(key, obj) if plural == "deployments" else obj
        if method == "PUT":
            if body["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
                return 409, _status(409, "Conflict", "resourceVersion mismatch")
            body["metadata"]["resourceVersion"] = str(next(self._rv))
            self.objects[key], self.changed_at[key] = body, time.time()
            return 200, body
        if method == "DELETE":      # as the real API: a Service comes back as itself, the rest as a Status
            del self.objects[key]
            if plural == "services":
                return 200, obj
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
        return 405, _status(405, "MethodNotAllowed", method)

    def _pods(self, ns, log_of, query):
        pods = []
        for key, j in list(self.objects.items()):
            if key[:2] == ("jobs", ns):
                pods.append({"metadata": {"name": f"{key[2]}-pod0", "namespace": ns,
                                          "labels": j["spec"]["template"]["metadata"]["labels"]},
                             "status": {"phase": "Succeeded"}})
        for key, d in list(self.objects.items()):
            if key[:2] != ("deployments", ns):
                continue
            view = self._deployment_view(key, d)
            for i in range(view["spec"].get("replicas", 1)):
                ready = view["status"]["readyReplicas"] > i
                pod = {"metadata": {"name": f"{key[2]}-pod{i}", "namespace": ns,
                                    "labels": d["spec"]["template"]["metadata"]["labels"]},
                       "status": {"phase": "Running" if ready else "Pending"}}
                if key[2] in self.never_ready:
                    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                    "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]
                pods.append(pod)
        if log_of:
            return 200, next((t for prefix, t in self.logs.items() if log_of.startswith(prefix)), f"log of {log_of}\n")
        sel = query.get("labelSelector", [""])[0]
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                     "items": [p for p in pods if _matches(p["metadata"]["labels"], sel)]}
