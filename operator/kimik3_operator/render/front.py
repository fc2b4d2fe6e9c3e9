"""The front of every router pod: HAProxy, the only listener clients reach.

Why: vllm-router 0.1.17 serves its admin routes (`/workers`, `/add_worker`, `/remove_worker`,
`/flush_cache`, ...) on the same port as inference and checks nothing unless it is given
`--api-key-validation-urls` (src/server.rs, build_app and authorize_request). One
`DELETE /workers/<decode>` from any client leaves every request at 503 while the router's
/liveness stays 200. So the router listens on the pod's loopback only (ROUTER_LOOPBACK_PORT), and
the front passes an allowlist of (method, exact path) and nothing else: a path trick (`//workers`,
`%2Fworkers`, `/v1/models/../workers`, an absolute-form request line) matches no row and gets 404.
The operator needs no admin route: the router finds the engines itself (render/router.py).

What else the front does, each because the router cannot (docs/front-door.md):
- an optional API key, compared with `secure_memcmp` (constant time for equal lengths) against the
  environment, and removed before the request goes on;
- admission: `maxconn` on the one server is a true concurrency limit (vllm-router's own
  `--max-concurrent-requests` is a token bucket refilled per second, src/middleware.rs, so it
  limits a rate, not what is in flight), a bounded queue (429 with Retry-After when full) and a
  queue timeout (503 with Retry-After);
- oversized requests: a body larger than maxRequestBytes (its Content-Length) gets 413 before the
  router reads any of it (the router buffers whole bodies; its own cap, the same figure, catches a
  chunked one);
- slow or oversized clients: the request headers, and the body up to BUFFER_BYTES, must arrive
  within HEADERS_SECONDS (`http-request wait-for-body`; else 408), headers must fit the buffer (else
  400), and CONNECTIONS bounds what the front holds (its memory limit covers that many full buffers):
  a slow client holds a connection of the front, not a slot of the router (a body larger than the
  buffer is passed on as it comes);
- no protocol switch: an `Upgrade` header is removed, so the router can never turn a connection
  into a tunnel past these rules;
- metrics (HAProxy's Prometheus exporter: requests, 4xx/5xx, queue, refusals) and its own
  liveness answer, on METRICS_PORT, a port without inference.

The configuration travels in the container's environment and is written to /tmp at start, so a
change of it rolls the router pods, as a change of the router's flags does.
"""

from __future__ import annotations

import json
from typing import Any

from ..planner import FrontPlan, RouterPlan

CONTAINER = "front"
"""The front's container name (the router's is render/router.py's COMPONENT)."""
FRONT_PORT = 8000
"""Where clients connect (the Service's `http`)."""
ROUTER_LOOPBACK_PORT = 8001
"""Where the router listens, on 127.0.0.1 of the pod only."""
METRICS_PORT = 29001
"""The front's own metrics and liveness (`front-metrics`)."""
HEALTH_PATH = "/front/healthz"
"""Answered by the front itself (HAProxy's monitor-uri): alive whatever the router does."""
CONFIG_ENV = "KIMIK3_FRONT_CONFIG"
API_KEY_ENV = "KIMIK3_API_KEY"
HEADERS_SECONDS = 10
"""How long a client may take to send its request headers."""
CLIENT_IDLE_SECONDS = 120
"""How long a client may leave a connection idle while it sends its body or reads an answer."""
ANSWER_SECONDS = 1800
"""The longest a request may take: vllm-router's own request timeout (its --request-timeout-secs
default, py_src/vllm_router/router_args.py), so the front never cuts a generation the router allows."""
RETRY_AFTER_SECONDS = 1
THREADS = 2
BUFFER_BYTES = 65536
"""HAProxy's buffer (tune.bufsize, default 16 KiB): a whole request of a few thousand words of
prompt is buffered before it takes a router slot."""
CONNECTIONS = 4096
"""Client connections each front holds at once; at most one buffer each: ~270 MB at worst, inside
MEMORY_LIMIT."""
MEMORY_LIMIT = "512Mi"

ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/messages"),
    ("GET", "/v1/models"),
)
"""The client routes: one row per route. kimik3-router serves the first three through the P/D hand-off
(router/src/routes.rs; the Responses API without a response store: `store` forced off,
`previous_response_id` and `background` refused with 400, docs/router.md "Routes") and answers
/v1/messages with a 501 that names the route to use, so a client of the Anthropic API reads why
instead of a bare 404. The stored-response routes (`GET /v1/responses/{id}`, `.../cancel`), /generate,
embeddings and rerank are left out: nothing is stored, and this model serves none of the others."""
MODEL_PATH = r"^/v1/models/[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,127}$"
"""GET /v1/models/{id}: one model by name, a single path segment that cannot start with a dot (so
no `..`, no `%`-escape, no second segment). kimik3-router answers it from its served name; a name with
a `/` is listed by GET /v1/models only."""
PROBES: tuple[str, ...] = ("/health", "/liveness", "/readiness")
"""GET routes anyone may call without a key: the kubelet's probes and load balancers' checks."""


def _error(status: int, kind: str, message: str, retry: bool = False) -> str:
    """An HAProxy answer in OpenAI's error shape, so SDKs show the message."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}})
    headers = f" hdr Retry-After {RETRY_AFTER_SECONDS}" if retry else ""
    return f"status {status} content-type application/json string '{body}'{headers}"


def _too_large(plan: FrontPlan) -> str:
    return f"the request body is larger than this endpoint takes ({plan.max_request_bytes} bytes)"


def front_config(plan: FrontPlan, drain_seconds: int) -> str:
    """haproxy.cfg for one router pod (checked by `haproxy -c` in the tests)."""
    acls = [*(f"acl route_{i} path {path}" for i, (_, path) in enumerate(ROUTES)),
            f"acl route_model path_reg {MODEL_PATH}"]
    allowed = " || ".join([*(f"route_{i} METH_{method}" for i, (method, _) in enumerate(ROUTES)),
                           "route_model METH_GET"])
    lines = [
        "global",
        f"    nbthread {THREADS}",
        f"    maxconn {CONNECTIONS}",
        f"    tune.bufsize {BUFFER_BYTES}",
        f"    hard-stop-after {drain_seconds}s",
        "    log stdout format raw local0 info",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlog-normal",  # errors and refusals only; never a header (no key in the logs)
        "    option dontlognull",  # nor a connection that sent nothing
        # Tokens go out as they come: without it HAProxy holds small chunks back for more (MSG_MORE)
        # and a stream arrives in bursts.
        "    option http-no-delay",
        "    timeout connect 2s",
        f"    timeout http-request {HEADERS_SECONDS}s",
        f"    timeout client {CLIENT_IDLE_SECONDS}s",
        f"    timeout server {ANSWER_SECONDS}s",
        f"    timeout queue {plan.queue_timeout_seconds}s",
        "    timeout http-keep-alive 60s",
        "    timeout client-fin 5s",
        "",
        "frontend front",
        f"    bind 0.0.0.0:{FRONT_PORT}",
        f"    acl probe path {' '.join(PROBES)}",
        "    http-request set-log-level silent if probe",  # an unready router's probes are no news
        *(f"    {acl}" for acl in acls),
        f"    http-request return {_error(404, 'not_found', 'no such route')} unless probe METH_GET || {allowed}",
        "    http-request del-header upgrade",
    ]
    if plan.api_key is not None:
        lines += [
            f'    http-request set-var-fmt(txn.expected) "Bearer %[env({API_KEY_ENV})]"',
            f"    acl key_set env({API_KEY_ENV}) -m len gt 0",
            "    acl key_ok req.fhdr(authorization),secure_memcmp(txn.expected)",
            f"    http-request return {_error(401, 'invalid_request_error', 'a valid API key is required')}"
            " hdr WWW-Authenticate Bearer unless probe || key_set key_ok",
            "    http-request del-header authorization",
        ]
    # A larger body is refused from its headers, before the router holds any of it (it reads a whole
    # body into memory, src/server.rs); a chunked one meets the router's own cap, the same figure.
    lines.append(f"    http-request return {_error(413, 'invalid_request_error', _too_large(plan))}"
                 f" if {{ req.hdr_val(content-length) gt {plan.max_request_bytes} }}")
    # Then the body, up to a buffer, must arrive within HEADERS_SECONDS before the request takes a
    # router slot (what `option http-buffer-request` does, but after the refusals above: that option
    # waits before any rule, so a client announcing a huge body would hold the answer for 10 s).
    lines.append(f"    http-request wait-for-body time {HEADERS_SECONDS}s")
    if plan.max_concurrent is not None:
        lines += [
            # Full when every slot is taken and the queue holds queue_size (0: no queue at all).
            f"    http-request return {_error(429, 'rate_limit_exceeded', 'the router is at capacity', retry=True)}"
            f" if !probe {{ srv_conn(router/router) ge {plan.max_concurrent} }}"
            f" {{ queue(router) ge {plan.queue_size} }}",
        ]
    unavailable = f"    http-error {_error(503, 'server_error', 'the router is unavailable or busy', retry=True)}"
    lines += [
        # The health checks never wait behind the requests: a full router is busy, not unready.
        "    use_backend probes if probe",
        "    default_backend router",
        "",
        "backend router",
        unavailable,
        f"    server router 127.0.0.1:{ROUTER_LOOPBACK_PORT}"
        + (f" maxconn {plan.max_concurrent}" if plan.max_concurrent is not None else ""),
        "",
        "backend probes",
        unavailable,
        f"    server router 127.0.0.1:{ROUTER_LOOPBACK_PORT}",
        "",
        "frontend metrics",
        f"    bind 0.0.0.0:{METRICS_PORT}",
        f"    monitor-uri {HEALTH_PATH}",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        f"    http-request return {_error(404, 'not_found', 'no such route')}",
        "",
    ]
    return "\n".join(lines)


def front_container(router: RouterPlan, pre_stop_seconds: int) -> dict[str, Any]:
    """The front's container: the router image (it carries HAProxy), the configuration from the
    environment, and a drain that outlives the endpoints' update: after `pre_stop_seconds` it stops
    accepting (SIGUSR1, HAProxy's soft stop) and lets every open request finish, up to the drain
    budget (hard-stop-after). The router behind it stops a little later (render/router.py)."""
    plan = router.front
    config = front_config(plan, router.drain_seconds)
    env: list[dict[str, Any]] = [{"name": CONFIG_ENV, "value": config}]
    if plan.api_key is not None:
        name, key = plan.api_key
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "front-metrics"}, "periodSeconds": 5, "timeoutSeconds": 2}
    return {
        "name": CONTAINER,
        "image": router.image,
        "command": ["/bin/sh", "-c",
                    f'printf "%s\\n" "${CONFIG_ENV}" >/tmp/front.cfg && exec haproxy -db -f /tmp/front.cfg'],
        "env": env,
        "ports": [{"name": "http", "containerPort": FRONT_PORT, "protocol": "TCP"},
                  {"name": "front-metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": {**probe, "failureThreshold": 3},
        # Ready once the router behind it has a healthy engine of each kind (its /readiness).
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 5,
                           "timeoutSeconds": 2, "failureThreshold": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "16Mi"},
                      "limits": {"memory": MEMORY_LIMIT, "ephemeral-storage": "64Mi"}},
        "lifecycle": {"preStop": {"exec": {"command": [
            "/bin/sh", "-c", f"sleep {pre_stop_seconds}; kill -USR1 1; while kill -0 1; do sleep 1; done"]}}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
