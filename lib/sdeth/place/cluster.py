"""Cluster control (Kubernetes): render the manifests with parameters, apply, wait, scale to zero.

    objs = render("ethernet", target_node="gpu-node-a", draft_node="gpu-node-b",
                  pair="qwen3-8b/1.7b", image="registry/sdeth-worker:v1")
    with Cluster(namespace="sdeth", context="my-cluster") as c:   # GPU workloads scaled to 0 on exit
        c.apply(objs)
        c.wait_ready(["sdeth-target", "sdeth-draft"], timeout_s=900)
        ...
    python -m sdeth down --namespace sdeth       # anything of ours left running -> 0 replicas

While a Cluster is held it renews a Lease (coordination.k8s.io, LEASE) every LEASE_RENEW_S; the reaper
CronJob in the manifests (`python -m sdeth reap`) scales the GPU Deployments to zero once that Lease is older
than its --stale-minutes, so a controller that dies without cleaning up leaves no GPU busy for long.

Rendering (pure: dicts in, dicts out, kustomize underneath) is place.manifests; its names are re-exported here.
No torch here: this module knows nothing of models beyond their ids.
"""
from __future__ import annotations

import copy
import json
import socket
import subprocess
import time

from .manifests import (K8S_VERSION, KEY_FILES, KEYED, KEYS_SECRET, MANIFESTS, OVERLAYS, TWO_NODES,  # noqa: F401
                        ClusterError, keys_secret, kustomize, node_of, render, validate)
from .testbed import free_port

PART_OF = "app.kubernetes.io/part-of=sdeth"
LEASE = "sdeth-controller"  # renewed while a controller holds the cluster; read by the reaper
LEASE_RENEW_S = 60.0


class WaitTimeout(ClusterError, TimeoutError):
    """A wait ran out: says what it waited for and what it last saw."""


_KINDS = {  # kind -> (api class, method suffix)
    "Deployment": ("AppsV1Api", "namespaced_deployment"),
    "Service": ("CoreV1Api", "namespaced_service"),
    "Secret": ("CoreV1Api", "namespaced_secret"),
    "NetworkPolicy": ("NetworkingV1Api", "namespaced_network_policy"),
    "Job": ("BatchV1Api", "namespaced_job"),
    "ConfigMap": ("CoreV1Api", "namespaced_config_map"),
    "ServiceAccount": ("CoreV1Api", "namespaced_service_account"),
    "Role": ("RbacAuthorizationV1Api", "namespaced_role"),
    "RoleBinding": ("RbacAuthorizationV1Api", "namespaced_role_binding"),
    "CronJob": ("BatchV1Api", "namespaced_cron_job"),
    "Lease": ("CoordinationV1Api", "namespaced_lease"),
}


class Cluster:
    """The kubernetes client, narrowed to what the study needs. As a context manager it scales this
    project's GPU workloads to zero on exit, also on error (idle GPU nodes must not sit burning)."""

    def __init__(self, namespace: str = "sdeth", context: str | None = None, api_client=None,
                 hold_lease: bool = True):
        """hold_lease: renew the controller's Lease while this object is open (the reaper reads it)."""
        import os
        from kubernetes import client, config
        if api_client is None:
            try:
                if os.environ.get("KUBERNETES_SERVICE_HOST") and context is None:
                    config.load_incluster_config()      # inside a pod (the reaper)
                else:
                    config.load_kube_config(context=context)
            except Exception as e:
                raise ClusterError(f"no usable kubeconfig (context {context!r}): {e}; "
                                   "set KUBECONFIG or pass context=") from None
            api_client = client.ApiClient()
        self.api_client, self.namespace = api_client, namespace
        self.apps, self.core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
        self._apis = {name: getattr(client, name)(api_client) for name, _ in _KINDS.values()}
        self._forwards: list[subprocess.Popen] = []
        self._renewer = None
        if hold_lease:
            self._hold_lease()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.scale_all(0, gpu_only=True)
        finally:
            self.close()

    def close(self) -> None:
        for p in self._forwards:
            p.terminate()
        self._forwards.clear()
        if self._renewer is not None:
            self._renewer[1].set()
            self._renewer = None

    # -- the controller's Lease (see the module docstring)
    def renew_lease(self, holder: str = "") -> None:
        import datetime
        import os
        import socket as _s
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": LEASE, "labels": {"app.kubernetes.io/part-of": "sdeth"}},
                "spec": {"holderIdentity": holder or f"{_s.gethostname()}-{os.getpid()}",
                         "leaseDurationSeconds": int(LEASE_RENEW_S * 2), "renewTime": now}}
        self.apply([body])

    def lease_age_s(self) -> float | None:
        """Seconds since the controller's Lease was renewed; None when there is none."""
        import datetime
        from kubernetes.client.exceptions import ApiException
        try:
            lease = self._apis["CoordinationV1Api"].read_namespaced_lease(LEASE, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        t = lease.spec.renew_time if lease.spec else None
        if t is None:
            return None
        if isinstance(t, str):
            t = datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
        return (datetime.datetime.now(datetime.timezone.utc) - t).total_seconds()

    def try_renew_lease(self) -> bool:
        """renew_lease(), never raising: False when the API server could not be reached or refused it (the
        next renewal tries again; the reaper waits --stale-minutes before it acts)."""
        try:
            self.renew_lease()
            return True
        except Exception:           # noqa: BLE001 -- any failure (HTTP, connection, TLS) must not end the renewals
            return False

    def _hold_lease(self) -> None:
        import threading
        stop = threading.Event()

        def renew():
            while True:
                self.try_renew_lease()
                if stop.wait(LEASE_RENEW_S):
                    return
        t = threading.Thread(target=renew, name="sdeth-lease", daemon=True)
        self._renewer = (t, stop)
        t.start()

    def up(self) -> list[dict]:
        """What of ours is up: each Deployment's replicas and ready replicas, and how long ago it was created."""
        import datetime
        now = datetime.datetime.now(datetime.timezone.utc)
        out = []
        for d in self.deployments():
            made = d.metadata.creation_timestamp
            out.append({"deployment": d.metadata.name, "replicas": d.spec.replicas or 0,
                        "ready": (d.status.ready_replicas or 0) if d.status else 0,
                        "gpu": (d.metadata.labels or {}).get("sdeth/gpu") == "true",
                        "age_s": (now - made).total_seconds() if made else None})
        return out

    # -- objects
    def _api(self, kind: str):
        if kind not in _KINDS:
            raise ClusterError(f"kind {kind!r} is not handled here: one of {sorted(_KINDS)}")
        name, suffix = _KINDS[kind]
        return self._apis[name], suffix

    def apply(self, objs: list[dict]) -> list[str]:
        """Create each object, or replace it when it exists. Returns 'Kind/name' for each."""
        from kubernetes.client.exceptions import ApiException
        done = []
        for o in objs:
            api, suffix = self._api(o["kind"])
            name, body = o["metadata"]["name"], copy.deepcopy(o)
            try:
                getattr(api, f"create_{suffix}")(self.namespace, body)
            except ApiException as e:
                if e.status != 409:
                    raise ClusterError(f"creating {o['kind']}/{name} failed: {e.status} {e.reason}") from None
                current = getattr(api, f"read_{suffix}")(name, self.namespace)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                if o["kind"] == "Service":  # clusterIP is immutable: keep the one it has
                    body["spec"]["clusterIP"] = current.spec.cluster_ip
                getattr(api, f"replace_{suffix}")(name, self.namespace, body)
            done.append(f"{o['kind']}/{name}")
        return done

    def delete(self, objs: list[dict]) -> None:
        from kubernetes.client.exceptions import ApiException
        for o in objs:
            api, suffix = self._api(o["kind"])
            try:
                getattr(api, f"delete_{suffix}")(o["metadata"]["name"], self.namespace)
            except ApiException as e:
                if e.status != 404:
                    raise

    # -- state
    def deployments(self, selector: str = PART_OF) -> list:
        return self.apps.list_namespaced_deployment(self.namespace, label_selector=selector).items

    def wait_ready(self, names: list[str], timeout_s: float = 900, poll_s: float = 2.0) -> None:
        """Until every named Deployment has all its replicas ready; WaitTimeout says what it saw."""
        t_end = time.time() + timeout_s
        while True:
            seen = {}
            for n in names:
                d = self.apps.read_namespaced_deployment(n, self.namespace)
                want, ready = d.spec.replicas or 0, (d.status.ready_replicas or 0) if d.status else 0
                seen[n] = (ready, want)
            if all(r >= w for r, w in seen.values()):
                return
            if time.time() > t_end:
                late = ", ".join(f"{n} {r}/{w} ready" for n, (r, w) in seen.items() if r < w)
                raise WaitTimeout(f"waited {timeout_s:.0f} s for deployments {names} in namespace "
                                  f"{self.namespace!r} to be ready; saw: {late}. {self._pod_story(names)}")
            time.sleep(poll_s)

    def _pod_story(self, names: list[str]) -> str:
        """Why pods are not ready, in one line (phase and waiting reasons)."""
        parts = []
        for n in names:
            for p in self.core.list_namespaced_pod(self.namespace, label_selector=f"app.kubernetes.io/name={n}").items:
                why = [c.state.waiting.reason for c in (p.status.container_statuses or [])
                       if c.state and c.state.waiting] if p.status else []
                conds = [f"{c.reason}: {c.message}" for c in (p.status.conditions or []) if c.reason] if p.status else []
                parts.append(f"pod {p.metadata.name}: {p.status.phase if p.status else '?'}"
                             + (f" ({', '.join(why + conds)})" if why or conds else ""))
        return "; ".join(parts) or "no pods found"

    def scale(self, name: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(name, self.namespace, {"spec": {"replicas": replicas}})

    def scale_all(self, replicas: int = 0, gpu_only: bool = False) -> list[str]:
        """Scale this project's Deployments (GPU ones only, if asked); returns the names changed."""
        sel = PART_OF + (",sdeth/gpu=true" if gpu_only else "")
        changed = [d.metadata.name for d in self.deployments(sel) if (d.spec.replicas or 0) != replicas]
        for n in changed:
            self.scale(n, replicas)
        return changed

    def logs(self, selector: str, tail: int = 200) -> dict[str, str]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return {p.metadata.name: self.core.read_namespaced_pod_log(p.metadata.name, self.namespace, tail_lines=tail)
                for p in pods}

    def nodes(self) -> list[dict]:
        """Inventory: name, GPUs (allocatable), GPU product label, ready."""
        out = []
        for n in self.core.list_node().items:
            alloc = n.status.allocatable or {}
            labels = n.metadata.labels or {}
            ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            out.append({"node": n.metadata.name, "gpus": int(alloc.get("nvidia.com/gpu", 0)),
                        "gpu_product": labels.get("nvidia.com/gpu.product"), "ready": ready})
        return out

    def port_forward(self, service: str, port: int, local_port: int | None = None, timeout_s: float = 30,
                     kubectl: str = "kubectl") -> int:
        """`kubectl port-forward svc/NAME LOCAL:PORT` in the background; returns once LOCAL answers."""
        local_port = local_port or free_port()
        p = subprocess.Popen([kubectl, "port-forward", "-n", self.namespace, f"svc/{service}", f"{local_port}:{port}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._forwards.append(p)
        wait_for_port("127.0.0.1", local_port, timeout_s, what=f"port-forward to svc/{service}:{port}", proc=p)
        return local_port


def wait_for_port(host: str, port: int, timeout_s: float, what: str = "", proc: subprocess.Popen | None = None) -> None:
    """Until a TCP connect to host:port succeeds; WaitTimeout (or the process's error) otherwise."""
    t_end = time.time() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError as e:
            last = e
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{what or 'the process'} exited ({proc.returncode}): {proc.stderr.read().strip()}")
        if time.time() > t_end:
            raise WaitTimeout(f"waited {timeout_s:.0f} s for {what or f'{host}:{port}'} to answer; last: {last}")
        time.sleep(0.2)


def reap(namespace: str = "sdeth", stale_minutes: float = 15.0, context: str | None = None,
         api_client=None) -> tuple[float | None, list[str]]:
    """The reaper's one pass: when the controller's Lease is missing or older than stale_minutes, scale this
    project's GPU Deployments to zero. Returns (the Lease's age in seconds or None, the Deployments scaled)."""
    if stale_minutes <= 0:
        raise ClusterError(f"stale_minutes={stale_minutes}: must be > 0 (minutes without a renewal)")
    c = Cluster(namespace, context, api_client, hold_lease=False)
    try:
        age = c.lease_age_s()
        if age is not None and age <= stale_minutes * 60:
            return age, []
        return age, c.scale_all(0, gpu_only=True)
    finally:
        c.close()


def down(namespace: str = "sdeth", context: str | None = None, api_client=None) -> list[str]:
    """Scale every Deployment of this project in the namespace to zero; returns those changed."""
    c = Cluster(namespace, context, api_client, hold_lease=False)
    try:
        return c.scale_all(0)
    finally:
        c.close()


def wait_job(c: Cluster, name: str, timeout_s: float = 600, poll_s: float = 2.0) -> None:
    """Until a Job has succeeded; ClusterError if it failed, WaitTimeout with its state otherwise."""
    batch = c._apis["BatchV1Api"]
    t_end = time.time() + timeout_s
    while True:
        st = batch.read_namespaced_job(name, c.namespace).status
        if st and st.succeeded:
            return
        if st and st.failed:
            raise ClusterError(f"job {name} failed: {c.logs(f'app.kubernetes.io/name={name}')}")
        if time.time() > t_end:
            raise WaitTimeout(f"waited {timeout_s:.0f} s for job {name} to finish; saw {st}. "
                              f"{c._pod_story([name])}")
        time.sleep(poll_s)


def run_probe(c: Cluster, target_node: str, draft_node: str, image: str | None = None,
              timeout_s: float = 600, poll_s: float = 2.0) -> list[dict]:
    """The link probe between two nodes: server on the draft node, client Job on the target node.
    Returns the client's four-timestamp samples (sdeth.place.netprobe.analyse reads them); removes both."""
    objs = render("probe", target_node=target_node, draft_node=draft_node, image=image, namespace=c.namespace)
    c.apply([o for o in objs if o["kind"] != "Job"])
    try:
        c.wait_ready(["sdeth-probe-server"], timeout_s, poll_s)
        c.apply([o for o in objs if o["kind"] == "Job"])
        wait_job(c, "sdeth-probe-client", timeout_s, poll_s)
        text = "\n".join(c.logs("app.kubernetes.io/name=sdeth-probe-client", tail=5).values())
        last = [line for line in text.splitlines() if line.startswith("[")]
        if not last:
            raise ClusterError(f"probe client printed no samples; its log ends: {text[-500:]}")
        return json.loads(last[-1])
    finally:
        c.delete(objs)
