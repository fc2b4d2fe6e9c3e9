"""The local cluster's supervisor (e2e/cluster/supervisor.py over the table in components.py): the
orders it derives keep every row's needs, the table agrees with cluster.sh, and the process handling
works on real processes."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parents[2] / "e2e" / "cluster"
sys.path.insert(0, str(CLUSTER))
import components  # noqa: E402
import supervisor  # noqa: E402
from components import Component, Layout, Port, Step  # noqa: E402

CLUSTER_SH = (CLUSTER / "cluster.sh").read_text()
ROWS = supervisor.ROWS


def line_of(lines: list[str], verb: str, name: str) -> int:
    found = [i for i, line in enumerate(lines) if line.split()[0] == verb and name in line.split()[1:]]
    assert len(found) == 1, f"{verb} {name}: {found} in {lines}"
    return found[0]


def layout(tmp: Path, **extra: str) -> Layout:
    env = {"RUN": str(tmp / "run"), "LOGS": str(tmp / "logs"), "STATE": str(tmp), "HERE": str(CLUSTER),
           "PKI": "/pki", "CONF": "/conf", **extra}
    env |= {f"BIN_{k}": f"/bin-{k}" for k in ("ETCD", "K8S", "KWOK", "LWS", "KUEUE", "PROMETHEUS", "KEDA",
                                              "PROMETHEUS_ADAPTER")}
    (tmp / "run").mkdir(exist_ok=True)
    (tmp / "logs").mkdir(exist_ok=True)
    return Layout(env)


def test_the_table_is_whole() -> None:
    supervisor.check_table()
    assert [r.name for r in components.COMPONENTS if isinstance(r, Component)], "no components"


def test_every_step_has_its_shell_function_and_every_shell_step_a_row() -> None:
    defined = set(re.findall(r"^((?:step|undo)_[a-z_]+)\(\)", CLUSTER_SH, re.M))
    wanted = {f"step_{r.name.replace('-', '_')}" for r in components.COMPONENTS if isinstance(r, Step)}
    wanted |= {f"undo_{r.name.replace('-', '_')}" for r in components.COMPONENTS if isinstance(r, Step) and r.undo}
    assert defined == wanted


def test_cluster_sh_takes_ports_certificates_kubeconfigs_and_builds_from_the_rows() -> None:
    """The rows are the one place: cluster.sh evaluates `components.py shell` and names none of them."""
    shell = subprocess.run([sys.executable, "-S", str(CLUSTER / "components.py"), "shell"], capture_output=True,
                           text=True, check=True).stdout
    rows = [r for r in components.COMPONENTS if isinstance(r, Component)]
    ports = sorted((p for r in rows for p in r.ports), key=lambda p: p.offset)
    assert f"PORT_KEYS=({' '.join(p.key for p in ports)})" in shell
    assert [p.offset for p in ports] == list(range(len(ports)))  # a new port takes the next offset
    assert [p.key for p in ports if not p.loopback] == ["KUBELET_PORT"]  # on the node's bridge address
    kubeconfigs = shell.split("KUBECONFIG_COMPONENTS=(")[1].split(")")[0].split()
    for r in rows:
        assert (f"  issue {r.name} " in shell) == (r.identity is not None)
        assert (r.name in kubeconfigs) == bool(r.identity and r.identity.kubeconfig)
    assert 'eval "$COMPONENT_SHELL"' in CLUSTER_SH
    for key, (folder, version) in components.BINARIES.items():
        assert f'BIN_{key}="$CACHE/bin/{folder}-v${version}"' in shell
        assert f'"$BIN/{folder}-v${version}"' in (CLUSTER / "build.sh").read_text(), f"build.sh builds no {folder}"
    for listed in ("PORT_KEYS=(", "[ETCD_PORT]=", "issue kube-scheduler", "BIN_K8S="):
        assert listed not in CLUSTER_SH + (CLUSTER / "node.sh").read_text(), f"cluster.sh still lists {listed}"


def test_up_starts_each_row_after_what_it_needs_and_waits_for_the_components_first(tmp_path: Path) -> None:
    lines = supervisor.plan_up(layout(tmp_path), set())
    for row in components.COMPONENTS:
        if row.name in supervisor.hooks():
            continue
        here = line_of(lines, "step" if isinstance(row, Step) else "start", row.name)
        for need in supervisor.needs_of(row):
            if isinstance(ROWS[need], Component):
                assert line_of(lines, "wait", need) < here, (row.name, need)
            else:
                assert line_of(lines, "step", need) < here, (row.name, need)
    waited = [n for line in lines if line.startswith("wait ") for n in line.split()[1:]]
    assert sorted(waited) == sorted(supervisor.component_names())


def test_hooks_run_right_before_their_component_and_only_then(tmp_path: Path) -> None:
    lines = supervisor.plan_up(layout(tmp_path), set())
    kwok = line_of(lines, "start", "kwok")
    assert lines[kwok - 1] == "step release-node-leases"
    assert lines.count("step release-node-leases") == 1


def test_a_current_component_is_left_alone_unless_a_file_it_reads_changed(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "is_current", lambda _, row: row.name == "kwok")
    lines = supervisor.plan_up(layout(tmp_path), set())
    assert "step release-node-leases" not in lines
    assert not any(line.startswith("start") and "kwok" in line.split() for line in lines)
    stale = supervisor.plan_up(layout(tmp_path), {"kwok"})
    assert line_of(stale, "start", "kwok") == line_of(stale, "step", "release-node-leases") + 1


def test_down_takes_each_row_away_after_everything_that_needs_it() -> None:
    lines = supervisor.plan_down()
    when = {}
    for i, line in enumerate(lines):
        for name in line.split()[1:]:
            when[name] = i
    for row in components.COMPONENTS:
        if isinstance(row, Component) or row.undo:
            for need in supervisor.needs_of(row):
                if need in when:
                    assert when[row.name] < when[need], (row.name, need)
    assert lines[-1] == "undo node-network"
    stopped = [n for line in lines if line.startswith("stop ") for n in line.split()[1:]]
    assert sorted(stopped) == sorted(supervisor.component_names())


def test_restart_stops_what_it_names_and_starts_it_in_start_order() -> None:
    lines = supervisor.plan_restart(["kwok", "kube-apiserver"], kill=True)
    assert lines == ["crash kube-apiserver kwok", "start kube-apiserver", "step release-node-leases",
                     "start kwok", f"wait --timeout {supervisor.RESTART_TIMEOUT} kube-apiserver kwok"]
    with pytest.raises(supervisor.Failed, match="unknown component crds"):
        supervisor.plan_restart(["crds"], kill=False)  # a step, not a process
    with pytest.raises(supervisor.Failed, match="usage"):
        supervisor.plan_restart([], kill=False)


@pytest.mark.parametrize(("rows", "error"), [
    ((Step("a", needs=("b",)), Step("b", needs=("a",))), "cycle"),
    ((Step("a", needs=("nothing",)),), "a needs nothing"),
    ((Step("a"), Step("a")), "twice"),
    ((Component("x", str, list, before_start=("y",)), Component("y", str, list)), "not a step"),
    ((Component("x", str, list, ports=(Port("P", 1, 0),)), Component("y", str, list, ports=(Port("P", 1, 1),))),
     "port is claimed twice"),
])
def test_a_table_that_cannot_be_run_is_refused(rows: tuple[Component | Step, ...], error: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "COMPONENTS", rows)
    monkeypatch.setattr(supervisor, "ROWS", {r.name: r for r in rows})
    with pytest.raises(supervisor.Failed, match=error):
        supervisor.check_table()


# ---------------------------------------------------------------------------------------------
# Real processes: a shell loop stands in for a component


@pytest.fixture
def sleeper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Layout, Component]]:
    script = tmp_path / "component.sh"
    script.write_text('echo started "$MODE"\n[ "$MODE" = die ] && exit 3\nwhile :; do sleep 0.2; done\n')
    # A script row, as the two Python components are: run by K3E_PYTHON, here the shell.
    row = Component("sleeper", lambda _: str(script), lambda _: ["--flag"], script=True,
                    env=lambda c: {"MODE": c.env.get("MODE", "run")}, ready_timeout=3)
    monkeypatch.setattr(supervisor, "ROWS", {**supervisor.ROWS, "sleeper": row})
    lay = layout(tmp_path, PYTHON="/bin/sh")
    yield lay, row
    supervisor.crash(lay, ["sleeper"])


def never_healthy(monkeypatch: pytest.MonkeyPatch, row: Component, ready_timeout: int) -> None:
    """`row` as a component whose probe never passes, as a real one's does not before it serves."""
    never = dataclasses.replace(row, probe=lambda _: False, ready_timeout=ready_timeout)
    monkeypatch.setattr(supervisor, "ROWS", {**supervisor.ROWS, row.name: never})


def test_a_started_process_runs_detached_with_its_pidfile_log_and_environment(
        sleeper: tuple[Layout, Component]) -> None:
    lay, row = sleeper
    supervisor.start(lay, "sleeper")
    pid = supervisor.pid_of(lay, row)
    assert pid is not None and supervisor.is_current(lay, row)
    assert Path(lay.run, "sleeper.pid").read_text().strip() == str(pid)
    deadline = time.monotonic() + 10  # the shell writes its line a moment after the start
    while "started run" not in Path(lay.logs, "sleeper.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "started run" in Path(lay.logs, "sleeper.log").read_text()
    changed = Layout({**lay.env, "MODE": "other"})
    assert not supervisor.is_current(changed, row)  # a new environment restarts it at the next up
    supervisor.start(changed, "sleeper")  # stops the old process first
    assert supervisor.pid_of(lay, row) not in (None, pid)
    assert Path(lay.logs, "sleeper.log.prev").exists()


def test_stop_and_crash_leave_no_process_and_no_pidfile(sleeper: tuple[Layout, Component]) -> None:
    lay, row = sleeper
    for end in (supervisor.stop, supervisor.crash):
        supervisor.start(lay, "sleeper")
        pid = supervisor.pid_of(lay, row)
        end(lay, ["sleeper"])
        assert pid is not None and not supervisor._alive(pid)
        assert supervisor.pid_of(lay, row) is None and not Path(lay.run, "sleeper.pid").exists()


def test_waiting_for_a_process_that_died_fails_at_once_with_its_log(
        sleeper: tuple[Layout, Component], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    lay, row = sleeper
    # With the default probe (it runs) the wait could pass in the moment between the start and the exit.
    never_healthy(monkeypatch, row, ready_timeout=30)
    dying = Layout({**lay.env, "MODE": "die"})
    started = time.monotonic()
    # start() sees the exit itself when it comes first; else wait() does.
    with pytest.raises(supervisor.Failed, match="sleeper (did not start|failed to start)"):
        supervisor.start(dying, "sleeper")
        supervisor.wait(dying, ["sleeper"], None)
    assert time.monotonic() - started < 10  # at once, not after the 30 s ready timeout
    assert "started die" in capsys.readouterr().err


def test_a_process_that_never_turns_healthy_times_out(sleeper: tuple[Layout, Component],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lay, row = sleeper
    never_healthy(monkeypatch, row, ready_timeout=60)
    supervisor.start(lay, "sleeper")
    started = time.monotonic()
    with pytest.raises(supervisor.Failed, match="not healthy after 1 s"):
        supervisor.wait(lay, ["sleeper"], 1)
    assert time.monotonic() - started < 10  # the 1 s given, not the row's 60 s


def test_a_component_whose_binary_is_missing_fails_with_what_to_do(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    row = Component("absent", lambda _: str(tmp_path / "no-such-binary"), lambda _: [])
    monkeypatch.setattr(supervisor, "ROWS", {**supervisor.ROWS, "absent": row})
    with pytest.raises(supervisor.Failed, match="absent cannot run .*no-such-binary.*build.sh"):
        supervisor.start(layout(tmp_path), "absent")
