"""The harness's kubelet stand-ins (the stager, the pod runner) try their API calls again while a
test has the API server away, and give up with the call named once the outage outlasts the bound."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.harness import kube


def fake_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int) -> Path:
    """A `kubectl` first on PATH that refuses `failures` times, as a restarting API server does,
    then answers; each call is counted in `calls`."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "kubectl"
    script.parent.mkdir()
    script.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
if [ "$(wc -l < {calls})" -le {failures} ]; then
  echo 'The connection to the server 127.0.0.1:16402 was refused' >&2; exit 1
fi
echo answered
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_a_call_refused_while_the_api_server_is_away_is_made_again_until_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_kubectl(tmp_path, monkeypatch, failures=2)
    result = kube.kubectl_until_ok("-n", "ns", "annotate", "pod", "p", "a=1", timeout=30)
    assert result.stdout.strip() == "answered"
    assert calls.read_text().splitlines() == ["-n ns annotate pod p a=1"] * 3


def test_an_answer_the_caller_accepts_ends_the_tries_though_kubectl_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_kubectl(tmp_path, monkeypatch, failures=5)
    result = kube.kubectl_until_ok("get", "x", ok=lambda r: "refused" in r.stderr, timeout=30)
    assert result.returncode == 1 and len(calls.read_text().splitlines()) == 1


def test_an_outage_longer_than_the_bound_fails_naming_the_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_kubectl(tmp_path, monkeypatch, failures=1000)
    with pytest.raises(AssertionError, match="kubectl create token sa"):
        kube.kubectl_until_ok("create", "token", "sa", "-n", "ns", timeout=2.5)
