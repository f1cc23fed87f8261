"""Manifests (offline schema validation, placement) and cluster control against a stand-in API server."""
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from sdeth.place import cluster
from sdeth.place.cluster import Cluster, ClusterError, WaitTimeout

from k8s_standin import StandIn

NODES = ("gpu-node-a", "gpu-node-b")      # the stand-in cluster's nodes (a parameter, never a default)

pytestmark = pytest.mark.skipif(not __import__("shutil").which("kubectl"), reason="kustomize rendering needs kubectl")
RAW = sorted(p for p in cluster.MANIFESTS.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("path", RAW, ids=lambda p: str(p.relative_to(cluster.MANIFESTS)))
def test_every_manifest_file_validates(path):
    cluster.validate([o for o in yaml.safe_load_all(path.read_text()) if o])


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory):
    from sdeth.wire.auth import make_keys
    return str(make_keys(tmp_path_factory.mktemp("keys") / "sdeth-keys"))


@pytest.mark.parametrize("placement", cluster.OVERLAYS)
def test_every_rendered_overlay_validates(placement, keys_dir):
    objs = cluster.render(placement, *NODES, image="registry.example/sdeth-worker:v1", pair="qwen3-8b/0.6b",
                          keys_dir=keys_dir if placement in cluster.KEYED else None)
    cluster.validate(objs)
    assert all(o["metadata"]["namespace"] == "sdeth" for o in objs)
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "sdeth" for o in objs)


def _by_name(objs):
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}


def test_ethernet_puts_the_workers_on_different_nodes():
    d = _by_name(cluster.render("ethernet", target_node="node-a", draft_node="node-b"))
    assert cluster.node_of(d["sdeth-target"]) == "node-a" and cluster.node_of(d["sdeth-draft"]) == "node-b"
    anti = d["sdeth-draft"]["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["labelSelector"]["matchLabels"] == {"sdeth/role": "target"}
    assert term["topologyKey"] == "kubernetes.io/hostname"
    args = d["sdeth-target"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--draft-addr") + 1] == "tcp://sdeth-draft:5601"
    with pytest.raises(ClusterError, match="two nodes"):
        cluster.render("ethernet", target_node="node-a", draft_node="node-a")


def test_colocated_puts_them_on_one_node():
    d = _by_name(cluster.render("colocated", target_node="node-a", draft_node="node-b"))
    assert cluster.node_of(d["sdeth-target"]) == cluster.node_of(d["sdeth-draft"]) == "node-a"
    assert "podAffinity" in d["sdeth-draft"]["spec"]["template"]["spec"]["affinity"]


def test_vllm_sd_carries_the_speculative_config_json():
    import json
    d = _by_name(cluster.render("vllm-sd", *NODES, target_model="Qwen/Qwen3-8B", draft_model="Qwen/Qwen3-0.6B", k=4))
    args = d["sdeth-vllm"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert json.loads(args[args.index("--speculative-config") + 1]) == {
        "method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4}
    d = _by_name(cluster.render("vllm-target-only", *NODES))
    assert "--speculative-config" not in d["sdeth-vllm"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_unknown_placement():
    with pytest.raises(ClusterError, match="unknown placement"):
        cluster.render("etherent", *NODES)


@pytest.fixture
def api():
    s = StandIn(ready_after=0.3, never_ready=("sdeth-draft-stuck",))
    yield s
    s.close()


def test_apply_wait_and_reapply(api):
    objs = cluster.render("ethernet", *NODES)
    with Cluster(api_client=api.client()) as c:
        assert sorted(c.apply(objs)) == sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
        c.wait_ready(["sdeth-target", "sdeth-draft"], timeout_s=10, poll_s=0.1)
        c.apply(objs)                                    # again: replaced, not refused
        assert ("PUT", "/apis/apps/v1/namespaces/sdeth/deployments/sdeth-target") in api.requests
        assert [n["gpus"] for n in c.nodes()] == [8, 8]
        assert "log of" in next(iter(c.logs("sdeth/role=target").values()))
    # leaving the block scaled the GPU workloads to zero
    assert all(d["spec"]["replicas"] == 0 for k, d in api.objects.items() if k[0] == "deployments")


def test_wait_timeout_says_what_it_saw(api):
    objs = cluster.render("ethernet", *NODES)
    for o in objs:                                       # a draft that can never be scheduled
        if o["metadata"]["name"] == "sdeth-draft" and o["kind"] == "Deployment":
            o["metadata"]["name"] = "sdeth-draft-stuck"
            o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "sdeth-draft-stuck"
    c = Cluster(api_client=api.client())
    c.apply(objs)
    t0 = time.time()
    with pytest.raises(WaitTimeout, match=r"sdeth-draft-stuck 0/1 ready.*Unschedulable.*nvidia.com/gpu"):
        c.wait_ready(["sdeth-target", "sdeth-draft-stuck"], timeout_s=1.0, poll_s=0.1)
    assert time.time() - t0 < 5


def test_scaled_to_zero_on_error_too(api):
    with pytest.raises(RuntimeError, match="experiment failed"):
        with Cluster(api_client=api.client()) as c:
            c.apply(cluster.render("ethernet", *NODES) + cluster.render("probe", *NODES))
            raise RuntimeError("experiment failed")
    reps = {k[2]: d["spec"]["replicas"] for k, d in api.objects.items() if k[0] == "deployments"}
    assert reps == {"sdeth-target": 0, "sdeth-draft": 0, "sdeth-probe-server": 1}   # no GPU: left alone


def test_down_finds_and_scales_what_was_left_running(api):
    Cluster(api_client=api.client()).apply(cluster.render("ethernet", *NODES) + cluster.render("vllm-sd", *NODES))
    assert sorted(cluster.down(api_client=api.client())) == ["sdeth-draft", "sdeth-target", "sdeth-vllm"]
    assert cluster.down(api_client=api.client()) == []     # nothing left


def test_wait_for_port_returns_once_it_answers():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    threading.Timer(0.5, srv.listen).start()
    t0 = time.time()
    cluster.wait_for_port("127.0.0.1", port, timeout_s=5)
    assert 0.4 < time.time() - t0 < 3
    srv.close()
    with pytest.raises(WaitTimeout, match=f"127.0.0.1:{port}"):
        cluster.wait_for_port("127.0.0.1", port, timeout_s=0.5)


def test_probe_between_two_nodes_through_the_api():
    import json
    samples = [{"t0": 0.0, "t1": 0.0052, "t2": 0.0053, "t3": 0.0254, "connect_s": 0.001, "first_on_connection": True}]
    s = StandIn(ready_after=0.2, logs={"sdeth-probe-client": "measuring\n" + json.dumps(samples) + "\n"})
    try:
        c = Cluster(api_client=s.client())
        got = cluster.run_probe(c, "node-a", "node-b", timeout_s=10, poll_s=0.1)
        assert got == samples
        assert set(s.objects) == {("leases", "sdeth", cluster.LEASE)}   # server, service and job removed;
        # the controller's Lease stays (it goes stale once nobody renews it)
        posted = [p for m, p in s.requests if m == "POST"]
        assert posted.index("/apis/batch/v1/namespaces/sdeth/jobs") > posted.index(
            "/apis/apps/v1/namespaces/sdeth/deployments")      # the client starts after the server is up
    finally:
        s.close()


def test_node_names_are_required():
    with pytest.raises(ClusterError, match="needs node names.*kubectl get nodes"):
        cluster.render("ethernet", target_node="gpu-node-a")


def test_the_reaper_is_in_the_gpu_placements_with_least_privilege():
    for placement in ("colocated", "ethernet", "vllm-target-only", "vllm-sd"):
        objs = cluster.render(placement, *NODES, image="registry.example/sdeth-worker:v1")
        kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
        assert {("ServiceAccount", "sdeth-reaper"), ("Role", "sdeth-reaper"), ("RoleBinding", "sdeth-reaper"),
                ("CronJob", "sdeth-reaper")} <= kinds, placement
        cron = next(o for o in objs if o["kind"] == "CronJob")
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "sdeth-reaper"
        assert pod["containers"][0]["image"] == "registry.example/sdeth-worker:v1"     # the image parameter reaches it
        assert "nvidia.com/gpu" not in str(pod["containers"][0]["resources"])
        role = next(o for o in objs if o["kind"] == "Role")
        rules = {(r["apiGroups"][0], r["resources"][0]): sorted(r["verbs"]) for r in role["rules"]}
        assert rules == {("coordination.k8s.io", "leases"): ["get"], ("apps", "deployments"): ["list"],
                         ("apps", "deployments/scale"): ["patch"]}


def _lease(api, minutes_ago):
    import datetime
    t = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=minutes_ago)
    api.objects[("leases", "sdeth", cluster.LEASE)] = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": cluster.LEASE, "namespace": "sdeth", "resourceVersion": "1"},
        "spec": {"holderIdentity": "test", "renewTime": t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def test_reaper_keeps_the_workers_while_the_lease_is_fresh_and_scales_them_when_it_is_stale(api):
    Cluster(api_client=api.client(), hold_lease=False).apply(cluster.render("ethernet", *NODES))
    reps = lambda: {k[2]: d["spec"]["replicas"] for k, d in api.objects.items() if k[0] == "deployments"}  # noqa: E731
    _lease(api, minutes_ago=2)
    age, scaled = cluster.reap(stale_minutes=15, api_client=api.client())
    assert 100 < age < 140 and scaled == [] and set(reps().values()) == {1}
    _lease(api, minutes_ago=20)
    age, scaled = cluster.reap(stale_minutes=15, api_client=api.client())
    assert age > 15 * 60 and sorted(scaled) == ["sdeth-draft", "sdeth-target"] and set(reps().values()) == {0}
    del api.objects[("leases", "sdeth", cluster.LEASE)]          # no controller at all: also idle
    Cluster(api_client=api.client(), hold_lease=False).scale("sdeth-target", 1)
    assert cluster.reap(stale_minutes=15, api_client=api.client()) == (None, ["sdeth-target"])
    with pytest.raises(ClusterError, match="stale_minutes"):
        cluster.reap(stale_minutes=0, api_client=api.client())


def test_a_held_cluster_renews_the_lease(api):
    with Cluster(api_client=api.client()) as c:
        t_end = time.time() + 5
        while ("leases", "sdeth", cluster.LEASE) not in api.objects and time.time() < t_end:
            time.sleep(0.05)
        assert c.lease_age_s() < 5
        assert cluster.reap(stale_minutes=15, api_client=api.client())[1] == []
        c.apply(cluster.render("ethernet", *NODES))
        assert sorted((d["deployment"], d["gpu"]) for d in c.up()) == [("sdeth-draft", True), ("sdeth-target", True)]


def test_lease_renewal_survives_a_lost_api_server():
    from kubernetes import client
    with socket.socket() as sock:                # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    cfg.retries = 0
    c = Cluster(api_client=client.ApiClient(cfg), hold_lease=False)
    assert c.try_renew_lease() is False          # refused connection: reported, not raised (the thread goes on)


def test_status_cluster_and_reap_commands(api, monkeypatch, capsys):
    from sdeth.cli import main
    real = cluster.Cluster
    monkeypatch.setattr(cluster, "Cluster", lambda ns, ctx=None, api_client=None, hold_lease=False:
                        real(ns, api_client=api.client(), hold_lease=False))
    real(api_client=api.client(), hold_lease=False).apply(cluster.render("ethernet", *NODES))
    _lease(api, minutes_ago=30)
    assert main(["status", "--cluster"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"lease renewed 30\.\d min ago", out) and "sdeth-target: " in out and "(GPU)" in out
    assert main(["reap", "--stale-minutes", "15"]) == 0
    assert "scaled to 0 in sdeth: sdeth-" in capsys.readouterr().out


def test_ethernet_curve_mounts_the_keys_and_admits_only_its_own_pods(keys_dir):
    """The secure placement: both workers read their CURVE keys from the Secret (SDETH_KEYS), the Secret holds the
    key directory's pairs, and NetworkPolicies let only target pods reach the draft and controllers the target."""
    import base64
    objs = cluster.render("ethernet-curve", "node-a", "node-b", keys_dir=keys_dir)
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    secret = by_kind["Secret"][0]
    assert secret["metadata"]["name"] == cluster.KEYS_SECRET
    assert base64.b64decode(secret["data"]["client.key"]) == (Path(keys_dir) / "client.key").read_bytes()
    for d in _by_name(objs).values():
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "SDETH_KEYS", "value": "/etc/sdeth/keys"} in c["env"]
        assert any(m["mountPath"] == "/etc/sdeth/keys" and m.get("readOnly") for m in c["volumeMounts"])
        vol = [v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == "keys"][0]
        assert vol["secret"]["secretName"] == cluster.KEYS_SECRET
        assert {"key": "client.key", "path": "authorized/client.key"} in vol["secret"]["items"]
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind["NetworkPolicy"]}
    draft = policies["sdeth-draft-from-targets"]
    assert draft["podSelector"]["matchLabels"] == {"sdeth/role": "draft"}
    assert draft["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"sdeth/role": "target"}}}]
    with pytest.raises(cluster.ClusterError, match="python -m sdeth keys"):
        cluster.render("ethernet-curve", "node-a", "node-b")


def test_ethernet_curve_applies_through_the_control_code(api, keys_dir):
    done = Cluster(api_client=api.client(), hold_lease=False).apply(cluster.render("ethernet-curve", *NODES,
                                                                                   keys_dir=keys_dir))
    assert {"Secret/sdeth-keys", "NetworkPolicy/sdeth-draft-from-targets", "NetworkPolicy/sdeth-target-from-controllers",
            "Deployment/sdeth-target", "Deployment/sdeth-draft"} <= set(done)


def test_provision_on_a_cluster_puts_curve_on_the_link(monkeypatch, tmp_path):
    """M0 on k8s applies the ethernet-curve placement: the workers get a Secret of fresh keys and NetworkPolicies
    (a shared cluster network never carries the plain link by default); the key directory is in the result."""
    from sdeth.place import netprobe
    from sdeth.study.runs import experiment
    applied = []

    class FakeCluster:
        def __init__(self, namespace, context):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def nodes(self):
            return [{"node": n} for n in NODES]

        def apply(self, objs):
            applied.extend(objs)

        def wait_ready(self, names, timeout_s):
            assert names == ["sdeth-target", "sdeth-draft"]

    monkeypatch.setenv("SDETH_CACHE", str(tmp_path))
    monkeypatch.setattr(cluster, "Cluster", FakeCluster)
    monkeypatch.setattr(cluster, "run_probe", lambda c, t, d, image: {"probe": True})
    monkeypatch.setattr(netprobe, "analyse", lambda raw, clock_offset_s: raw)
    out = experiment.provision("k8s", "embedded", target_node=NODES[0], draft_node=NODES[1])
    kinds = {f"{o['kind']}/{o['metadata']['name']}" for o in applied}
    assert {"Secret/sdeth-keys", "NetworkPolicy/sdeth-draft-from-targets", "Deployment/sdeth-draft"} <= kinds
    assert (Path(out["keys_dir"]) / "server.key_secret").is_file() and str(tmp_path) in out["keys_dir"]


def test_vllm_remote_draft_renders_with_its_parameters(keys_dir):
    """The remote-draft placement: vLLM (the proposer's class kept, k set, the target model set) on the target node,
    the draft server (the pair set) on the other, the keys' Secret; and no keys: the fix named."""
    import json
    objs = cluster.render("vllm-remote-draft", *NODES, pair="qwen3-8b/0.6b", target_model="Qwen/Qwen3-14B", k=3,
                          keys_dir=keys_dir)
    deps = _by_name(objs)
    vllm, server = deps["sdeth-vllm"], deps["sdeth-draft-server"]
    assert cluster.node_of(vllm) == NODES[0] and cluster.node_of(server) == NODES[1]
    args = vllm["spec"]["template"]["spec"]["containers"][0]["args"]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert args[0] == "Qwen/Qwen3-14B" and spec == {"method": "custom_class", "num_speculative_tokens": 3,
                                                    "model": "sdeth.wire.vllm_proposer.RemoteDraftProposer"}
    sargs = server["spec"]["template"]["spec"]["containers"][0]["args"]
    assert sargs[sargs.index("--pair") + 1] == "qwen3-8b/0.6b"
    assert any(o["kind"] == "Secret" and o["metadata"]["name"] == "sdeth-keys" for o in objs)
    with pytest.raises(cluster.ClusterError, match="vllm-remote-draft.*python -m sdeth keys"):
        cluster.render("vllm-remote-draft", *NODES)
