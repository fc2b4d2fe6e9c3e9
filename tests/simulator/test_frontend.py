"""What the simulator's HTTP frontend answers around generation, as vLLM 0.33.0's two frontends do:
/tokenize and /detokenize, the scale-out render paths (403 without --enable-scale-out in both
frontends; with it, a GenerateRequest from the Python frontend and 501 from the Rust one), and
the X-data-parallel-rank header a router sends to pin a request to one data-parallel rank.

The engines are golden b200-dep16-disaggregated's prefill leader (TP8 x DP2) and
gb300-tp8-aggregated's leader, started from their rendered commands as real processes on
loopback; VLLM_USE_RUST_FRONTEND comes from the rendered pod env where a test says "Rust".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kimik3_operator.render.engine import NO_MEDIA_HOST
from kimik3_simulator.cmdline import parse_serve
from kimik3_simulator.config import engine_config
from kimik3_simulator.frontend import SCALE_OUT_DISABLED, Frontend
from kimik3_simulator.openai_format import BadRequest
from kimik3_simulator.settings import SettingsError, SimSettings, settings_from_env
from kimik3_simulator.text import IMAGE_TOKEN, IMAGE_TOKENS, THINK_OPEN, PromptError
from kimik3_simulator.vocab import Vocabulary, token_id

from .sims import Sim, role_report, simulator, words

DP2 = role_report("b200-dep16-disaggregated", "prefill", scale_out=False)
AGG = role_report("gb300-tp8-aggregated", "aggregated", scale_out=False)
RENDERS = ("/v1/completions/render", "/v1/chat/completions/render")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the capital of France"}]


def _env(role: dict[str, Any], rust: bool) -> dict[str, str]:
    env = {"K3SIM_GPU_PRODUCT": role["gpuProduct"], "K3SIM_TIME_SCALE": "0.05"}
    if rust:
        assert role["env"]["VLLM_USE_RUST_FRONTEND"] == "1"  # what the operator renders on leaders
        env["VLLM_USE_RUST_FRONTEND"] = "1"
    return env


@pytest.fixture(scope="module")
def dp2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """The rendered DP2 prefill leader on the Python frontend (no VLLM_USE_RUST_FRONTEND)."""
    with simulator(DP2["command"], tmp_path_factory.mktemp("dp2"), _env(DP2, rust=False)) as sim:
        yield sim


# ---- pure ---------------------------------------------------------------------------------------


def test_token_ids_are_stable_per_word_and_keep_sent_ids() -> None:
    assert token_id("Paris") == token_id("Paris") != token_id("paris")
    assert 0 <= token_id("Paris") < 1 << 31
    assert token_id("#42") == 42 and token_id("#4294967295") == (1 << 32) - 1
    assert token_id("#4294967296") < 1 << 31 and token_id("#x") < 1 << 31  # not an id: hashed like any word
    vocab = Vocabulary()
    ids = vocab.encode("the capital of France".split())
    assert vocab.decode(ids) == "the capital of France"
    assert vocab.decode([7, ids[0]]) == "#7 the"  # never seen: spelled as the word that tokenizes back to 7


def test_the_frontend_and_scale_out_come_from_the_pod() -> None:
    assert settings_from_env({}).rust_frontend is False
    assert settings_from_env({"VLLM_USE_RUST_FRONTEND": "1"}).rust_frontend is True
    assert settings_from_env({"VLLM_USE_RUST_FRONTEND": "0"}).rust_frontend is False
    with pytest.raises(SettingsError):
        settings_from_env({"VLLM_USE_RUST_FRONTEND": "true"})  # vLLM's int() fails on it too
    assert parse_serve(DP2["command"]).enable_scale_out is False
    assert parse_serve([*DP2["command"], "--enable-scale-out"]).enable_scale_out is True
    assert parse_serve([*DP2["command"], "--enable-scale-out", "--disable-scale-out"]).enable_scale_out is False


@pytest.mark.parametrize("rust", [False, True])
def test_the_rank_header_is_read_as_each_frontend_reads_it(rust: bool) -> None:
    frontend = Frontend(engine_config(parse_serve(DP2["command"]), SimSettings(gpu_product="B200",
                                                                               rust_frontend=rust)))
    assert frontend.data_parallel_rank(None) is None
    assert frontend.data_parallel_rank("1") == 1 and frontend.data_parallel_rank("abc") is None
    with pytest.raises(BadRequest, match="engine-core error" if rust else r"out of range \[0, 2\)") as out:
        frontend.data_parallel_rank("2")
    assert out.value.status == 400
    if rust:  # a u32 or nothing
        assert frontend.data_parallel_rank("-1") is None
    else:  # Python's int(): -1 parses, and is out of range
        with pytest.raises(BadRequest):
            frontend.data_parallel_rank("-1")


# ---- /tokenize and /detokenize ------------------------------------------------------------------


def test_tokenize_answers_vllms_shape_with_the_counts_the_engine_prefills(dp2: Sim) -> None:
    prompt = words(300, "tok")
    tokenized = dp2.post("/tokenize", {"model": "kimi-k3", "prompt": prompt})
    assert tokenized.status_code == 200
    body = tokenized.json()
    assert list(body) == ["count", "max_model_len", "tokens", "token_strs"]
    assert body["count"] == len(body["tokens"]) == 300 and body["token_strs"] is None
    assert body["max_model_len"] == dp2.get("/v1/models").json()["data"][0]["max_model_len"]
    assert dp2.post("/tokenize", {"prompt": prompt}).json()["tokens"] == body["tokens"]  # stable
    done = dp2.post("/v1/completions", {"prompt": prompt, "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == body["count"]

    chat = dp2.post("/tokenize", {"model": "kimi-k3", "messages": CHAT, "return_token_strs": True}).json()
    answer = dp2.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}).json()
    assert chat["count"] == len(chat["tokens"]) == answer["usage"]["prompt_tokens"]
    assert chat["token_strs"][:3] == ["<|system|>", "be", "brief"]
    thinking = {"messages": CHAT, "chat_template_kwargs": {"thinking": True}}  # its prompt ends in <think>
    counted = dp2.post("/tokenize", {"model": "kimi-k3", **thinking}).json()["count"]
    assert counted == dp2.post("/v1/chat/completions", {**thinking, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert counted == chat["count"] + len(THINK_OPEN)

    back = dp2.post("/detokenize", {"model": "kimi-k3", "tokens": body["tokens"][:3]})
    assert back.status_code == 200 and back.json() == {"prompt": "tok0 tok1 tok2"}


def test_ids_from_tokenize_hit_the_prefix_cache_of_the_same_text(dp2: Sim) -> None:
    """The engine keys its cache by the ids /tokenize returns: the text, then the same prompt as ids, hit."""
    prompt = words(3000, "ids")
    ids = dp2.post("/tokenize", {"prompt": prompt}).json()["tokens"]
    headers = {"X-data-parallel-rank": "0"}
    dp2.post("/v1/completions", {"prompt": prompt, "max_tokens": 1}, headers={**headers, "X-Request-Id": "ids-text"})
    dp2.post("/v1/completions", {"prompt": ids, "max_tokens": 1}, headers={**headers, "X-Request-Id": "ids-ids"})
    block = dp2.stats()["engine"]["block_size"]
    record = dp2.stats()["by_request_id"]["ids-ids"]
    assert record["prompt_tokens"] == 3000 and record["local_cache_hit_tokens"] == (3000 - 1) // block * block


def test_tokenize_and_detokenize_refuse_what_vllm_refuses(dp2: Sim) -> None:
    wrong = dp2.post("/tokenize", {"model": "gpt-4", "prompt": "x"})
    assert wrong.status_code == 404 and wrong.json()["error"]["type"] == "NotFoundError"
    assert dp2.post("/tokenize", {"prompt": ""}).json() == {"count": 0, "max_model_len": dp2.post(
        "/tokenize", {"prompt": "x"}).json()["max_model_len"], "tokens": [], "token_strs": None}
    assert dp2.post("/tokenize", {"model": "kimi-k3"}).status_code == 400
    assert dp2.post("/tokenize", {"prompt": [1, 2]}).status_code == 400  # /tokenize takes text only
    assert dp2.post("/detokenize", {"tokens": [-1]}).status_code == 400


# ---- the render paths ---------------------------------------------------------------------------


def _render_status(sim: Sim) -> dict[str, tuple[int, dict[str, Any]]]:
    body = {"model": "kimi-k3", "prompt": "a b c", "messages": CHAT, "max_tokens": 4}
    return {path: (r.status_code, r.json()) for path in RENDERS for r in [sim.post(path, body)]}


def test_render_is_forbidden_without_scale_out_in_the_python_frontend(dp2: Sim) -> None:
    for status, body in _render_status(dp2).values():
        assert (status, body) == (403, {"error": {"message": SCALE_OUT_DISABLED, "type": "PermissionDeniedError",
                                                  "param": None, "code": 403}})


@pytest.mark.parametrize("scale_out", [False, True])
def test_the_rust_frontend_forbids_render_or_does_not_implement_it(scale_out: bool, tmp_path: Path) -> None:
    """As the Rust frontend (the operator's default): 403 as Python without the flag, 501 with it; a
    router then falls back to /tokenize, which it serves."""
    command = [*AGG["command"], *(["--enable-scale-out"] if scale_out else [])]
    with simulator(command, tmp_path, _env(AGG, rust=True)) as sim:
        for path, (status, body) in _render_status(sim).items():
            if scale_out:
                assert status == 501 and body["error"]["type"] == "NotImplementedError"
                assert body["error"]["message"] == (f"POST {path} is not supported by the Rust frontend yet. "
                                                    f"Set VLLM_USE_RUST_FRONTEND=0 to use the Python frontend.")
            else:
                assert status == 403 and body["error"]["message"] == SCALE_OUT_DISABLED
        tokenized = sim.post("/tokenize", {"model": "kimi-k3", "prompt": "a b c"}).json()
        assert tokenized["count"] == 3 and tokenized["tokens"] == [token_id(w) for w in "a b c".split()]


def test_the_python_frontend_with_scale_out_renders_generate_requests(tmp_path: Path) -> None:
    with simulator([*AGG["command"], "--enable-scale-out"], tmp_path, _env(AGG, rust=False)) as sim:
        prompt = words(40, "render")
        rendered = sim.post("/v1/completions/render", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 9,
                                                        "kv_transfer_params": {"do_remote_decode": True}},
                            headers={"X-Request-Id": "r1"})
        assert rendered.status_code == 200
        [generate] = rendered.json()
        assert generate["token_ids"] == sim.post("/tokenize", {"prompt": prompt}).json()["tokens"]
        assert generate["request_id"] == "cmpl-r1" and generate["sampling_params"]["max_tokens"] == 9
        assert generate["kv_transfer_params"] == {"do_remote_decode": True} and generate["features"] is None
        chat = sim.post("/v1/chat/completions/render", {"messages": CHAT}).json()
        assert isinstance(chat, dict) and chat["request_id"].startswith("chatcmpl-")
        assert len(chat["token_ids"]) == sim.post("/tokenize", {"messages": CHAT}).json()["count"]
        assert chat["parse_context"]["tool_choice"] == "none"
        too_long = sim.post("/v1/completions/render", {"prompt": "x", "max_tokens": 1 << 21})
        assert too_long.status_code == 400


# ---- X-data-parallel-rank -----------------------------------------------------------------------


def test_the_rank_header_pins_a_request_to_that_rank(dp2: Sim) -> None:
    """What vllm-router relies on when it expands one URL into url@0, url@1 (one worker per
    `engine` label value it counts in /metrics) and sends X-data-parallel-rank."""
    engines = {s.labels["engine"] for s in _samples(dp2, "vllm:num_requests_running")}
    assert engines == {"0", "1"}
    before = {rank: dp2.metric("vllm:request_success_total", engine=rank) for rank in ("0", "1")}
    for i in range(3):  # all to rank 1, though least-loaded would alternate or pick 0
        answer = dp2.post("/v1/completions", {"prompt": words(20, f"pin{i}-"), "max_tokens": 2},
                          headers={"X-data-parallel-rank": "1", "X-Request-Id": f"pin{i}"})
        assert answer.status_code == 200
        assert dp2.stats()["by_request_id"][f"pin{i}"]["rank"] == 1
    assert dp2.metric("vllm:request_success_total", engine="1") == before["1"] + 3
    assert dp2.metric("vllm:request_success_total", engine="0") == before["0"]
    dp2.post("/v1/completions", {"prompt": "x", "max_tokens": 1},
             headers={"X-data-parallel-rank": "0", "X-Request-Id": "pin-zero"})
    assert dp2.stats()["by_request_id"]["pin-zero"]["rank"] == 0
    out = dp2.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, headers={"X-data-parallel-rank": "2"})
    assert out.status_code == 400 and out.json()["error"]["message"] == "data_parallel_rank 2 is out of range [0, 2)."
    ignored = dp2.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, headers={"X-data-parallel-rank": "one"})
    assert ignored.status_code == 200


def _samples(sim: Sim, name: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(sim.get("/metrics").text) for s in f.samples if s.name == name]


# ---- images: vLLM's fetch policy from the rendered command line ---------------------------------


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _frontend(*extra: str, rust: bool = False) -> Frontend:
    return Frontend(engine_config(parse_serve([*AGG["command"], *extra]),
                                  SimSettings(gpu_product=AGG["gpuProduct"], rust_frontend=rust)))


def test_python_frontends_fetch_no_image_url_but_take_inline_images() -> None:
    """The operator's default for a Python frontend (render/engine.py NO_MEDIA_HOST): data: URLs
    pass and count IMAGE_TOKENS each, an http(s) URL is refused with vLLM's message before any
    fetch, and so is a file: URL (no --allowed-local-media-path is ever rendered)."""
    frontend = _frontend("--allowed-media-domains", NO_MEDIA_HOST)
    text = [{"type": "text", "text": "what is in this picture"}]
    plain, _ = frontend.prompt({"messages": [{"role": "user", "content": text}]}, chat=True)
    inline, _ = frontend.prompt({"messages": [{"role": "user", "content": [
        *text, _image("data:image/png;base64,iVBORw0KGgo=")]}]}, chat=True)
    assert len(inline) - len(plain) == IMAGE_TOKENS
    for url in ("http://169.254.169.254/latest/meta-data/", "http://169.254.169.254\\@images.example.com/x",
                "HTTP://Metadata.Google.Internal/"):
        with pytest.raises(PromptError, match=r"allowed domains: \['media-fetch-off.invalid'\]. Input URL domain: "):
            frontend.prompt({"messages": [{"role": "user", "content": [_image(url)]}]}, chat=True)
    with pytest.raises(PromptError, match="allowed-local-media-path"):
        frontend.prompt({"messages": [{"role": "user", "content": [_image("file:///etc/passwd")]}]}, chat=True)


def test_allowed_hosts_and_the_image_limit_are_vllms() -> None:
    frontend = _frontend("--allowed-media-domains", "images.example.com", "cdn.example.com",
                         "--limit-mm-per-prompt", '{"image": 1}')
    one = {"role": "user", "content": [_image("https://CDN.example.com:8443/cat.png")]}  # host compared lower-case
    tokens, _ = frontend.prompt({"messages": [one]}, chat=True)
    assert tokens.count(IMAGE_TOKEN) == IMAGE_TOKENS  # allowed: stands for an image, never fetched here
    with pytest.raises(PromptError, match="Input URL domain: example.org"):
        frontend.prompt({"messages": [{"role": "user", "content": [_image("https://example.org/x.png")]}]}, chat=True)
    with pytest.raises(PromptError, match=r"At most 1 image\(s\) may be provided in one prompt."):
        frontend.prompt({"messages": [one, one]}, chat=True)


def test_the_rust_frontend_keeps_its_own_policy_and_refuses_the_flag() -> None:
    """vllm-rs (what the operator renders on leaders by default) exits at start on
    --allowed-media-domains, and refuses media from private, loopback and link-local addresses."""
    with pytest.raises(SettingsError, match="not implemented in Rust frontend yet: - allowed_media_domains"):
        _frontend("--allowed-media-domains", "images.example.com", rust=True)
    frontend = _frontend(rust=True)
    for url, kind in (("http://169.254.169.254/latest/", "link-local"), ("http://10.0.0.7/x.png", "private"),
                      ("http://127.0.0.1:8000/metrics", "loopback")):
        with pytest.raises(PromptError, match=f"resolves to a {kind} IP address"):
            frontend.prompt({"messages": [{"role": "user", "content": [_image(url)]}]}, chat=True)
    tokens, _ = frontend.prompt({"messages": [{"role": "user", "content": [_image("https://images.example.com/a")]}]},
                                chat=True)
    assert tokens.count(IMAGE_TOKEN) == IMAGE_TOKENS


def test_the_rust_frontend_caps_a_body_where_its_variable_says(tmp_path: Path) -> None:
    """VLLM_HTTP_MAX_REQUEST_BODY_SIZE, as vllm-rs reads it: 413 above it, the same request served
    under it; vLLM's 32 MiB when unset; the Python frontend reads it nowhere."""
    assert settings_from_env({"VLLM_USE_RUST_FRONTEND": "1"}).max_body_bytes == 32 * 1024 * 1024
    assert settings_from_env({"VLLM_HTTP_MAX_REQUEST_BODY_SIZE": "1000"}).max_body_bytes is None
    env = {**_env(AGG, rust=True), "VLLM_HTTP_MAX_REQUEST_BODY_SIZE": "4096"}
    with simulator(AGG["command"], tmp_path, env) as sim:
        body = {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 2}
        assert sim.post("/v1/completions", body).status_code == 200
        refused = sim.post("/v1/completions", {**body, "prompt": "word " * 1000})
        assert refused.status_code == 413
