"""Bad input on the real cluster: hypothesis-generated KimiK3Deployments against the API server
(schema + CEL) and the live operator.

1. 1,000 generated bodies are created with server-side dry run (`dryRun=All`, strict field
   validation, as `kubectl apply` sends them); the API server's verdict must be pydantic's for
   every one: accepted, structural error or rule error, with each rule pydantic names named by
   the API server too (the Rule objects mirror CEL; a disagreement is a bug, and hypothesis
   shrinks it to a minimal body).
2. A sample of the accepted ones is applied for real, with the operator running: a spec that
   plans on the live nodes gets exactly the children render_children gives for that plan (kinds
   and names); one the planner refuses gets no child and a Ready condition whose reason is the
   PlanningError's. The operator stays up and logs no traceback.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections import Counter
from functools import lru_cache
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes import client

from e2e.harness.children import CHILD_RESOURCES
from e2e.harness.kube import apply, condition, get_json, kubectl, wait_for
from e2e.harness.replicas import Replicas
from kimik3_operator.api import GROUP, PLURAL, VERSION, KimiK3Deployment
from kimik3_operator.planner import Plan, PlanningError, plan_deployment
from kimik3_operator.render import Owner, render_children
from kimik3_operator.render.names import MANAGED_BY
from tests.fuzz.corpus import generate
from tests.fuzz.fleet import facts_for
from tests.fuzz.strategies import Case, cases
from tests.fuzz.verdict import Verdict, agree, api_verdict, cluster_verdict

pytestmark = pytest.mark.e2e

DRY_RUN_EXAMPLES = 1000
LIVE_CORPUS = 400
"""Generated cases the live sample is drawn from."""
LIVE_PLANNED, LIVE_REFUSED = 12, 10
MAX_PODS_PER_DEPLOYMENT = 8
"""Keep the sample's fake pods few: the children are what is checked, not the scheduling."""


@lru_cache(maxsize=1)
def live_nodes() -> tuple[dict[str, Any], ...]:
    return tuple(get_json("nodes")["items"])


def plan_live(cr: KimiK3Deployment) -> Plan | PlanningError:
    try:
        # as the operator plans: with the Prometheus the e2e cluster gives it (KEDA roles need one)
        return plan_deployment(cr.spec, facts_for(cr.spec, live_nodes()),
                               prometheus_url=os.environ.get("KIMIK3_PROMETHEUS_URL"))
    except PlanningError as exc:
        return exc


def create(api: client.CustomObjectsApi, namespace: str, body: dict[str, Any], *, dry_run: bool) -> Verdict:
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict",
                                            **({"dry_run": "All"} if dry_run else {}))
        return api_verdict(201, None)
    except client.ApiException as exc:
        try:
            response = json.loads(exc.body)
        except (TypeError, ValueError):
            response = {"message": str(exc.body)}
        return api_verdict(exc.status, response)


def test_api_server_verdict_equals_pydantic(custom_objects: client.CustomObjectsApi, namespace: str,
                                           operator: Path) -> None:
    """`operator`: its first replica serves the webhook (failurePolicy Ignore would hide its absence)."""
    seen: Counter[str] = Counter()
    started = time.monotonic()

    @settings(max_examples=DRY_RUN_EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(cases())
    def one(case: Case) -> None:
        body = copy.deepcopy(case.body)
        body["metadata"]["namespace"] = namespace
        ours, cr = cluster_verdict(body)
        theirs = create(custom_objects, namespace, body, dry_run=True)
        assert agree(ours, theirs), (
            f"API server and pydantic disagree on {case.defect or 'a plausible body'}:\n"
            f"  API server: {theirs.category} {list(theirs.detail)}\n  pydantic:   {ours.category} {list(ours.detail)}")
        seen["generated"] += 1
        seen[{"accepted": "accepted by API", "schema": "rejected by schema", "cel": "rejected by CEL",
              "webhook": "rejected by the webhook"}[theirs.category]] += 1
        if cr is not None:
            outcome = plan_live(cr)
            seen[f"planner: {outcome.reason}" if isinstance(outcome, PlanningError) else "planner: planned"] += 1

    one()
    elapsed = time.monotonic() - started
    print(f"\nfuzz (API server dry run): {seen['generated']} generated in {elapsed:.1f}s")
    for key, count in sorted(seen.items()):
        print(f"  {key}: {count}")
    assert seen["generated"] >= DRY_RUN_EXAMPLES
    assert min(seen["accepted by API"], seen["rejected by schema"], seen["rejected by CEL"]) >= DRY_RUN_EXAMPLES // 10


def sample() -> list[tuple[dict[str, Any], Plan | PlanningError]]:
    """Accepted corpus bodies, renamed apart: the first plannable ones with few pods, and refused
    ones round-robin over planner reasons."""
    planned: list[tuple[dict[str, Any], Plan | PlanningError]] = []
    refused: dict[str, list[tuple[dict[str, Any], Plan | PlanningError]]] = {}
    for i, case in enumerate(generate(LIVE_CORPUS)):
        verdict, cr = cluster_verdict(case.body)
        if cr is None or verdict.category != "accepted":
            continue  # refused at admission: the dry-run test checks those
        body = copy.deepcopy(case.body)
        body["metadata"]["name"] = f"fz{i}-{body['metadata']['name']}"[:63].rstrip("-")
        outcome = plan_live(KimiK3Deployment.model_validate(body))
        if isinstance(outcome, PlanningError):
            refused.setdefault(outcome.reason, []).append((body, outcome))
        elif sum(r.replicas * r.nodes_per_replica for _, r in outcome.role_plans()) <= MAX_PODS_PER_DEPLOYMENT:
            planned.append((body, outcome))
    rotation = [item for batch in zip_longest(*refused.values()) for item in batch if item is not None]
    return planned[:LIVE_PLANNED] + rotation[:LIVE_REFUSED]


def _children(namespace: str) -> dict[str, set[tuple[str, str]]]:
    """Children by owner uid: what carries our managed-by label and a controller reference to a deployment."""
    out: dict[str, set[tuple[str, str]]] = {}
    selector = f"app.kubernetes.io/managed-by={MANAGED_BY}"
    items = get_json(",".join(CHILD_RESOURCES), "-n", namespace, "-l", selector)["items"]
    for obj in items:
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == "KimiK3Deployment":
                out.setdefault(ref["uid"], set()).add((obj["kind"], obj["metadata"]["name"]))
    return out


PD_ROUTER = re.compile(r"^(.+-router)-[0-9a-f]{10}$")


def _revisionless(kind: str, name: str) -> tuple[str, str]:
    """A P/D router Deployment is named after its revision, whose hash takes in the commit the
    staging Job resolves (unknown before it runs): compare it by the router's name."""
    return (kind, PD_ROUTER.sub(r"\1-<revision>", name) if kind == "Deployment" else name)


def _logs(folder: Path) -> dict[Path, str]:
    return {log: log.read_text() for log in folder.glob("*.log")}


def test_live_operator_on_a_sample(custom_objects: client.CustomObjectsApi, namespace: str,
                                   operator: Path, replicas: Replicas) -> None:
    started, logs_before = time.monotonic(), _logs(operator)
    alive_before = {slot: r.proc.pid for slot, r in replicas.slots.items() if r.alive()}
    chosen = sample()
    reasons = Counter(o.reason if isinstance(o, PlanningError) else "planned" for _, o in chosen)
    assert reasons["planned"] >= LIVE_PLANNED // 2 and len(reasons) >= 3, reasons
    expected: dict[str, set[tuple[str, str]] | str] = {}
    for body, outcome in chosen:
        name = body["metadata"]["name"]
        if isinstance(outcome, PlanningError):
            expected[name] = outcome.reason
        else:
            owner = Owner(name=name, namespace=namespace, uid="")
            # `_children` finds children by their owner reference: a retained cache claim has none
            expected[name] = {_revisionless(c["kind"], c["metadata"]["name"]) for c in render_children(owner, outcome)
                              if c["metadata"].get("ownerReferences")}

    def mismatches() -> dict[str, str]:
        assert {s: r.proc.pid for s, r in replicas.slots.items() if r.alive()} == alive_before, \
            "an operator replica exited or restarted"
        live = {o["metadata"]["name"]: o for o in get_json("k3", "-n", namespace)["items"]}
        children = _children(namespace)
        wrong = {}
        for name, want in expected.items():
            cr = live[name]
            got = {_revisionless(*c) for c in children.get(cr["metadata"]["uid"], set())}
            ready = condition(cr, "Ready")
            observed = (cr.get("status") or {}).get("observedGeneration") == cr["metadata"]["generation"]
            if isinstance(want, str):
                if not observed or not ready or ready["reason"] != want or got:
                    wrong[name] = f"want reason {want} and no child; got {ready and ready['reason']}, {sorted(got)}"
            elif not observed or got != want or (cr["status"].get("phase") == "Failed"):
                wrong[name] = f"want {sorted(want)}; got {sorted(got)}, phase {(cr.get('status') or {}).get('phase')}"
        return wrong

    try:
        # A pvc:// checkpoint lives on a claim the user made: make the claims the sample names
        # (the default StorageClass binds them), or their verification pods could never schedule.
        spec_uris = [[(b["spec"]["model"].get("uri") or ""), ((b["spec"].get("engine") or {}).get("speculative")
                                                               or {}).get("draftModelUri") or ""] for b, _ in chosen]
        for claim in sorted({u.removeprefix("pvc://").split("/")[0] for us in spec_uris for u in us
                             if u.startswith("pvc://")}):
            apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": claim, "namespace": namespace},
                   "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}}})
        # Likewise the Secrets their staging Jobs read the Hub token from.
        for secret in sorted({ref["name"] for b, _ in chosen if (ref := b["spec"]["model"].get("authSecretRef"))}):
            kubectl("-n", namespace, "create", "secret", "generic", secret, "--from-literal=token=hf_e2e")
        for body, _ in chosen:
            body["metadata"]["namespace"] = namespace
            verdict = create(custom_objects, namespace, body, dry_run=False)
            assert verdict.category == "accepted", verdict.detail
        try:
            wait_for("every sampled deployment to settle as planned", lambda: not mismatches(), timeout=240, interval=2)
        except AssertionError:
            raise AssertionError(json.dumps(mismatches(), indent=1)) from None
        replicas.leader().wait_resyncs(2)  # passes later nothing changed: no extra child, no flapping status
        assert not mismatches()
        for path, text in _logs(operator).items():
            new = text[len(logs_before.get(path, "")):]
            assert "Traceback" not in new, new[new.index("Traceback"):][:4000]
        print(f"\nfuzz (live operator): {len(chosen)} deployments {dict(reasons)}, "
              f"{sum(len(v) for v in expected.values() if isinstance(v, set))} children, "
              f"settled in {time.monotonic() - started:.1f}s")
    finally:
        # The sample's pods hold GPUs of the shared fake nodes: free them for the tests after this one.
        kubectl("delete", "k3", "--all", "-n", namespace, "--wait=true", "--timeout=120s", check=False, timeout=150)
        wait_for("the sample's pods to be gone", lambda: not get_json("pods", "-n", namespace)["items"],
                 timeout=180, interval=2)
