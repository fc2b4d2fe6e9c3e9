"""`kimik3 plan`: the JSON contract, the table, and exit code 2 with one line for an impossible spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimik3_operator.cli import main
from tests.support.cases import EXAMPLES, base_deployment
from tests.support.nodes import all_pools

ROLE_KEYS = {"role", "replicas", "gpusPerReplica", "nodesPerReplica", "tensorParallel", "pipelineParallel",
             "dataParallel", "expertParallel", "all2allBackend", "moeBackend", "computeDomain", "command", "env",
             "worker", "predicted"}


@pytest.fixture
def nodes_file(tmp_path: Path) -> Path:
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": all_pools()}))
    return path


def _write(tmp_path: Path, body: dict[str, Any]) -> Path:
    path = tmp_path / "cr.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_json_contract(nodes_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = next(p for p in EXAMPLES if p.name == "pd-gb300-decode-b200-prefill.yaml")
    assert main(["plan", "-f", str(example), "--nodes", str(nodes_file), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pools = {p["name"]: p for p in out["pools"]}
    assert set(pools["gb300-decode"]) >= {"name", "gpuProduct", "interconnect", "gpusPerNode", "roles"}
    (decode,) = pools["gb300-decode"]["roles"]
    assert set(decode) >= ROLE_KEYS
    assert decode["role"] == "decode" and decode["gpusPerReplica"] == 8 and decode["nodesPerReplica"] == 2
    assert decode["command"][:3] == ["vllm", "serve", "/models/kimi-k3"]
    assert "--headless" in decode["worker"]["command"]
    assert decode["env"]["POD_IP"] == "$(POD_IP)"
    assert isinstance(decode["predicted"]["decodeTokensPerSecondBatch1"], float)
    (prefill,) = pools["b200-prefill"]["roles"]
    assert prefill["all2allBackend"] == "deepep_v2" and prefill["expertParallel"] is True


def test_single_node_roles_have_no_worker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = base_deployment()
    body["spec"]["pools"][0].update(nodeSelector={"x": "y"}, gpu={"product": "B300", "perNode": 8})
    empty = tmp_path / "nodes.yaml"
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    assert main(["plan", "-f", str(_write(tmp_path, body)), "--nodes", str(empty), "-o", "json"]) == 3
    out = json.loads(capsys.readouterr().out)
    (role,) = out["pools"][0]["roles"]
    assert role["worker"] is None and role["nodesPerReplica"] == 1
    assert out["capacity"]["fits"] is False and "planned ahead of its nodes" in out["capacity"]["reason"]


def _gpu_nodes(count: int, gpus: int, product: str = "NVIDIA-B300") -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"n{i}", "labels": {"nvidia.com/gpu.product": product}},
             "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)}}}
            for i in range(count)]


@pytest.mark.parametrize(("nodes", "replicas", "fits"), [(2, 2, True), (1, 2, False), (3, 1, True), (0, 1, False)])
def test_capacity_verdict_and_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str], nodes: int,
                                        replicas: int, fits: bool) -> None:
    """Exit 3 and fits=false exactly when the nodes given lack room; the numbers add up per pool."""
    body = base_deployment()
    body["spec"]["pools"][0].update(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B300"}, gpu={"product": "B300"},
                                    aggregated={"replicas": replicas, "parallelism": {"tensor": 8}})
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": _gpu_nodes(nodes, 8)}))
    code = main(["plan", "-f", str(_write(tmp_path, body)), "--nodes", str(path), "-o", "json"])
    capacity = json.loads(capsys.readouterr().out)["capacity"]
    assert code == (0 if fits else 3) and capacity["fits"] is fits
    (pool,) = capacity["pools"]
    assert (pool["nodesNeeded"], pool["gpusNeeded"], pool["nodes"], pool["gpusFree"]) == (
        replicas, 8 * replicas, nodes, 8 * nodes)
    assert (capacity["reason"] is None) is fits
    main(["plan", "-f", str(_write(tmp_path, body)), "--nodes", str(path)])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("capacity:"))
    assert ("does NOT fit" in line) is not fits and f"needs {replicas} nodes/{8 * replicas} GPUs" in line


def test_table(nodes_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = next(p for p in EXAMPLES if p.name == "gb300-aggregated-tp8.yaml")
    assert main(["plan", "-f", str(example), "--nodes", str(nodes_file)]) == 0
    out = capsys.readouterr().out
    assert "gb300-rack-a" in out and "TP8" in out and "total GPUs: 16" in out


@pytest.mark.parametrize(("edit", "first_word"), [
    (lambda d: d["spec"]["pools"][0].update(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"},
                                            aggregated={"replicas": 1, "parallelism": {"tensor": 8}}),
     "InsufficientMemory:"),
    (lambda d: d["spec"]["pools"][0]["aggregated"].update(parallelism={"tensor": 5}), "InvalidSpec:"),
])
def test_impossible_spec_exits_2_with_one_line(tmp_path: Path, nodes_file: Path, capsys: pytest.CaptureFixture[str],
                                               edit, first_word: str) -> None:
    body = base_deployment()
    edit(body)
    assert main(["plan", "-f", str(_write(tmp_path, body)), "--nodes", str(nodes_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(first_word), err


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_plans_cleanly(example: Path, nodes_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every example plans; whether the test nodes hold it is the capacity verdict's (exit 3)."""
    code = main(["plan", "-f", str(example), "--nodes", str(nodes_file), "-o", "json"])
    capacity = json.loads(capsys.readouterr().out)["capacity"]
    assert code == (0 if capacity["fits"] else 3)


@pytest.mark.parametrize("flags", [
    [],  # no certificate at all
    ["--webhook-cert", "c", "--webhook-key", "k", "--webhook-cert-secret", "s"],  # files and a Secret
    ["--webhook-cert-secret", "s"],  # a Secret but no configuration or host
    ["--webhook-cert-secret", "s", "--webhook-configuration", "c"],
])
def test_the_webhook_needs_one_certificate_source(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--webhook-port", "9443", *flags]) == 2
    assert "error: --webhook" in capsys.readouterr().err


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `kimik3 run` would start the operator with (nothing is started)."""
    from kimik3_operator.reconcile import runner

    seen: dict[str, Any] = {}

    def run_operator(config: Any, **kwargs: Any) -> int:
        seen.update(config=config, **kwargs)
        return 0

    monkeypatch.setattr(runner, "run_operator", run_operator)
    for name in ("KIMIK3_RESYNC_SECONDS", "KIMIK3_RETRY_SECONDS", "KIMIK3_TOOLS_IMAGE", "KIMIK3_LOG_LEVEL",
                 "KIMIK3_LOG_FORMAT", "KIMIK3_COALESCE_SECONDS", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    return seen


def test_run_settings_come_from_flags_else_environment_else_defaults(
        started: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["run"]) == 0
    config = started["config"]
    assert (config.resync_seconds, config.retry_seconds, started["log_level"], started["log_format"]) == \
        (30, 10, "INFO", "text")
    monkeypatch.setenv("KIMIK3_RESYNC_SECONDS", "45")
    monkeypatch.setenv("KIMIK3_RETRY_SECONDS", "7")
    monkeypatch.setenv("KIMIK3_TOOLS_IMAGE", "env/image:1")
    monkeypatch.setenv("KIMIK3_LOG_FORMAT", "json")
    assert main(["run"]) == 0
    config = started["config"]
    assert (config.resync_seconds, config.retry_seconds, config.tools_image, started["log_format"]) == \
        (45, 7, "env/image:1", "json")
    assert config.coalesce_seconds == 0.5
    monkeypatch.setenv("KIMIK3_COALESCE_SECONDS", "2")
    assert main(["run", "--resync-seconds", "60", "--retry-seconds", "3", "--tools-image", "flag/image:2",
                 "--log-format", "text", "--log-level", "DEBUG", "--coalesce-seconds", "0"]) == 0
    config = started["config"]
    assert (config.resync_seconds, config.retry_seconds, config.tools_image) == (60, 3, "flag/image:2")
    assert config.coalesce_seconds == 0  # 0 given is 0, not "unset"
    assert (started["log_format"], started["log_level"]) == ("text", "DEBUG")


def test_run_refuses_bad_settings(started: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--resync-seconds", "0"])
    with pytest.raises(SystemExit):
        main(["run", "--log-format", "xml"])
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            main(["run", "--coalesce-seconds", bad])
    monkeypatch.setenv("KIMIK3_LOG_LEVEL", "LOUD")
    assert main(["run"]) == 2
    assert "$KIMIK3_LOG_LEVEL='LOUD'" in capsys.readouterr().err
    assert not started


def test_run_help_documents_every_setting_with_its_environment_variable_and_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kimik3_operator.reconcile.settings import OperatorConfig

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, env, default in (("--resync-seconds", "KIMIK3_RESYNC_SECONDS", f"{OperatorConfig.resync_seconds:g}"),
                               ("--retry-seconds", "KIMIK3_RETRY_SECONDS", f"{OperatorConfig.retry_seconds:g}"),
                               ("--workers", "KIMIK3_WORKERS", f"{OperatorConfig.workers}"),
                               ("--coalesce-seconds", "KIMIK3_COALESCE_SECONDS",
                                f"{OperatorConfig.coalesce_seconds:g}"),
                               ("--log-level", "KIMIK3_LOG_LEVEL", "INFO"),
                               ("--log-format", "KIMIK3_LOG_FORMAT", "text"),
                               ("--tools-image", "KIMIK3_TOOLS_IMAGE", "the image of this version")):
        assert flag in text and f"default: ${env}, else {default}" in text, flag


ROOT = Path(__file__).resolve().parents[2]
RACK = ROOT / "e2e" / "cluster" / "nodes" / "gb300-nvl72-rack0.yaml"
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0", "labels": {}}}


@pytest.mark.parametrize(("text", "count"), [
    (RACK.read_text(), 18),  # the project's own fake nodes: a multi-document stream
    (yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [NODE, NODE]}), 2),  # kubectl get -o yaml
    (json.dumps({"apiVersion": "v1", "kind": "NodeList", "items": [NODE]}, indent=4), 1),  # kubectl get -o json
    (yaml.safe_dump(NODE) + "---\n", 1),  # one Node, a trailing separator
    (yaml.safe_dump(NODE) + "---\n" + yaml.safe_dump({"kind": "List", "items": [NODE]}), 2),  # a List in a stream
    ("apiVersion: v1\nkind: List\nitems: []\n", 0),
])
def test_nodes_are_read_as_users_have_them(text: str, count: int) -> None:
    from kimik3_operator.cli import nodes_from

    nodes = nodes_from(text, "nodes.yaml")
    assert len(nodes) == count and all(n.get("kind", "Node") == "Node" for n in nodes)


@pytest.mark.parametrize(("text", "message"), [
    (yaml.safe_dump(NODE) + "---\n" + yaml.safe_dump({"kind": "Service"}),
     "nodes.yaml: document 2 is a Service, not a Node"),
    (yaml.safe_dump({"kind": "List", "items": [NODE, {"kind": "Pod"}]}), "nodes.yaml item 1 is a Pod, not a Node"),
    (yaml.safe_dump({"kind": "List", "items": "x"}), "nodes.yaml: a List without a list of items"),
    ("- a\n- b\n", "nodes.yaml is not an object"),
    ("kind: [\n", "nodes.yaml: not YAML or JSON"),
])
def test_anything_but_nodes_is_refused_by_name(text: str, message: str, tmp_path: Path, nodes_file: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from kimik3_operator.cli import InputError, nodes_from

    with pytest.raises(InputError) as info:
        nodes_from(text, "nodes.yaml")
    assert str(info.value).startswith(message), info.value
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    example = next(p for p in EXAMPLES if p.name == "gb300-aggregated-tp8.yaml")
    assert main(["plan", "-f", str(example), "--nodes", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {str(path)[:-len('nodes.yaml')]}"), err


def test_plan_reads_a_node_stream_and_stdin(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`--nodes` takes the project's own multi-document node files, and `-` for `kubectl get nodes -o
    json | kimik3 plan ... --nodes -`."""
    import io

    example = next(p for p in EXAMPLES if p.name == "gb300-aggregated-tp8.yaml")
    assert main(["plan", "-f", str(example), "--nodes", str(RACK), "-o", "json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert from_file["pools"][0]["gpuProduct"] == "GB300" and from_file["capacity"]["pools"][0]["nodes"] == 18
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(yaml.safe_load_all(RACK.read_text()))})
    monkeypatch.setattr("sys.stdin", io.StringIO(listed))
    assert main(["plan", "-f", str(example), "--nodes", "-", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == from_file


EITHER = "error: give either -f FILE or NAMESPACE/NAME of a deployment in the cluster"


@pytest.mark.parametrize(("args", "message"), [
    (["plan"], EITHER),
    (["plan", "ns/name", "-f", "x.yaml"], EITHER),
    (["plan", "just-a-name"], "error: 'just-a-name': expected NAMESPACE/NAME, or NAME with -n NAMESPACE"),
    (["plan", "a/b/c"], "error: 'a/b/c': expected NAMESPACE/NAME, or NAME with -n NAMESPACE"),
    (["plan", "ns/name", "-n", "other"], "error: 'ns/name' names namespace 'ns' but -n says 'other'"),
    (["plan", "-f", "x.yaml", "--diff"],
     "error: --diff compares with a deployment in the cluster: give NAMESPACE/NAME"),
])
def test_plan_names_one_deployment(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 1
    assert capsys.readouterr().err == message + "\n"


def test_no_cluster_and_no_nodes_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Neither a kubeconfig nor a pod's service environment: one line naming the ways out, exit 1."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    example = next(p for p in EXAMPLES if p.name == "gb300-aggregated-tp8.yaml")
    assert main(["plan", "-f", str(example)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: no cluster to read (") and "--nodes FILE" in err, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from kimik3_operator import __version__
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"kimik3 {__version__}\n"
