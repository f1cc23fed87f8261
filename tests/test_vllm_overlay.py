"""The vllm-remote-draft overlay (manifests/overlays/vllm-remote-draft), rendered by the real kustomize and checked
offline: it validates against Kubernetes' schemas; vLLM loads the remote proposer and finds the draft server
through the Service; the two pods sit on different nodes; each pod's keys load as the role it plays, with no
secret it does not need; only vLLM's pods reach the draft server's port; sdeth's worker and vLLM's server both
accept their arguments."""
import json
import shutil
from pathlib import Path

import pytest

from sdeth.place import cluster
from sdeth.wire import auth
from sdeth.wire import vllm_proposer as VP

pytestmark = pytest.mark.skipif(not shutil.which("kubectl"), reason="kustomize rendering needs kubectl")
OVERLAY = cluster.MANIFESTS / "overlays" / "vllm-remote-draft"


@pytest.fixture(scope="module")
def objs():
    import subprocess
    import yaml
    p = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True)
    return [o for o in yaml.safe_load_all(p.stdout) if o]


def _get(objs, kind, name):
    (o,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return o


def _pod(objs, name):
    return _get(objs, "Deployment", name)["spec"]["template"]


def _env(container) -> dict:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _vllm_args(objs) -> list[str]:
    c = _pod(objs, "sdeth-vllm")["spec"]["containers"][0]
    assert c["command"] == ["vllm", "serve"]
    return c["args"]


def test_the_overlay_validates_and_is_ours(objs):
    cluster.validate(objs)
    assert all(o["metadata"]["namespace"] == "sdeth" for o in objs)
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "sdeth" for o in objs)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("Deployment", "sdeth-vllm"), ("Deployment", "sdeth-draft-server"), ("Service", "sdeth-draft-server"),
            ("NetworkPolicy", "sdeth-draft-server-from-vllm"), ("CronJob", "sdeth-reaper")} <= kinds


def test_vllm_loads_the_remote_proposer_and_finds_the_draft_server_through_the_service(objs):
    args = _vllm_args(objs)
    assert args[0] == "Qwen/Qwen3-8B"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["method"] == "custom_class" and spec["model"] == VP.CLASS_PATH
    assert isinstance(spec["num_speculative_tokens"], int) and spec["num_speculative_tokens"] >= 1
    vllm = _pod(objs, "sdeth-vllm")["spec"]["containers"][0]
    assert vllm["image"].startswith("sdeth-worker")          # CUDA vLLM with sdeth importable (the Dockerfile)
    host, port = _env(vllm)[VP.ADDR_ENV].removeprefix("tcp://").split(":")
    svc = _get(objs, "Service", host)
    assert [p["port"] for p in svc["spec"]["ports"]] == [int(port)]
    draft = _pod(objs, "sdeth-draft-server")
    assert svc["spec"]["selector"].items() <= draft["metadata"]["labels"].items()
    c = draft["spec"]["containers"][0]
    assert c["args"][c["args"].index("--bind") + 1].endswith(f":{svc['spec']['ports'][0]['targetPort']}")
    assert {p["containerPort"] for p in c["ports"]} == {svc["spec"]["ports"][0]["targetPort"]}


def test_the_two_pods_are_on_different_nodes(objs):
    vllm, draft = _pod(objs, "sdeth-vllm"), _pod(objs, "sdeth-draft-server")
    assert vllm["spec"]["nodeSelector"] != draft["spec"]["nodeSelector"]
    (term,) = draft["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["labelSelector"]["matchLabels"].items() <= vllm["metadata"]["labels"].items()
    assert term["topologyKey"] == "kubernetes.io/hostname"


def _mounted_keys(pod: dict, keys_dir: Path, into: Path) -> Path:
    """The key directory a pod sees: the Secret's items (the files of `python -m sdeth keys`) at their paths."""
    c = pod["spec"]["containers"][0]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "keys"]
    assert mount.get("readOnly") and _env(c)[auth.ENV] == mount["mountPath"]
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "keys"]
    assert vol["secret"]["secretName"] == cluster.KEYS_SECRET
    for item in vol["secret"]["items"]:
        assert item["key"] in cluster.KEY_FILES
        (into / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(keys_dir / item["key"], into / item["path"])
    return into


def test_each_pod_holds_the_keys_of_its_role_and_no_other_secret(objs, tmp_path):
    keys_dir = auth.make_keys(tmp_path / "made")
    vllm = auth.Keys.load(_mounted_keys(_pod(objs, "sdeth-vllm"), keys_dir, tmp_path / "vllm"))
    draft = auth.Keys.load(_mounted_keys(_pod(objs, "sdeth-draft-server"), keys_dir, tmp_path / "draft"))
    assert vllm.client_secret is not None and vllm.server_secret is None         # a client only
    assert draft.server_secret is not None and draft.client_secret is None       # a server only
    assert vllm.server_public == draft.server_public
    assert (tmp_path / "draft" / "authorized" / "client.key").read_bytes() == (keys_dir / "client.key").read_bytes()


def test_only_vllms_pods_reach_the_draft_servers_port(objs):
    pol = _get(objs, "NetworkPolicy", "sdeth-draft-server-from-vllm")["spec"]
    draft, vllm = _pod(objs, "sdeth-draft-server"), _pod(objs, "sdeth-vllm")
    assert pol["podSelector"]["matchLabels"].items() <= draft["metadata"]["labels"].items()
    assert pol["policyTypes"] == ["Ingress"]
    (rule,) = pol["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= vllm["metadata"]["labels"].items()
    assert not source["podSelector"]["matchLabels"].items() <= draft["metadata"]["labels"].items()
    port = draft["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]


def test_the_draft_servers_arguments_parse_and_cover_vllms_requests(objs):
    from sdeth.cli.worker import worker_config, worker_parser
    args = _pod(objs, "sdeth-draft-server")["spec"]["containers"][0]["args"]
    assert args[:4] == ["python", "-m", "sdeth", "worker"]
    a = worker_parser().parse_args(args[4:])
    cfg = worker_config(a)
    assert a.role == "draft-server" and cfg.pair == "qwen3-8b/1.7b" and a.device == "cuda"
    vllm = _vllm_args(objs)
    assert cfg.capacity >= int(vllm[vllm.index("--max-model-len") + 1])      # every context gets drafts
    assert a.kv_rows >= int(vllm[vllm.index("--max-num-seqs") + 1])             # ... and every running request
    from sdeth.cli.worker import draft_server_config
    told = draft_server_config(a, cfg, 0.0).resolved("cuda").limits
    assert int(vllm[vllm.index("--max-num-seqs") + 1]) <= told.sequences_per_client     # one client: vLLM


def test_vllms_server_accepts_the_arguments():
    pytest.importorskip("vllm")
    import subprocess
    import yaml
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    p = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True)
    args = _vllm_args([o for o in yaml.safe_load_all(p.stdout) if o])
    a = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", *args])   # `vllm serve MODEL` sets --model
    assert a.model == "Qwen/Qwen3-8B" and a.speculative_config["model"] == VP.CLASS_PATH
