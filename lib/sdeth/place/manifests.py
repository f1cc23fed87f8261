"""The cluster's objects (Kubernetes), rendered: the manifests with parameters set, validated offline; pure, dicts
in and dicts out (place.cluster applies them).

Rendering runs the real kustomize (`kubectl kustomize manifests/overlays/<placement>`), so what `lib/`
applies is what `kubectl apply -k` applies; parameters are then set on the rendered objects (plain dicts).
No torch here: this module knows nothing of models beyond their ids.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import yaml
from pathlib import Path

from ..paths import REPO

MANIFESTS = REPO / "manifests"
OVERLAYS = ("colocated", "ethernet", "ethernet-curve", "vllm-target-only", "vllm-sd", "vllm-remote-draft", "probe")
TWO_NODES = ("ethernet", "ethernet-curve", "vllm-remote-draft", "probe")
KEYED = ("ethernet-curve", "vllm-remote-draft")      # placements whose pods mount the CURVE keys' Secret
KEYS_SECRET = "sdeth-keys"   # ethernet-curve: the workers' CURVE keys (a key directory, sdeth.wire.auth)
KEY_FILES = ("server.key", "server.key_secret", "client.key", "client.key_secret")
K8S_VERSION = "1.32"     # the schema set manifests are validated against (kubernetes-validate)


class ClusterError(RuntimeError):
    pass


def kustomize(overlay: str, kubectl: str = "kubectl") -> list[dict]:
    if overlay not in OVERLAYS:
        raise ClusterError(f"unknown placement/overlay {overlay!r}: use one of {OVERLAYS}")
    if not shutil.which(kubectl):
        raise ClusterError(f"{kubectl!r} not found: kustomize rendering needs kubectl >= 1.27 on PATH")
    p = subprocess.run([kubectl, "kustomize", str(MANIFESTS / "overlays" / overlay)], capture_output=True, text=True)
    if p.returncode:
        raise ClusterError(f"kubectl kustomize {overlay} failed: {p.stderr.strip()}")
    return [o for o in yaml.safe_load_all(p.stdout) if o]


def render(placement: str, target_node: str, draft_node: str = "", pair: str | None = None, target_model: str = "Qwen/Qwen3-8B", draft_model: str = "Qwen/Qwen3-1.7B",
           k: int = 5, image: str | None = None, namespace: str = "sdeth", kubectl: str = "kubectl",
           keys_dir: str | None = None) -> list[dict]:
    """The placement's objects with parameters set. colocated puts both workers on target_node. The node
    names are the cluster's own (`kubectl get nodes`): parameters, never defaults. ethernet-curve and
    vllm-remote-draft also need keys_dir (`python -m sdeth keys DIR`): its keys become the Secret their pods
    mount."""
    if not target_node or (placement in TWO_NODES and not draft_node):
        raise ClusterError(f"placement {placement!r} needs node names: target_node={target_node!r}, "
                           f"draft_node={draft_node!r}; pass your cluster's (`kubectl get nodes`), e.g. "
                           f"`-f params/cluster.example.yaml` in 00_provision or --target-node/--draft-node")
    if placement in TWO_NODES[:-1] and target_node == draft_node:
        raise ClusterError(f"placement {placement!r} needs two nodes, got {target_node!r} twice: "
                           "use placement 'colocated' for one node")
    objs = kustomize(placement, kubectl) + ([keys_secret(keys_dir, placement)] if placement in KEYED else [])
    node_of = {"target": target_node, "vllm": target_node, "probe-client": target_node,
               "draft": target_node if placement == "colocated" else draft_node, "probe-server": draft_node,
               "draft-server": draft_node}
    for o in objs:
        o["metadata"]["namespace"] = namespace
        spec = _pod_spec(o)
        if spec is None:
            continue
        role = o["metadata"].get("labels", {}).get("sdeth/role")
        if role in node_of:
            spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node_of[role]
        for c in spec["containers"]:
            if image and c["image"].startswith("sdeth-worker"):
                c["image"] = image
            c["args"] = _set_args(c["args"], role, pair, target_model, draft_model, k)
    return objs


def keys_secret(keys_dir: str | None, placement: str = "ethernet-curve") -> dict:
    """The Secret that holds a key directory's pairs (the keyed placements mount it in their pods)."""
    import base64
    if not keys_dir:
        raise ClusterError(f"placement {placement!r} needs a key directory: make one with `python -m sdeth keys "
                           "DIR` and pass keys_dir=DIR (--keys DIR)")
    d = Path(keys_dir)
    missing = [f for f in KEY_FILES if not (d / f).is_file()]
    if missing:
        raise ClusterError(f"key directory {d} lacks {', '.join(missing)}: make it with `python -m sdeth keys {d}`")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": KEYS_SECRET, "labels": {"app.kubernetes.io/part-of": "sdeth"}},
            "data": {f: base64.b64encode((d / f).read_bytes()).decode() for f in KEY_FILES}}


def _pod_spec(o: dict) -> dict | None:
    """The pod template's spec of a Deployment, Job or CronJob (None for other kinds)."""
    spec = o.get("spec", {})
    if o.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return spec.get("template", {}).get("spec")


def _set_args(args: list[str], role, pair, target_model, draft_model, k) -> list[str]:
    args = list(args)
    if role in ("target", "draft", "draft-server") and pair:
        args[args.index("--pair") + 1] = pair
    if role == "vllm":
        if "--model" in args:
            args[args.index("--model") + 1] = target_model
        else:                          # `vllm serve MODEL ...`: the model is the first argument
            args[0] = target_model
        if "--speculative-config" in args:
            i = args.index("--speculative-config") + 1
            spec = json.loads(args[i])
            if spec.get("method") == "custom_class":      # a remote proposer: its class stays, its draft is a server's
                spec["num_speculative_tokens"] = k
            else:
                spec = {"method": "draft_model", "model": draft_model, "num_speculative_tokens": k}
            args[i] = json.dumps(spec)
    return args


def validate(objs: list[dict], version: str = K8S_VERSION) -> None:
    """Offline schema validation (kubernetes-validate's pinned schemas, strict: unknown fields fail)."""
    import kubernetes_validate
    for o in objs:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise ClusterError(f"{o.get('kind')}/{o.get('metadata', {}).get('name')} is invalid for Kubernetes "
                               f"{version}: {e.message}") from None


def node_of(obj: dict) -> str | None:
    return obj.get("spec", {}).get("template", {}).get("spec", {}).get("nodeSelector", {}).get("kubernetes.io/hostname")
