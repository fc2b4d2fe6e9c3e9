"""The `kimik3` command: generate the CRD, plan a deployment, run the operator."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from . import __version__
from .api import KimiK3Deployment, first_error
from .api.crd import CHART_CRD_PATH, CRD_FILENAME, chart_crd_template, crd_yaml
from .planner import Plan, PlanningError, plan_deployment, pool_facts, with_staged
from .planner.capacity import gpus_used, pool_capacity
from .render.names import LABEL_DEPLOYMENT, Owner, deployment_label
from .render.report import plan_report, plan_table
from .render.roll_diff import roll_diff
from .render.weights import job_name


def _crd(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / CRD_FILENAME).write_text(text)
    print(out / CRD_FILENAME)
    if args.chart:
        target = Path(args.chart) / CHART_CRD_PATH
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(chart_crd_template())
        print(target)
    return 0


NOT_FITTING = 3
"""`kimik3 plan`'s exit code when the spec plans but the nodes lack room for it now (2: it cannot plan)."""


class InputError(Exception):
    """What `kimik3 plan` was given cannot be read as asked: one line, exit 1."""


def nodes_from(text: str, source: str) -> list[dict[str, Any]]:
    """Node objects from what users have at hand: `kubectl get nodes -o yaml` or `-o json` (a
    List), a multi-document YAML stream of Nodes (as e2e/cluster/nodes/*.yaml are), or one Node.
    Anything else in it is refused by name, so a wrong file never plans as "no nodes"."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not YAML or JSON: {' '.join(str(exc).split())}") from exc
    nodes: list[dict[str, Any]] = []
    for index, doc in enumerate(docs, 1):
        if doc is None:
            continue  # an empty document: a trailing `---`
        where = f"{source}: document {index}" if len(docs) > 1 else source
        if not isinstance(doc, dict):
            raise InputError(f"{where} is not an object")
        kind = doc.get("kind")
        listed = isinstance(kind, str) and kind.endswith("List")
        items = doc.get("items") if listed else [doc]
        if not isinstance(items, list):
            raise InputError(f"{where}: a {kind} without a list of items")
        for position, item in enumerate(items):
            found = item.get("kind", "Node") if isinstance(item, dict) else type(item).__name__
            if found != "Node":
                at = f" item {position}" if listed else ""
                raise InputError(f"{where}{at} is a {found}, not a Node")
            nodes.append(item)
    return nodes


def _load_cluster(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and the pods holding GPUs on them: from the live cluster, or the nodes of a file or
    `-` for stdin (whose GPUs then all count as free)."""
    if args.nodes is None:
        cluster = _live_cluster(args.context)
        return cluster.list_nodes(), cluster.list_active_pods()
    text = sys.stdin.read() if args.nodes == "-" else Path(args.nodes).read_text()
    return nodes_from(text, "stdin" if args.nodes == "-" else args.nodes), []


def _live_cluster(context: str | None = None) -> Any:
    """The live cluster, from $KUBECONFIG (its `context`) or in-cluster; no configuration is one line."""
    from .k8s import Cluster, NoClusterError, api_client

    try:
        return Cluster(api_client(context=context))
    except NoClusterError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "no configuration"
        raise InputError(f"no cluster to read ({first}): set KUBECONFIG or --context, or give the nodes "
                         "with --nodes FILE") from None


def _target(args: argparse.Namespace) -> tuple[str, str] | None:
    """(namespace, name) of a live deployment: NAMESPACE/NAME, or NAME with -n NAMESPACE."""
    if not args.target:
        return None
    namespace, slash, name = args.target.rpartition("/")
    if not slash:
        namespace = args.namespace or ""
    elif args.namespace and args.namespace != namespace:
        raise InputError(f"{args.target!r} names namespace {namespace!r} but -n says {args.namespace!r}")
    if not namespace or not name or "/" in namespace:
        raise InputError(f"{args.target!r}: expected NAMESPACE/NAME, or NAME with -n NAMESPACE")
    return namespace, name


def _deployment(args: argparse.Namespace) -> Any:
    """The KimiK3Deployment to plan (unvalidated): `-f FILE`, or NAMESPACE/NAME read from the live cluster."""
    if bool(args.file) == bool(args.target):
        raise InputError("give either -f FILE or NAMESPACE/NAME of a deployment in the cluster")
    if args.file:
        return yaml.safe_load(Path(args.file).read_text())
    target = _target(args)
    assert target is not None
    namespace, name = target
    from .k8s import MissingApiError

    try:
        body = _live_cluster(args.context).read_deployment(namespace, name)
    except MissingApiError as exc:
        raise InputError(f"{exc}: is the operator's CRD installed?") from exc
    if body is None:
        raise InputError(f"no KimiK3Deployment {namespace}/{name} in the cluster")
    return body


def staged_commits(plan: Plan, owner: Owner, status: dict[str, Any]) -> dict[str, str] | None:
    """The commits the operator staged for this plan's checkpoints, from the deployment's status
    (`status.weights`, one entry per source and staging Job): None unless every source is Staged,
    the same rule as the operator's (reconcile/weights_status.py `all_staged`), whose plan then
    carries them in its compatibility hash."""
    entries = {(w.get("name"), w.get("job")): w for w in status.get("weights") or []}
    commits: dict[str, str] = {}
    for source in plan.weights.sources:
        entry = entries.get((source.name, job_name(owner, source)))
        if not entry or entry.get("phase") != "Staged" or not entry.get("commit"):
            return None
        commits[source.name] = str(entry["commit"])
    return commits


def _plan(args: argparse.Namespace) -> int:
    try:
        if args.diff and not args.target:
            raise InputError("--diff compares with a deployment in the cluster: give NAMESPACE/NAME")
        body = _deployment(args)
        cr = KimiK3Deployment.model_validate(body)
        spec = cr.spec
        nodes, pods = _load_cluster(args)
        facts = {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools}
        plan = plan_deployment(spec, facts)
        owner = Owner(name=cr.metadata.name, namespace=cr.metadata.namespace, uid="")
        status = body.get("status") or {}
        if args.target and (commits := staged_commits(plan, owner, status)) is not None:
            plan = with_staged(plan, commits)  # as the operator plans it once its checkpoints are staged
        if args.diff:
            live_hash = (status.get("engine") or {}).get("compatibilityHash")
            workloads = _live_cluster(args.context).list_workloads(owner.namespace, deployment_label(owner))
            print("\n".join(roll_diff(plan, owner, live_hash, workloads)))
            return 0
    except ValidationError as exc:
        print(f"InvalidSpec: {first_error(exc)}", file=sys.stderr)
        return 2
    except PlanningError as exc:
        print(f"{exc.reason}: {exc.message}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # The deployment's own pods (a re-plan of a running one) leave their GPUs to it.
    capacity = pool_capacity(plan, facts, gpus_used(pods, lambda p: _owned_by(p, owner)))
    if args.output == "json":
        print(json.dumps({**plan_report(plan), "capacity": capacity}, indent=2))
    else:
        print(plan_table(plan, capacity))
    return 0 if capacity["fits"] else NOT_FITTING


def _owned_by(pod: dict[str, Any], owner: Owner) -> bool:
    meta = pod.get("metadata") or {}
    return (meta.get("namespace") == owner.namespace
            and (meta.get("labels") or {}).get(LABEL_DEPLOYMENT) == deployment_label(owner))


def _run(args: argparse.Namespace) -> int:
    from .malloc_arenas import limit_malloc_arenas

    limit_malloc_arenas()  # first: before any thread of the operator allocates
    from .k8s.identity import IDENTITY
    from .k8s.lease import LeaseConfig, default_lease_namespace
    from .reconcile.runner import run_operator  # imports kopf: only for this command
    from .reconcile.settings import OperatorConfig

    try:
        log_level = _flag_or_env(args.log_level, "KIMIK3_LOG_LEVEL", "INFO", LOG_LEVELS)
        log_format = _flag_or_env(args.log_format, "KIMIK3_LOG_FORMAT", "text", LOG_FORMATS)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    healthy, services = None, []
    if args.webhook_port is not None:
        from .webhook import CertificateFiles, WebhookServer

        if bool(args.webhook_cert and args.webhook_key) == bool(args.webhook_cert_secret):
            print("error: --webhook-port needs either --webhook-cert and --webhook-key (files, e.g. from "
                  "cert-manager) or --webhook-cert-secret (a certificate the operator keeps)", file=sys.stderr)
            return 2
        if args.webhook_cert_secret:
            if not (args.webhook_configuration and args.webhook_cert_host):
                print("error: --webhook-cert-secret needs --webhook-configuration and --webhook-cert-host",
                      file=sys.stderr)
                return 2
            keeper = _certificate_keeper(args)
            files = CertificateFiles(keeper.certfile, keeper.keyfile)
            services.append(keeper)
        else:
            files = CertificateFiles(args.webhook_cert, args.webhook_key)
        webhook = WebhookServer(args.webhook_host, args.webhook_port, files)
        healthy = webhook.alive
        services.append(webhook)
    # In a pod, another replica may always exist (scaling, a stuck old pod): elect unless told
    # not to. On a workstation `kimik3 run` is one developer's process: act at once, no Lease RBAC.
    elect = args.leader_elect if args.leader_elect is not None else "KUBERNETES_SERVICE_HOST" in os.environ
    lease = LeaseConfig(name=args.lease_name, namespace=args.lease_namespace or default_lease_namespace(),
                        identity=IDENTITY) if elect else None
    config = OperatorConfig.from_env(namespaces=tuple(args.namespace or ()), metrics_port=args.metrics_port,
                                     lease=lease, prometheus_url=args.prometheus_url,
                                     resync_seconds=args.resync_seconds, retry_seconds=args.retry_seconds,
                                     workers=args.workers, tools_image=args.tools_image,
                                     coalesce_seconds=args.coalesce_seconds, router_image=args.router_image,
                                     vllm_router_image=args.vllm_router_image)
    return run_operator(config, liveness=args.liveness, log_level=log_level, log_format=log_format,
                        healthy=healthy, services=services)


def _certificate_keeper(args: argparse.Namespace) -> Any:
    import tempfile

    from .k8s import api_client
    from .k8s.lease import default_lease_namespace
    from .k8s.webhook_cert_keeper import CertificateKeeper

    directory = Path(tempfile.mkdtemp(prefix="kimik3-webhook-"))  # 0700, in the pod's /tmp emptyDir
    return CertificateKeeper(api_client(), default_lease_namespace(), args.webhook_cert_secret,
                             args.webhook_configuration, frozenset(args.webhook_cert_host), directory,
                             check_seconds=args.webhook_cert_check_seconds)


def _check_install(args: argparse.Namespace) -> int:
    from .k8s import api_client
    from .k8s.install_check import check_install

    ok = check_install(api_client(), args.namespace, args.deployment, webhook=args.webhook)
    return 0 if ok else 1


def _preflight(args: argparse.Namespace) -> int:
    from .k8s import NoClusterError, api_client
    from .k8s.preflight import ClusterUnreadable, cluster_view
    from .planner.preflight import preflight, table

    try:
        view = cluster_view(api_client(context=args.context))
    except NoClusterError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "no configuration"
        print(f"error: no cluster to check ({first}): set KUBECONFIG or --context", file=sys.stderr)
        return 2
    except ClusterUnreadable as exc:
        print(f"error: the cluster could not be read: {exc}", file=sys.stderr)
        return 2
    findings = preflight(view)
    if args.output == "json":
        print(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        print(table(findings))
    return 1 if any(f.verdict == "missing" for f in findings) else 0


def _flag_or_env(given: str | None, name: str, default: str, choices: tuple[str, ...]) -> str:
    """The flag's value, else the environment's, else the default; a bad environment value is an error."""
    value = given or os.environ.get(name) or default
    if value not in choices:
        raise ValueError(f"${name}={value!r}: choose from {', '.join(choices)}")
    return value


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0")
    return value


def not_negative(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:  # NaN and infinity too
        raise argparse.ArgumentTypeError(f"{text}: must be a number of 0 or more")
    return value


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kimik3", description=__doc__)
    p.add_argument("--version", action="version", version=f"kimik3 {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    crd = sub.add_parser("crd", help="write the KimiK3Deployment CRD generated from the API models")
    crd.add_argument("--out", default="crds", help="directory to write into, or - for stdout")
    crd.add_argument("--chart", default="charts/kimik3-operator",
                     help="also write the chart's templated copy here ('' to skip)")
    crd.set_defaults(func=_crd)
    plan = sub.add_parser("plan", help="show what a KimiK3Deployment would become, without applying it")
    plan.add_argument("target", nargs="?", metavar="NAMESPACE/NAME",
                      help="a KimiK3Deployment in the live cluster (instead of -f); NAME with -n")
    plan.add_argument("-n", "--namespace", help="the namespace of a NAME given alone")
    plan.add_argument("--context", help="the kubeconfig context to use (default: the current one)")
    plan.add_argument("--diff", action="store_true",
                      help="say which roles applying the plan would roll, and why (needs NAMESPACE/NAME)")
    plan.add_argument("-f", "--file", help="the KimiK3Deployment YAML")
    plan.add_argument("--nodes", help="Node objects: `kubectl get nodes -o yaml` or `-o json`, a multi-document "
                                       "YAML stream of Nodes, or one Node; - reads stdin (default: the live cluster)")
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table")
    plan.set_defaults(func=_plan)
    run = sub.add_parser("run", help="run the operator against the current kubeconfig or in-cluster")
    run.add_argument("--namespace", action="append", help="watch this namespace (repeatable; default: all)")
    run.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    run.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--webhook-port", type=int, default=None,
                     help="serve the validating admission webhook (HTTPS, path /validate) on this port")
    run.add_argument("--webhook-host", default="0.0.0.0", help="address the webhook listens on")
    run.add_argument("--webhook-cert", help="PEM certificate (chain) of the webhook")
    run.add_argument("--webhook-key", help="PEM private key of the webhook")
    run.add_argument("--webhook-cert-secret",
                     help="instead of files: keep the webhook's CA and certificate in this Secret of the "
                          "operator's namespace ($POD_NAMESPACE), made and renewed by the operator")
    run.add_argument("--webhook-configuration",
                     help="with --webhook-cert-secret: the ValidatingWebhookConfiguration whose caBundle to keep")
    run.add_argument("--webhook-cert-host", action="append",
                     help="with --webhook-cert-secret: a DNS name or IP address the certificate is for (repeatable)")
    run.add_argument("--webhook-cert-check-seconds", type=float, default=300.0,
                     help="with --webhook-cert-secret: how often the Secret and the caBundle are checked "
                          "(renewed near expiry, set back when changed)")
    run.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=None,
                     help="act only while holding a Lease, so replicas take turns "
                          "(default: on in a pod, off elsewhere)")
    run.add_argument("--lease-name", default="kimik3-operator", help="the Lease of the leader election")
    run.add_argument("--lease-namespace", default=None,
                     help="its namespace (default: $POD_NAMESPACE, else the pod's or the kubeconfig "
                          "context's namespace, else default)")
    run.add_argument("--prometheus-url", default=None,
                     help="Prometheus's HTTP API for the SLO scaler and KEDA triggers, e.g. "
                          "http://prometheus.monitoring:9090 (default: $KIMIK3_PROMETHEUS_URL; a deployment's "
                          "spec.autoscaling.prometheusUrl wins)")
    run.add_argument("--log-level", choices=LOG_LEVELS, default=None, help="default: $KIMIK3_LOG_LEVEL, else INFO")
    run.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                     help="text, or json: one JSON object a line (message, timestamp, severity; kopf's "
                          "per-object lines add the object's reference under k8s) "
                          "(default: $KIMIK3_LOG_FORMAT, else text)")
    run.add_argument("--resync-seconds", type=positive, default=None,
                     help="reconcile every deployment at least this often (default: $KIMIK3_RESYNC_SECONDS, else 30)")
    run.add_argument("--retry-seconds", type=positive, default=None,
                     help="retry a pass that failed on an API error after this delay (default: "
                          "$KIMIK3_RETRY_SECONDS, else 10)")
    run.add_argument("--workers", type=int, choices=range(1, 65), metavar="N", default=None,
                     help="deployments reconciled at once (default: $KIMIK3_WORKERS, else 4)")
    run.add_argument("--coalesce-seconds", type=not_negative, default=None,
                     help="start a deployment's pass this long after a change to one of its children, one pass "
                          "for the changes of that while; 0: at once (default: $KIMIK3_COALESCE_SECONDS, else 0.5)")
    run.add_argument("--tools-image", default=None,
                     help="image of the staging Jobs and the serving pods' weights wait: the operator's own "
                          "(default: $KIMIK3_TOOLS_IMAGE, else the image of this version)")
    run.add_argument("--router-image", default=None,
                     help="the router pods' image where a deployment names none (spec.router.image) and "
                          "implementation is KimiK3Router (default: $KIMIK3_ROUTER_IMAGE, else this version's)")
    run.add_argument("--vllm-router-image", default=None,
                     help="likewise for implementation VllmRouter (default: $KIMIK3_VLLM_ROUTER_IMAGE, else the "
                          "pinned vllm-router image)")
    run.set_defaults(func=_run)
    pre = sub.add_parser("preflight", help="say what the cluster lacks for a KimiK3Deployment (LeaderWorkerSet, GPU "
                                           "labels, NVLink cliques, ComputeDomains, RDMA, storage, the optional "
                                           "add-ons); exit 1 when something every deployment needs is missing")
    pre.add_argument("--context", help="the kubeconfig context to use (default: the current one)")
    pre.add_argument("-o", "--output", choices=("table", "json"), default="table")
    pre.set_defaults(func=_preflight)
    check = sub.add_parser("check-install", help="check an installed operator (the chart's `helm test`): the CRD "
                                                 "is served, the webhook answers, the operator is ready")
    check.add_argument("--namespace", required=True, help="the release namespace")
    check.add_argument("--deployment", required=True, help="the operator's Deployment")
    check.add_argument("--webhook", action=argparse.BooleanOptionalAction, default=True,
                       help="check that the webhook refuses a spec only it refuses (--no-webhook when "
                            "webhook.enabled is false)")
    check.set_defaults(func=_check_install)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
