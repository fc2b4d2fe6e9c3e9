"""Write the chart's Grafana dashboards (charts/kimik3-operator/dashboards/*.json) from the tables below.

Generated, not hand-edited (`make generate`; `make verify` fails on drift): a panel is one row of
title, unit, what it tells and its queries, so the layout, the datasource and the variables are
written once. The JSON is Grafana's dashboard model (schemaVersion 39) for users' own Grafana; this
project neither builds nor ships Grafana (AGPL).

Every query must return series on the demo's deployment: e2e/monitoring_proof.py asks its Prometheus,
fed by the Prometheus Operator from the chart's monitors, for each one (no `or vector(0)` padding:
the series are the engines', the router's and the operator's own, exported at 0 before traffic).
Labels: `namespace` + `kimik3_deployment` (+ `kimik3_pool`, `kimik3_role`) on every series, the
operator's and the scraped ones alike (operator/kimik3_operator/metrics.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "charts" / "kimik3-operator" / "dashboards"

S = 'namespace=~"$namespace", kimik3_deployment=~"$deployment"'
"""The selector of every serving query: the dashboard's namespace and deployment variables."""
OP = 'and on (namespace, pod) kimik3_operator_build_info'
"""Keeps process_* series to the operator's own pods (they carry build_info)."""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    what: str
    """The panel's description: what it tells and what to do about it."""
    queries: tuple[tuple[str, str], ...]
    """(legend, PromQL) pairs."""
    kind: str = "timeseries"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def quantile(metric: str, by: str, q: str = "0.95") -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{S}}}[5m])))"


SERVING = (
    Row("Traffic and errors", (
        Panel("Requests by route and outcome (router)", "reqps",
              "Client requests the router answered, by API route and outcome (ok, upstream_error, no_engine, "
              "timeout, cut...).",
              (("{{route}} {{outcome}}", f"sum by (route, outcome) (rate(kimik3_router_requests_total{{{S}}}[5m]))"),)),
        Panel("Tokens per second", "short",
              "Prompt tokens prefilled and tokens generated, by role. In P/D the decode's prompt tokens mostly "
              "arrive over NIXL (the P/D share below).",
              (("prompt {{kimik3_role}}", f"sum by (kimik3_role) (rate(vllm:prompt_tokens_total{{{S}}}[5m]))"),
               ("generated {{kimik3_role}}",
                f"sum by (kimik3_role) (rate(vllm:generation_tokens_total{{{S}}}[5m]))"))),
        Panel("Errors by source", "reqps",
              "Where a failure was seen: the front (4xx: auth, size, capacity; 5xx), the router (answers that "
              "were not the client's fault), the engines (requests ended by error or abort) and NIXL (failed KV "
              "transfers). docs/runbooks.md",
              (("front {{code}}", f'sum by (code) (rate(haproxy_frontend_http_responses_total{{{S}, proxy="front", '
                                  f'code=~"4xx|5xx"}}[5m]))'),
               ("router {{outcome}}", f'sum by (outcome) (rate(kimik3_router_requests_total{{{S}, '
                                      f'outcome=~"upstream_error|no_engine|timeout|error|cut|connection_refused"}}[5m]))'),
               ("engine {{kimik3_role}} {{finished_reason}}",
                f'sum by (kimik3_role, finished_reason) (rate(vllm:request_success_total{{{S}, '
                f'finished_reason=~"abort|error"}}[5m]))'),
               ("NIXL failed transfers {{kimik3_role}}",
                f"sum by (kimik3_role) (rate(vllm:nixl_num_failed_transfers_total{{{S}}}[5m]))"))),
        Panel("Streams cut, moved and legs retried (router)", "reqps",
              "A cut stream ended with an SSE error event after it had begun (reason); a stream whose engine "
              "failed mid-way moved to another engine, or could not (outcome; docs/migration.md); a retry sent a "
              "leg again to another engine (kind); retries refused by the budget.",
              (("cut {{reason}}", f"sum by (reason) (rate(kimik3_router_streams_cut_total{{{S}}}[5m]))"),
               ("migration {{outcome}}", f"sum by (outcome) (rate(kimik3_router_migrations_total{{{S}}}[5m]))"),
               ("retried {{kind}}", f"sum by (kind) (rate(kimik3_router_retries_total{{{S}}}[5m]))"),
               ("retry budget spent", f"sum(rate(kimik3_router_retry_budget_exhausted_total{{{S}}}[5m]))"))),
    )),
    Row("Latency", (
        Panel("Time to first token", "s", "p50 and p95 as each engine measures it, by role.",
              (("p95 {{kimik3_role}}", quantile("vllm:time_to_first_token_seconds", "kimik3_role")),
               ("p50 {{kimik3_role}}", quantile("vllm:time_to_first_token_seconds", "kimik3_role", "0.5")))),
        Panel("Inter-token latency", "s", "p50 and p95 by role: what a streaming user feels between tokens "
              "(a DSpark chunk carries several).",
              (("p95 {{kimik3_role}}", quantile("vllm:inter_token_latency_seconds", "kimik3_role")),
               ("p50 {{kimik3_role}}", quantile("vllm:inter_token_latency_seconds", "kimik3_role", "0.5")))),
        Panel("Queue time and waiting requests", "s",
              "p95 of the time a request waits before it runs, by role; the requests waiting now, by reason "
              "(capacity: no room in the batch or KV; deferred: waiting on something else, such as a KV fetch).",
              (("queue p95 {{kimik3_role}}", quantile("vllm:request_queue_time_seconds", "kimik3_role")),
               ("waiting {{kimik3_role}} {{reason}}",
                f"sum by (kimik3_role, reason) (vllm:num_requests_waiting_by_reason{{{S}}})"))),
        Panel("Router: request duration and the time it adds", "s",
              "p95 of a whole request by route, and p99 of the router's own time per stage (headers to the "
              "first upstream request; a chunk relayed). bench/results/router.md has the measured costs.",
              (("request p95 {{route}}", quantile("kimik3_router_request_duration_seconds", "route")),
               ("added p99 {{stage}}", quantile("kimik3_router_added_seconds", "stage", "0.99")))),
    )),
    Row("Cache and speculative decoding", (
        Panel("KV/KDA cache usage", "percentunit",
              "The fullest engine per pool and role. Near 1 the engines queue and preempt: add decode replicas "
              "or shorten contexts (KimiK3KVCacheFull).",
              (("{{kimik3_pool}} {{kimik3_role}}",
                f"max by (kimik3_pool, kimik3_role) (vllm:kv_cache_usage_perc{{{S}}})"),)),
        Panel("Prefix cache hits", "percentunit",
              "Share of queried prompt tokens found in the cache, by role (a K3 hit needs the MLA blocks and a "
              "retained KDA state at that boundary); cached prompt tokens by the tier that supplied them.",
              (("hit rate {{kimik3_role}}",
                f"sum by (kimik3_role) (rate(vllm:prefix_cache_hits_total{{{S}}}[5m])) / "
                f"sum by (kimik3_role) (rate(vllm:prefix_cache_queries_total{{{S}}}[5m]))"),
               ("cached tokens/s {{source}}",
                f"sum by (source) (rate(vllm:prompt_tokens_cached_by_source_total{{{S}}}[5m]))"))),
        Panel("DSpark acceptance per draft position", "percentunit",
              "Share of drafts whose token at each position was accepted: it falls with the position; a drop "
              "at every position means the draft and the model disagree (wrong draft revision?).",
              (("position {{position}}",
                f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{S}}}[5m])) "
                f"/ ignoring (position) group_left "
                f"sum(rate(vllm:spec_decode_num_drafts_total{{{S}}}[5m]))"),)),
        Panel("DSpark mean acceptance length", "short",
              "Tokens each decode step yields: 1 + accepted draft tokens per draft.",
              (("{{kimik3_role}}",
                f"1 + sum by (kimik3_role) (rate(vllm:spec_decode_num_accepted_tokens_total{{{S}}}[5m])) "
                f"/ sum by (kimik3_role) (rate(vllm:spec_decode_num_drafts_total{{{S}}}[5m]))"),)),
    )),
    Row("Prefill/decode hand-off (NIXL)", (
        Panel("NIXL transfer time", "s", "p50 and p95 of one KV/KDA read from a prefill, by the reading pool.",
              (("p95 {{kimik3_pool}}", quantile("vllm:nixl_xfer_time_seconds", "kimik3_pool")),
               ("p50 {{kimik3_pool}}", quantile("vllm:nixl_xfer_time_seconds", "kimik3_pool", "0.5")))),
        Panel("Decode requests by KV fetch stage", "short",
              "Requests a decode holds while their KV comes from a prefill: waiting to start, in progress, done "
              "but not yet scheduled.",
              (("{{stage}}", f"sum by (stage) (vllm:num_requests_kv_fetch_by_stage{{{S}}})"),)),
        Panel("KV leases: expiries and reads after expiry", "short",
              "A prefill frees a request's blocks when the decode has not read them within the lease "
              "(VLLM_NIXL_ABORT_REQUEST_TIMEOUT). A read notified after that is the only sign that a decode "
              "may have read blocks already reused: silently wrong output (KimiK3NixlTransferFailures; "
              "docs/simulator-faults.md).",
              (("leases expired {{kimik3_pool}}",
                f"sum by (kimik3_pool) (rate(vllm:nixl_num_kv_expired_reqs_total{{{S}}}[5m]))"),
               ("reads after expiry {{kimik3_pool}}",
                f"sum by (kimik3_pool) (rate(vllm:nixl_num_notifications_after_expiry_total{{{S}}}[5m]))"))),
        Panel("P/D: share of decode's prompt tokens that arrived from prefill", "percentunit",
              "Below 0.8 the decodes recompute prompts themselves: the Disaggregating condition turns False "
              "(docs/disaggregation.md).",
              (("{{kimik3_deployment}} {{kimik3_pool}}",
                f'sum by (kimik3_deployment, kimik3_pool) (rate(vllm:prompt_tokens_by_source_total{{{S}, '
                f'kimik3_role="decode", source="external_kv_transfer"}}[5m])) / '
                f'sum by (kimik3_deployment, kimik3_pool) (rate(vllm:prompt_tokens_by_source_total{{{S}, '
                f'kimik3_role="decode", source=~"external_kv_transfer|local_compute"}}[5m]))'),)),
    )),
    Row("Router engines", (
        Panel("Routable and healthy engines", "short",
              "Engines (a worker per data-parallel rank) the router may pick, and those whose probe is up and "
              "that are not ejected.",
              (("routable {{role}}", f"sum by (role) (kimik3_router_engines{{{S}}})"),
               ("healthy {{role}}", f"sum by (role) (kimik3_router_engine_healthy{{{S}}})"))),
        Panel("Engine ejections", "short",
              "Engines taken out of rotation after consecutive failures in the last 15 minutes (each comes back "
              "half-open after the ejection time).",
              (("{{role}} {{engine}}",
                f"sum by (role, engine) (increase(kimik3_router_engine_ejections_total{{{S}}}[15m]))"),)),
        Panel("Requests in flight", "short", "Client requests the router serves now, and legs per engine role.",
              (("clients", f"sum(kimik3_router_in_flight_requests{{{S}}})"),
               ("legs {{role}}", f"sum by (role) (kimik3_router_engine_in_flight{{{S}}})"))),
    )),
    Row("Replicas, rollouts and cold start", (
        Panel("Replicas: planned, ready and updated", "short",
              "Per pool and role, from the deployment's status: ready below planned for long fires "
              "KimiK3ReplicasNotReady; updated below planned is a rollout in progress.",
              (("planned {{kimik3_pool}} {{kimik3_role}}",
                f"sum by (kimik3_pool, kimik3_role) (kimik3_deployment_replicas{{{S}}})"),
               ("ready {{kimik3_pool}} {{kimik3_role}}",
                f"sum by (kimik3_pool, kimik3_role) (kimik3_deployment_ready_replicas{{{S}}})"),
               ("updated {{kimik3_pool}} {{kimik3_role}}",
                f"sum by (kimik3_pool, kimik3_role) (kimik3_deployment_updated_replicas{{{S}}})"))),
        Panel("Weights staged", "percentunit",
              "Share of each checkpoint's bytes in the cache volume (status.weights): serving pods wait for "
              "the exact commit staged.",
              (("{{kimik3_deployment}} {{checkpoint}}",
                f"max by (kimik3_deployment, checkpoint) (kimik3_deployment_weights_staged_ratio{{{S}}})"),)),
        Panel("Predicted cold start of a new replica", "s",
              "Scheduled to Ready with a warm compile cache (status coldStart.readySeconds; docs/cold-start.md): "
              "the SLO scaler's lead time.",
              (("{{kimik3_pool}} {{kimik3_role}}",
                f"max by (kimik3_pool, kimik3_role) (kimik3_deployment_cold_start_predicted_seconds{{{S}}})"),)),
        Panel("Conditions", "short", "Each condition of the deployment with its status and reason (1 = current).",
              (("{{type}} {{status}} {{reason}}",
                f"max by (kimik3_deployment, type, status, reason) (kimik3_deployment_condition{{{S}}})"),),
              kind="table"),
    )),
)

OPERATOR = (
    Row("Deployments", (
        Panel("KimiK3Deployments by phase", "short", "As the leader last computed their status.",
              (("{{phase}}", "max by (phase) (kimik3_operator_deployments * on (namespace, pod) group_left "
                             "kimik3_operator_leader)"),)),
        Panel("Replicas short of the plan", "short", "Planned minus ready replicas, per deployment.",
              (("{{namespace}}/{{kimik3_deployment}}", "sum by (namespace, kimik3_deployment) "
                "(kimik3_deployment_replicas - kimik3_deployment_ready_replicas)"),)),
        Panel("Degraded and Ready", "short", "The Degraded and Ready conditions of every deployment (reason).",
              (("{{namespace}}/{{kimik3_deployment}} {{type}} {{status}} {{reason}}",
                'max by (namespace, kimik3_deployment, type, status, reason) '
                '(kimik3_deployment_condition{type=~"Degraded|Ready"})'),), kind="table"),
    )),
    Row("Leader and passes", (
        Panel("Leader", "short", "1 on the replica that holds the Lease; KimiK3OperatorNoLeader fires on none.",
              (("{{pod}}", "max by (pod) (kimik3_operator_leader)"),)),
        Panel("Reconcile passes", "ops", "Passes per second by result.",
              (("{{result}}", "sum by (result) (rate(kimik3_operator_reconcile_duration_seconds_count[5m]))"),)),
        Panel("Reconcile time", "s",
              "p99 of a pass, of its wait on the API server (writes; reads come from informers) and of its own "
              "work (KimiK3OperatorSlowReconcile above 10 s).",
              (("pass p99", "histogram_quantile(0.99, sum by (le) "
                            "(rate(kimik3_operator_reconcile_duration_seconds_bucket[5m])))"),
               ("API p99", "histogram_quantile(0.99, sum by (le) "
                           "(rate(kimik3_operator_reconcile_api_seconds_bucket[5m])))"),
               ("own work p99", "histogram_quantile(0.99, sum by (le) "
                                "(rate(kimik3_operator_reconcile_pure_seconds_bucket[5m])))"))),
        Panel("Reconcile errors by reason", "ops", "Passes that ended in an error (docs/runbooks.md).",
              (("{{reason}}", "sum by (reason) (rate(kimik3_operator_reconcile_errors_total[5m]))"),)),
    )),
    Row("Writes, events and the process", (
        Panel("Applies and deletes of children", "ops", "Server-side applies by child kind: 0 in steady state.",
              (("{{kind}} {{action}}", "sum by (kind, action) (rate(kimik3_operator_applies_total[5m]))"),)),
        Panel("Child changes that asked for a pass", "ops", "By kind; changes within the coalescing window share "
              "one pass.",
              (("{{kind}}", "sum by (kind) (rate(kimik3_operator_child_events_total[5m]))"),)),
        Panel("Operator CPU", "percentunit", "CPU of each operator replica.",
              (("{{pod}}", f"rate(process_cpu_seconds_total[5m]) {OP}"),)),
        Panel("Operator memory", "bytes", "Resident memory of each operator replica.",
              (("{{pod}}", f"process_resident_memory_bytes {OP}"),)),
    )),
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _variable(name: str, label: str, query: str) -> dict[str, object]:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE, "refresh": 2,
            "query": {"query": query, "refId": name}, "definition": query, "includeAll": True, "multi": True,
            "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "sort": 1}


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, object]:
    body: dict[str, object] = {
        "id": pid, "type": panel.kind, "title": panel.title, "description": panel.what, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
                     **({"instant": True, "format": "table"} if panel.kind == "table" else {})}
                    for i, (legend, expr) in enumerate(panel.queries)],
    }
    if panel.kind == "timeseries":
        body["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                           "tooltip": {"mode": "multi", "sort": "desc"}}
    return body


def dashboard(uid: str, title: str, rows: tuple[Row, ...], variables: list[dict[str, object]]) -> dict[str, object]:
    panels: list[dict[str, object]] = []
    y = 0
    for row in rows:
        panels.append({"id": len(panels) + 1, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        for i, panel in enumerate(row.panels):
            panels.append(_panel(panel, len(panels) + 1, 12 * (i % 2), y + 8 * (i // 2)))
        y += 8 * ((len(row.panels) + 1) // 2)
    source = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
              "current": {}, "hide": 0}
    return {"uid": uid, "title": title, "schemaVersion": 39, "editable": True, "graphTooltip": 1,
            "time": {"from": "now-3h", "to": "now"}, "refresh": "30s", "tags": ["kimik3"],
            "templating": {"list": [source, *variables]}, "panels": panels}


DASHBOARDS = {
    "serving.json": dashboard("kimik3-serving", "Kimi K3 serving", SERVING, [
        _variable("namespace", "Namespace", "label_values(kimik3_deployment_phase, namespace)"),
        _variable("deployment", "Deployment",
                  'label_values(kimik3_deployment_phase{namespace=~"$namespace"}, kimik3_deployment)'),
    ]),
    "operator.json": dashboard("kimik3-operator", "Kimi K3 operator", OPERATOR, []),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in set(p.name for p in OUT.glob("*.json")) - set(DASHBOARDS):
        (OUT / stale).unlink()
    for name, board in DASHBOARDS.items():
        (OUT / name).write_text(json.dumps(board, indent=1) + "\n")


if __name__ == "__main__":
    main()
