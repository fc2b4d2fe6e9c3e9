"""Attack: a user string holding `$(VAR)` in a pod's command, args or env.

The kubelet expands `$(VAR)` there from the container's environment, Secret keys included: a model
URI, revision or endpoint naming `$(AWS_SECRET_ACCESS_KEY)` would hand the key to the stager's
argv, its progress record, status, events, or a request to the endpoint's server. The operator
renders every such string through render/kubelet.py `literal`; these tests play the kubelet
(tests/support/kubelet.py, checked here against a line-by-line port of its Go code) over every
container the operator renders, with a Secret's worth of variables in every environment, and get
each user string back exactly as written, and no secret anywhere it was not asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.owned_flags import flag_name
from kimik3_operator.contract.stager import S3_SECRET_KEYS
from kimik3_operator.contract.uri import parse_model_uri
from kimik3_operator.planner import plan_deployment, pool_facts, with_staged
from kimik3_operator.render import Owner, render_children
from kimik3_operator.render.kubelet import literal
from tests.support.cases import base_deployment
from tests.support.kubelet import argv, container_env, expand
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="ns", uid="u-1")
SECRET = "s3cr3t"
"""Every secret value starts so; no user string below holds it."""
SECRET_VARIABLES = ("HF_TOKEN", *S3_SECRET_KEYS)
INJECTED = {"LWS_LEADER_ADDRESS": "10.244.0.2", "LWS_WORKER_INDEX": "1",
            **{name: f"{SECRET}-{name}" for name in SECRET_VARIABLES}}
"""What a pod's environment may hold beside its own list: LeaderWorkerSet's variables, and (the
worst case, as the whole-Secret envFrom the staging pod once had) every credential variable."""
SECRETS = {"hf-token": {"token": f"{SECRET}-hf"}, "s3-creds": {k: f"{SECRET}-{k}" for k in S3_SECRET_KEYS}}
FIELDS = {"status.podIP": "10.244.0.9", "metadata.namespace": "ns"}
TOKENS = ("$", "(", ")", "$(", "$$", "$$(", "$$$", ")$", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "POD_IP",
          "LWS_WORKER_INDEX", "a", "/", "=", "x", "_")
HUB_COMMIT, CONTENT_COMMIT = "4f1c" * 10, "9e" * 32
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def tricky(max_tokens: int = 6) -> st.SearchStrategy[str]:
    """Strings made of the kubelet's syntax and the names of variables a pod holds."""
    return st.lists(st.sampled_from(TOKENS), max_size=max_tokens).map("".join)


def go_expand(text: str, mapping: Callable[[str], str]) -> str:
    """third_party/forked/golang/expansion/expand.go, line by line (Expand, tryReadVariableName)."""
    out, checkpoint, cursor = [], 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                read, is_var, advance = (rest[1:close], True, close + 1) if close > 0 else ("$(", False, 1)
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            out.append(mapping(read) if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def _mapping(env: Mapping[str, str]) -> Callable[[str], str]:
    return lambda name: env[name] if name in env else f"$({name})"  # MappingFuncFor: unknown stays


@SETTINGS
@given(text=st.one_of(tricky(12), st.text(max_size=30)), env=st.dictionaries(st.sampled_from(TOKENS), tricky(2)))
def test_the_tests_kubelet_expands_as_the_kubelets_own_code(text: str, env: dict[str, str]) -> None:
    assert expand(text, env) == go_expand(text, _mapping(env))


@SETTINGS
@given(text=st.one_of(tricky(12), st.text(max_size=30)), env=st.dictionaries(st.sampled_from(TOKENS), tricky(2)))
def test_a_literal_reads_back_as_written_whatever_the_environment(text: str, env: dict[str, str]) -> None:
    assert go_expand(literal(text), _mapping(env)) == text


def test_escaping_only_the_opening_of_a_reference_would_not_do() -> None:
    """`$(` -> `$$(` leaves `$$(X)` as `$$$(X)`: `$`, then X expanded."""
    def naive(s: str) -> str:
        return s.replace("$(", "$$(")
    env = {"HF_TOKEN": SECRET}
    assert expand(naive("$$(HF_TOKEN)"), env) == f"${SECRET}"
    assert expand(literal("$$(HF_TOKEN)"), env) == "$$(HF_TOKEN)"


@st.composite
def deployments(draw: Any) -> dict[str, Any]:
    """A valid deployment whose every free-form string that reaches a pod is tricky."""
    body = base_deployment(name="k3", namespace="ns")
    scheme = draw(st.sampled_from(("hf", "s3", "pvc")))
    model: dict[str, Any] = {
        "hf": {"uri": "hf://moonshotai/Kimi-K3", "authSecretRef": {"name": "hf-token"},
               "revision": draw(tricky().filter(lambda s: not s.startswith("-")))},
        "s3": {"uri": "s3://models/" + draw(tricky()), "authSecretRef": {"name": "s3-creds"}},
        "pvc": {"uri": "pvc://weights/" + draw(tricky())},
    }[scheme]
    if scheme != "pvc" and draw(st.booleans()):
        model["endpoint"] = "https://mirror.example/" + draw(tricky())
    model["servedName"] = draw(tricky().filter(lambda s: not s.startswith("-")))
    body["spec"]["model"] = model
    plain = tricky().filter(lambda s: not flag_name(s).startswith("-"))  # a value, not a flag of vLLM's
    values = st.one_of(tricky().map(lambda s: "--kimik3-test=" + s), plain)
    body["spec"]["engine"] = {
        "extraArgs": draw(st.lists(values, max_size=3)),
        "env": [{"name": f"KIMIK3_TEST_{i}", "value": v} for i, v in enumerate(draw(st.lists(tricky(), max_size=3)))],
    }
    return body


def pod_specs(children: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of every pod template the operator renders."""
    for child in children:
        spec = child.get("spec") or {}
        if "template" in spec:  # a Job, the router's Deployment
            yield child["metadata"]["name"], spec["template"]["spec"]
        for template in ("leaderTemplate", "workerTemplate"):
            if template in spec.get("leaderWorkerTemplate", {}):
                yield child["metadata"]["name"], spec["leaderWorkerTemplate"][template]["spec"]


def started(pod: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, str], list[str]]]:
    """(container, its environment, its argv) as the kubelet starts each container of `pod`."""
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        env = container_env(c, secrets=SECRETS, fields=FIELDS, injected=INJECTED)
        yield c, env, argv(c, env)


def after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@SETTINGS
@given(body=deployments())
def test_every_user_string_reaches_its_container_as_written(body: dict[str, Any]) -> None:
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    location = parse_model_uri(spec.model.uri)
    commit = HUB_COMMIT if location.scheme == "hf" else CONTENT_COMMIT
    plan = with_staged(plan, {"model": commit})
    children = render_children(OWNER, plan)  # the router is rendered whether or not an engine is up
    seen = set()
    for name, pod in pod_specs(children):
        for c, env, args in started(pod):
            seen.add(c["name"])
            assert not [a for a in args if SECRET in a], (name, c["name"], args)
            literal_vars = {e["name"] for e in c.get("env", []) if "value" in e}
            assert not [v for n, v in env.items() if n in literal_vars and SECRET in v], (name, c["name"])
            if c["name"] == "stage":
                assert after(args, "--uri") == spec.model.uri
                if location.scheme == "hf" and spec.model.revision:
                    assert after(args, "--revision") == spec.model.revision
                if location.scheme == "pvc":
                    assert after(args, "--dest") == f"/cache/{location.path}".rstrip("/")
                endpoint = env.get("HF_ENDPOINT") or env.get("AWS_ENDPOINT_URL_S3")
                assert endpoint == spec.model.endpoint
            elif c["name"] == "vllm":
                assert after(args, "--served-model-name") == spec.model.served_name
                extra = list(spec.engine.extra_args)
                assert args[len(args) - len(extra):] == extra
                assert {e.name: env[e.name] for e in spec.engine.env} == {e.name: e.value for e in spec.engine.env}
            elif c["name"] == "wait-model":
                assert args[4] == commit  # python3 -c SCRIPT DEST COMMIT TIMEOUT
            elif c["name"] == "router":  # finds its engines in its own namespace, by labels
                assert after(args, "--namespace") == OWNER.namespace
                assert after(args, "--served-model-name") == spec.model.served_name
                assert after(args, "--selector").startswith("app.kubernetes.io/managed-by=")
    assert {"stage", "wait-model", "vllm", "router"} <= seen
