"""Attack 3: an endpoint override leaks cloud credentials.

Replayed: the spec's S3 endpoint used to be rendered as ``AWS_ENDPOINT_URL``, which every AWS client
reads for every service, so the pod's web identity token went to that endpoint in a GET query string; a
failed exchange printed the URL, token included, on stderr, in the termination message and in the Job
annotation. Now: the renderer sets ``AWS_ENDPOINT_URL_S3``, the stager never reads ``AWS_ENDPOINT_URL``,
the token travels in a POST body to ``AWS_ENDPOINT_URL_STS`` or the regional STS, an exchange that fails
names no URL, and the token read from its file is one of the secrets everything printed is masked for.
"""

# ruff: noqa: F811  (the fixtures are imported from stager_world, and test arguments shadow them)

from __future__ import annotations

import io
import json
import string
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner
from kimik3_operator.render.weights import weights_children
from kimik3_operator.stager import WeightsError
from kimik3_operator.stager.progress import JsonSink
from kimik3_operator.stager.redact import Redactor
from kimik3_operator.stager.s3 import S3Source
from kimik3_operator.stager.sigv4 import CredentialProvider
from tests.support.cases import base_deployment
from tests.support.nodes import all_pools

from .stager_world import FakeS3, cli, cli_env, fake_s3, loopback_only, replay, run_stage  # noqa: F401

pytestmark = pytest.mark.timeout(240)  # a replay is bounded; a stall fails here, not at the suite's 600 s

ROLE = "arn:aws:iam::000000000000:role/k3"
JWTS = st.text(string.ascii_letters + string.digits + "-_.+/=", min_size=13, max_size=120).map(lambda s: "eyJ" + s)
"""A JWT is base64url with dots; '+', '/' and '=' are in the mix so a URL-encoded spelling differs."""


def test_the_rendered_s3_endpoint_reaches_s3_only() -> None:
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["model"] = {"uri": "s3://models/kimi-k3", "endpoint": "https://s3.internal.example"}
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    (job,) = [o for o in weights_children(Owner("k3", "ns", "uid"), plan.weights, "img") if o["kind"] == "Job"]
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_ENDPOINT_URL_S3"] == "https://s3.internal.example"
    assert not any(n.startswith("AWS_ENDPOINT_URL") and n != "AWS_ENDPOINT_URL_S3" for n in env)


@replay(60)
@given(jwt=JWTS, region=st.sampled_from(["us-east-1", "eu-west-3"]),
       sts=st.sampled_from(["", "http://127.0.0.1:7/sts"]),
       spec_endpoint=st.sampled_from(["https://attacker.example", "http://127.0.0.1:8/evil"]))
def test_the_web_identity_token_goes_to_sts_in_a_post_body(jwt: str, region: str, sts: str,
                                                           spec_endpoint: str) -> None:
    calls: list[tuple[str, str, dict[str, str], bytes | None]] = []

    def http(method: str, url: str, headers: dict[str, str], body: bytes | None) -> tuple[int, bytes]:
        calls.append((method, url, headers, body))
        return 500, b""

    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp, "token")
        token_file.write_text(jwt)
        env = {"AWS_ROLE_ARN": ROLE, "AWS_WEB_IDENTITY_TOKEN_FILE": str(token_file), "AWS_REGION": region,
               "AWS_ENDPOINT_URL": spec_endpoint, "AWS_ENDPOINT_URL_S3": spec_endpoint,
               **({"AWS_ENDPOINT_URL_STS": sts} if sts else {})}
        provider = CredentialProvider(env, http)
        with pytest.raises(WeightsError) as exc:
            provider.get()
    assert exc.value.reason == "CredentialsUnavailable" and jwt not in str(exc.value)
    ((method, url, headers, body),) = calls
    assert method == "POST" and url == (sts or f"https://sts.{region}.amazonaws.com") + "/"
    assert not url.startswith(spec_endpoint)
    assert jwt not in url and quote(jwt, safe="") not in url
    assert body is not None and parse_qs(body.decode())["WebIdentityToken"] == [jwt]
    assert jwt in provider.secrets()  # the redactor masks it from now on


def test_a_failed_exchange_prints_no_token(fake_s3: FakeS3) -> None:
    """stage() in this process with the CLI's sink: the stdout record, the progress file (the termination
    message), the record handed to the Job annotation, and the error message (the last stderr line)."""
    fake_s3.put("k3-weights", "m/config.json", b"{}")

    @replay(30)
    @given(jwt=JWTS,
           failure=st.sampled_from(["refused", "error", "not-xml", "unsigned-path"]))
    def one(jwt: str, failure: str) -> None:
        sts = {"refused": "http://127.0.0.1:9", "error": f"{fake_s3.endpoint}/nosts",
               "not-xml": f"{fake_s3.endpoint}/creds", "unsigned-path": fake_s3.endpoint}[failure]
        fake_s3.reset_log()
        with tempfile.TemporaryDirectory() as tmp:
            token_file = Path(tmp, "token")
            token_file.write_text(jwt)
            env = {"AWS_ROLE_ARN": ROLE, "AWS_WEB_IDENTITY_TOKEN_FILE": str(token_file), "AWS_REGION": "us-east-1",
                   "AWS_ENDPOINT_URL": f"{fake_s3.endpoint}/sts", "AWS_ENDPOINT_URL_S3": fake_s3.endpoint,
                   "AWS_ENDPOINT_URL_STS": sts}
            source = S3Source("k3-weights", "m", env=env)
            redact = Redactor(extra=source.secrets)
            stdout, forwarded = io.StringIO(), []
            sink = JsonSink(stdout, Path(tmp, "termination-log"), redact=redact, forward=forwarded.append)
            out = run_stage("s3://k3-weights/m", Path(tmp, "dest"), revision="", source=source, env=env)
            sink(out.last)
            printed = "\n".join([stdout.getvalue(), Path(tmp, "termination-log").read_text(), json.dumps(forwarded),
                                 redact(f"{out.reason}: {out.error.message if out.error else ''}")])
        assert out.reason == "CredentialsUnavailable", out
        for spelling in (jwt, quote(jwt, safe=""), jwt[:12]):
            assert spelling not in printed
        assert not any(jwt in r.path or quote(jwt, safe="") in r.path for r in fake_s3.log)
        assert not any(r.path.startswith("/sts") for r in fake_s3.log), "AWS_ENDPOINT_URL was used for STS"

    one()


def test_the_cli_replay(fake_s3: FakeS3, tmp_path: Path) -> None:
    """The whole Job command: STS unreachable, the spec's endpoint in AWS_ENDPOINT_URL as it used to be
    rendered. Neither stderr nor the termination message carries the token, and the spec's endpoint
    never sees the exchange."""
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bnM6azMtd2VpZ2h0cyJ9.c2lnbmF0dXJl"
    (tmp_path / "token").write_text(jwt)
    fake_s3.put("k3-weights", "m/config.json", b"{}")
    progress = tmp_path / "termination-log"
    out = cli("stage", "--uri", "s3://k3-weights/m", "--dest", str(tmp_path / "d"), "--progress-file",
              str(progress), "-v",
              env=cli_env(AWS_ROLE_ARN=ROLE, AWS_WEB_IDENTITY_TOKEN_FILE=str(tmp_path / "token"),
                          AWS_REGION="us-east-1", AWS_ENDPOINT_URL=f"{fake_s3.endpoint}/sts",
                          AWS_ENDPOINT_URL_S3=fake_s3.endpoint, AWS_ENDPOINT_URL_STS="http://127.0.0.1:9"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("CredentialsUnavailable: POST to the credentials")
    record = json.loads(progress.read_text())
    assert record["phase"] == "Failed" and record["reason"] == "CredentialsUnavailable"
    for text in (out.stdout, out.stderr, progress.read_text()):
        assert jwt not in text and jwt[:16] not in text and "Traceback" not in text
    assert not any(r.path.startswith("/sts") for r in fake_s3.log)
