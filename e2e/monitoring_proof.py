"""The chart's monitoring, proven on a stock kube-prometheus-stack without pulling an image.

Against the demo's cluster (scripts/demo.sh: the operator as real pods, the example deployment's
engines and routers played on loopback, the cluster's Prometheus wired in):

1. the monitoring.coreos.com CRDs of the Prometheus Operator release this project pins
   (e2e/cluster/versions.env) go in, and the demo's release is upgraded with its ServiceMonitor,
   PodMonitors and PrometheusRule on, labelled `release: kps` and placed in `monitoring`, as a user of
   kube-prometheus-stack release `kps` sets them;
2. the real Prometheus Operator (built from the Go module proxy, e2e/cluster/build.sh) runs on the host
   against the cluster's API server, and one `Prometheus` resource with kube-prometheus-stack's default
   selectors (`release: kps` for service/pod monitors and rules, every namespace) asks it for a
   configuration; the StatefulSet it makes never runs (no node matches its nodeSelector);
3. the configuration it generates (Secret prometheus-kps, prometheus.yaml.gz) and its rule files
   (ConfigMap prometheus-kps-rulefiles-0) are taken as they are, with what a pod would have supplied
   put in by hand: each Kubernetes service discovery gets the API server's address and the admin
   client certificate (in a pod: the in-cluster address and the ServiceAccount's token), the rule
   files' folder is where they were written (in a pod: the ConfigMap's mount), and `$(POD_NAME)` and
   `$(SHARD)` are expanded as the config reloader does (pod prometheus-kps-0, shard 0). Nothing else changes;
4. `promtool check config` and `promtool check rules` pass on them, and Prometheus runs them on a
   loopback port: every target of the chart's monitors is up (the operator's two real pods on the
   node's bridge, the engines, the routers and their fronts on loopback), and, after a few requests
   through the deployment, every panel of the chart's dashboard returns series. That Prometheus is
   built from source (e2e/cluster/build.sh, versions.env PROMETHEUS_SOURCE_VERSION), not the
   cluster's: Debian's package has no Kubernetes service discovery, which every configuration the
   Prometheus Operator generates relies on.

`python e2e/monitoring_proof.py [--out FILE.md]` (.ci/run, after the traffic bench); exits 1 naming
what failed. Traffic goes only to 127.0.0.0/8 and to the real node's pods on this machine's bridge.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from e2e.harness.kube import kubectl, wait_for  # noqa: E402
from e2e.harness.pod_runner import free_port  # noqa: E402
from e2e.harness.traffic import SESSION, post, prompt  # noqa: E402

CACHE = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3-e2e"))
STATE = Path(os.environ.get("KIMIK3_STATE", CACHE / "state"))
CHART = ROOT / "charts" / "kimik3-operator"
RELEASE, RELEASE_NAMESPACE = "kimik3-operator", "kimik3-system"
KPS, MONITORING = "kps", "monitoring"
"""kube-prometheus-stack's release name here, and the namespace its objects (and the chart's monitors) use."""
INTERVAL = "2s"
DASHBOARDS = CHART / "dashboards"


def _versions() -> dict[str, str]:
    out = {}
    for line in (ROOT / "e2e" / "cluster" / "versions.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


VERSIONS = _versions()
"""The pinned versions of the cluster's builds (e2e/cluster/versions.env)."""


def binary(folder_glob: str, name: str) -> Path:
    found = sorted((CACHE / "bin").glob(f"{folder_glob}/{name}"))
    if not found:
        raise SystemExit(f"FAILED: {name} is not built under {CACHE / 'bin'} ({folder_glob}): run e2e/cluster/build.sh")
    return found[-1]


def run(*argv: str, timeout: float = 300) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(argv[:4])} ...:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def install_monitoring(crds: Path) -> None:
    """The CRDs (server-side: the Prometheus CRD is larger than client-side apply's annotation), then
    the demo's release with its monitors on, as a kube-prometheus-stack user sets them."""
    run("kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(crds))
    for crd in ("servicemonitors", "podmonitors", "prometheusrules", "prometheuses"):
        # `kubectl wait` fails at once, not waits, while a new CRD has no status.conditions yet
        wait_for(f"CRD {crd} Established", lambda crd=crd: kubectl(  # type: ignore[misc]
            "wait", "--for=condition=Established", f"crd/{crd}.monitoring.coreos.com", "--timeout=10s",
            check=False).returncode == 0, timeout=90, interval=1)
    values = []
    for key in ("serviceMonitor", "podMonitor", "prometheusRule"):
        values += ["--set", f"metrics.{key}.enabled=true", "--set", f"metrics.{key}.labels.release={KPS}",
                   "--set", f"metrics.{key}.namespace={MONITORING}"]
    for key in ("serviceMonitor", "podMonitor"):
        values += ["--set", f"metrics.{key}.interval={INTERVAL}"]
    version = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])
    run("helm", "upgrade", RELEASE, f"oci://{os.environ['KIMIK3_REGISTRY']}/charts/kimik3-operator", "--version",
        version, "--plain-http", "-n", RELEASE_NAMESPACE, "--reuse-values", *values, "--wait", "--timeout", "180s")


SELECTED = ("serviceMonitor", "podMonitor", "rule", "probe", "scrapeConfig")
PROMETHEUS_RESOURCE = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
    "metadata": {"name": KPS, "namespace": MONITORING},
    "spec": {
        # kube-prometheus-stack's defaults (values.yaml, prometheus.prometheusSpec: *SelectorNilUsesHelmValues
        # true, empty namespace selectors): its release label, in every namespace.
        **{f"{kind}Selector": {"matchLabels": {"release": KPS}} for kind in SELECTED},
        **{f"{kind}NamespaceSelector": {} for kind in SELECTED},
        "version": f"v{VERSIONS['PROMETHEUS_SOURCE_VERSION']}",  # the Prometheus that runs the configuration
        "replicas": 1,
        "nodeSelector": {"kimik3.dev/monitoring-proof": "no-such-node"},
    },
}


def api_access() -> tuple[str, dict[str, str]]:
    """The API server's address and the admin's client certificate, from the cluster's kubeconfig."""
    kubeconfig = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    cluster, user = kubeconfig["clusters"][0]["cluster"], kubeconfig["users"][0]["user"]
    return cluster["server"], {"ca_file": cluster["certificate-authority"], "cert_file": user["client-certificate"],
                               "key_file": user["client-key"]}


class PrometheusOperator:
    def __init__(self, binary: Path, folder: Path) -> None:
        self.log = folder / "prometheus-operator.log"
        server, tls = api_access()
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(binary), f"--apiserver={server}", f"--ca-file={tls['ca_file']}", f"--cert-file={tls['cert_file']}",
                 f"--key-file={tls['key_file']}", f"--web.listen-address=127.0.0.1:{free_port()}", "--log-level=info"],
                stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def found(*args: str) -> dict[str, Any] | None:
    """`kubectl get ... -o json`, or None while it does not exist."""
    got = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(got.stdout) if got.returncode == 0 else None


def generated(folder: Path) -> tuple[dict[str, Any], Path]:
    """The configuration the operator generated, and the folder its rule files were written to."""
    secret = wait_for("the generated configuration (Secret prometheus-kps)", lambda: (s := found(
        "secret", f"prometheus-{KPS}", "-n", MONITORING)) and s.get("data", {}).get("prometheus.yaml.gz")
        and s, timeout=120)
    config = yaml.safe_load(gzip.decompress(base64.b64decode(secret["data"]["prometheus.yaml.gz"])))
    rules = wait_for("the generated rule files (ConfigMap prometheus-kps-rulefiles-0)", lambda: (c := found(
        "configmap", f"prometheus-{KPS}-rulefiles-0", "-n", MONITORING)) and c.get("data") and c,
        timeout=120)
    rules_dir = folder / "rules"
    rules_dir.mkdir(exist_ok=True)
    for name, text in rules["data"].items():
        (rules_dir / name).write_text(text)
    return config, rules_dir


def supplied(config: dict[str, Any], rules_dir: Path) -> dict[str, Any]:
    """What a Prometheus pod would supply, put in: the API server and credentials of every Kubernetes
    service discovery, the rule files' folder, $(POD_NAME) and $(SHARD). Returns the changed copy."""
    server, tls = api_access()
    # The config reloader expands $(VAR) from the pod's environment: its name and its shard's index.
    text = json.dumps(config)
    for variable, value in {"POD_NAME": f"prometheus-{KPS}-0", "SHARD": "0"}.items():
        text = text.replace(f"$({variable})", value)
    if (left := re.findall(r"\$\(\w+\)", text)):
        raise SystemExit(f"FAILED: the configuration asks for more of a pod's environment: {sorted(set(left))}")
    out: dict[str, Any] = json.loads(text)
    for scrape in out.get("scrape_configs") or []:
        for sd in scrape.get("kubernetes_sd_configs") or []:
            sd["api_server"] = server
            sd["tls_config"] = dict(tls)
    if out.get("rule_files"):
        out["rule_files"] = [str(rules_dir / "*.yaml")]
    return out


class Prometheus:
    def __init__(self, binary: Path, config: Path, folder: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = folder / "prometheus.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(binary), f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT)
        wait_for("the proof's Prometheus ready", lambda: self._ok("/-/ready"), timeout=60)

    def _ok(self, path: str) -> bool:
        try:
            return bool(SESSION.get(self.url + path, timeout=2).status_code == 200)
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def api(self, path: str, **params: str) -> Any:
        answer = SESSION.get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10).json()
        if answer.get("status") != "success":
            raise SystemExit(f"FAILED: Prometheus answered {answer} to {path} {params}")
        return answer["data"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def chart_targets(prometheus: Prometheus) -> list[dict[str, Any]]:
    """The active targets of the chart's monitors (scrape pools serviceMonitor/<ns>/<name>/N, ...)."""
    pools = ("serviceMonitor/monitoring/kimik3-operator/", "podMonitor/monitoring/kimik3-operator-serving/",
             "podMonitor/monitoring/kimik3-operator-routers/")
    return [t for t in prometheus.api("targets", state="active")["activeTargets"] if t["scrapePool"].startswith(pools)]


def send_requests(namespace: str, name: str, count: int = 12) -> int:
    """A few requests through the deployment's router (the pod runner's map of played pods)."""
    pods = json.loads((STATE / "pods" / "pods.json").read_text())
    routers = [p["url"] for k, p in sorted(pods.items()) if k.startswith(f"{namespace}/{name}-router-") and p["alive"]]
    if not routers:
        raise SystemExit(f"FAILED: no played router of {namespace}/{name} in {STATE / 'pods' / 'pods.json'}")
    served = 0
    for i in range(count):
        answer = post(routers[i % len(routers)], "/v1/chat/completions", {
            "model": "kimi-k3", "max_tokens": 24, "stream": i % 2 == 0,
            "messages": [{"role": "user", "content": prompt(200, f"proof{i}-")}]}, timeout=60)
        served += answer.status == 200 and answer.done
    return served


def panels() -> list[tuple[str, str]]:
    """(dashboard: panel title, query) for every query of the chart's dashboards, each variable set to
    match all (what Grafana sends for "All": the variables' allValue is .*)."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets") or []:
                out.append((f"{board['title']}: {panel['title']}", with_all(target["expr"], board)))
    return out


def with_all(query: str, board: dict[str, Any]) -> str:
    for variable in board.get("templating", {}).get("list", []):
        query = query.replace(f"${variable['name']}", ".*").replace(f"${{{variable['name']}}}", ".*")
    return query


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the result table (markdown) here too")
    parser.add_argument("--deployment", default="inference/k3-pd", help="NAMESPACE/NAME of the demo's deployment")
    args = parser.parse_args()
    namespace, name = args.deployment.split("/")
    version = VERSIONS["PROMETHEUS_OPERATOR_VERSION"]
    operator_dir = CACHE / "bin" / f"prometheus-operator-v{version}"
    built = f"prometheus-source-v{VERSIONS['PROMETHEUS_SOURCE_VERSION']}"
    prometheus_bin, promtool = binary(built, "prometheus"), binary(built, "promtool")
    folder = Path(tempfile.mkdtemp(prefix="monitoring-proof-"))
    lines = [f"# Monitoring proof: Prometheus Operator v{version}, kube-prometheus-stack selectors", ""]
    failures: list[str] = []
    started = time.monotonic()

    install_monitoring(operator_dir / "crds")
    kubectl("apply", "-f", "-", input=json.dumps(PROMETHEUS_RESOURCE))
    operator = PrometheusOperator(operator_dir / "operator", folder)
    prometheus = None
    try:
        config, rules_dir = generated(folder)
        config_file = folder / "prometheus.yaml"
        config_file.write_text(yaml.safe_dump(supplied(config, rules_dir)))
        run(str(promtool), "check", "config", "--syntax-only", str(config_file))
        rule_files = sorted(rules_dir.glob("*.yaml"))
        checked = run(str(promtool), "check", "rules", *map(str, rule_files))
        rules = sum(len(g.get("rules") or []) for f in rule_files for g in yaml.safe_load(f.read_text())["groups"])
        jobs = [s["job_name"] for s in config.get("scrape_configs") or []]
        lines += [f"- generated: {len(jobs)} scrape configs ({', '.join(jobs)}), {len(rule_files)} rule file(s), "
                  f"{rules} rules; promtool check config/rules: ok ({checked.strip().splitlines()[-1]})"]
        prometheus = Prometheus(prometheus_bin, config_file, folder)
        served = send_requests(namespace, name)
        lines.append(f"- {served}/12 requests served through {namespace}/{name}'s router")
        if served < 12:
            failures.append(f"only {served}/12 requests served")

        def all_up() -> list[dict[str, Any]] | None:
            targets = chart_targets(prometheus)
            kinds = {t["scrapePool"].split("/")[2] for t in targets}
            ok = len(kinds) == 3 and all(t["health"] == "up" for t in targets)
            return targets if ok else None
        try:
            targets = wait_for("every target of the chart's monitors up", all_up, timeout=90)
        except AssertionError:
            targets = chart_targets(prometheus)
            failures += [f"target {t['scrapePool']} {t['scrapeUrl']}: {t['health']} {t.get('lastError', '')}"
                         for t in targets if t["health"] != "up"] or ["the chart's monitors produced no target"]
        lines += ["", "| scrape pool | targets | up |", "|---|---:|---:|"]
        for pool in sorted({t["scrapePool"] for t in targets}):
            mine = [t for t in targets if t["scrapePool"] == pool]
            lines.append(f"| {pool} | {len(mine)} | {sum(t['health'] == 'up' for t in mine)} |")
        time.sleep(3 * int(INTERVAL.rstrip("s")))  # a few scrapes after the requests, for rate()
        lines += ["", "| dashboard panel | query | series |", "|---|---|---:|"]
        for title, query in panels():
            series = len(prometheus.api("query", query=query)["result"])
            lines.append(f"| {title} | `{query[:80]}{'...' if len(query) > 80 else ''}` | {series} |")
            if not series:
                failures.append(f"panel {title!r}: no series for {query}")
    finally:
        if prometheus is not None:
            prometheus.stop()
        operator.stop()
        kubectl("delete", "prometheus", KPS, "-n", MONITORING, "--ignore-not-found", "--wait=false")
    lines += ["", f"took {time.monotonic() - started:.0f} s; files in {folder}"]
    if failures:
        lines += ["", "FAILED:", *(f"- {f}" for f in failures)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if failures:
        print(f"(logs: {operator.log}, {folder / 'prometheus.log'})", file=sys.stderr)
        raise SystemExit(1)
    shutil.rmtree(folder / "data", ignore_errors=True)


if __name__ == "__main__":
    main()
