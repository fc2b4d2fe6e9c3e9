"""The local cluster's processes: start, stop, crash, health, status, and the plans cluster.sh runs.

Why Python: the table of components (components.py) is data with functions in it (command lines and
probes built from the layout); bash needed a parallel case statement per property. This module knows
nothing of any one component: orders and waits follow from each row's `needs`.

cluster.sh calls it with its layout exported (K3E_*):
  supervisor.py plan up [--stale NAME,...]    what `up` does, one action per line (below)
  supervisor.py plan down                     what `down` does
  supervisor.py plan restart [--kill] NAME... what `restart` does
  supervisor.py start|stop|crash NAME...      (start stops an old process of the same name first)
  supervisor.py wait [--timeout S] NAME...    until healthy; fails at once if the process died
  supervisor.py running NAME                  exit 0 if our process of that name runs
  supervisor.py names                         the components, in start order
  supervisor.py status                        a table; exit 1 unless every component is healthy
Plan lines: `step NAME` / `undo NAME` (cluster.sh's step_NAME / undo_NAME), `start NAME...`,
`wait [--timeout S] NAME...`, `stop NAME...`, `crash NAME...`.

A process runs detached in its own session with its pid in $RUN/NAME.pid (other tools read these),
its output in $LOGS/NAME.log (the previous one kept as .log.prev), and the environment it was given
in $RUN/NAME.env, so that `up` restarts it when its command line or environment changed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeAlias

if __package__ in (None, ""):  # run as a script by cluster.sh
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from components import COMPONENTS, Component, Layout, Step, port_open

Row: TypeAlias = Component | Step
ROWS: dict[str, Row] = {row.name: row for row in COMPONENTS}
RESTART_TIMEOUT = 120


class Failed(Exception):
    """A reason to stop, printed as cluster.sh's `die` would."""


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The graph


def hooks() -> set[str]:
    """Steps that run only right before a component's (re)start, not as setup steps of their own."""
    return {s for row in COMPONENTS if isinstance(row, Component) for s in row.before_start}


def needs_of(row: Row) -> tuple[str, ...]:
    """What a row needs, with what its hooks need (they run right before it)."""
    extra = [n for h in row.before_start for n in ROWS[h].needs] if isinstance(row, Component) else []
    return tuple(dict.fromkeys([*row.needs, *extra]))


def check_table() -> None:
    """Unique names, known needs and hooks, no cycle, no port claimed twice."""
    rows = COMPONENTS
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise Failed(f"a name appears twice in the table: {sorted(n for n in names if names.count(n) > 1)}")
    known = set(names)
    for row in rows:
        for need in row.needs:
            if need not in known:
                raise Failed(f"{row.name} needs {need}, which is not in the table")
        for hook in row.before_start if isinstance(row, Component) else ():
            if not isinstance(ROWS.get(hook), Step):
                raise Failed(f"{row.name} runs {hook} before it starts, which is not a step of the table")
    ports = [p.key for r in rows if isinstance(r, Component) for p in r.ports]
    if len(set(ports)) != len(ports):
        raise Failed(f"a port is claimed twice: {sorted(p for p in ports if ports.count(p) > 1)}")
    start_order()  # raises on a cycle


def dependents() -> dict[str, set[str]]:
    """The rows that need each row directly."""
    direct: dict[str, set[str]] = {r.name: set() for r in COMPONENTS}
    for row in COMPONENTS:
        for need in needs_of(row):
            direct[need].add(row.name)
    return direct


def descendants() -> dict[str, set[str]]:
    """Every row that needs each row, directly or through others."""
    direct = dependents()
    found: dict[str, set[str]] = {}

    def walk(name: str, path: tuple[str, ...]) -> set[str]:
        if name in path:
            raise Failed(f"the table's needs form a cycle: {' -> '.join((*path, name))}")
        if name not in found:
            found[name] = set().union(*({d} | walk(d, (*path, name)) for d in direct[name]))
        return found[name]

    for name in direct:
        walk(name, ())
    return found


def start_order() -> list[str]:
    """Every row once, each after all it needs. Among the rows that could come next: those that need
    no new wait first (so processes start together); then the one most rows depend on (a setup step
    runs in this shell and holds up all that comes after it); then the one whose waits are on the
    earliest started processes (most likely healthy by now); then table order."""
    skip = hooks()
    rows = [r for r in COMPONENTS if r.name not in skip]
    index = {r.name: i for i, r in enumerate(COMPONENTS)}
    left = {r.name: {n for n in needs_of(r) if n not in skip} for r in rows}
    below = descendants()
    order: list[str] = []
    waited: set[str] = set()
    started: dict[str, int] = {}
    while left:
        ready = [n for n, deps in left.items() if not deps - set(order)]
        if not ready:
            raise Failed(f"the table's needs form a cycle among {sorted(left)}")

        def key(name: str) -> tuple[int, int, int, int]:
            pending = [started.get(d, -1) for d in needs_of(ROWS[name])
                       if isinstance(ROWS[d], Component) and d not in waited]
            return (1 if pending else 0, -len(below[name]), max(pending, default=-1), index[name])

        name = min(ready, key=key)
        waited.update(d for d in needs_of(ROWS[name]) if isinstance(ROWS[d], Component))
        if isinstance(ROWS[name], Component):
            started[name] = len(order)
        order.append(name)
        del left[name]
    return order


def component_names() -> list[str]:
    return [n for n in start_order() if isinstance(ROWS[n], Component)]


def plan_up(layout: Layout, stale: set[str]) -> list[str]:
    """Setup steps and starts in dependency order; a component is started only if it does not run
    current (same command line and environment, no config file changed under it: `stale`); each is
    waited for just before the first row that needs it, and every one at the end."""
    lines: list[str] = []
    waited: set[str] = set()

    def wait(names: Iterable[str]) -> None:
        todo = [n for n in names if n not in waited and isinstance(ROWS[n], Component)]
        if todo:
            lines.append("wait " + " ".join(todo))
            waited.update(todo)

    for name in start_order():
        row = ROWS[name]
        wait(needs_of(row))
        if isinstance(row, Step):
            lines.append(f"step {name}")
        elif name in stale or not is_current(layout, row):
            lines.extend(f"step {h}" for h in row.before_start)
            lines.append(f"start {name}")
    wait(component_names())
    return merged(lines)


def merged(lines: list[str]) -> list[str]:
    """Adjacent starts (or waits) as one line: one supervisor call each, not one per component."""
    out: list[str] = []
    for line in lines:
        verb = line.split(" ", 1)[0]
        if out and verb in ("start", "wait") and out[-1].split(" ", 1)[0] == verb:
            out[-1] += line[len(verb):]
        else:
            out.append(line)
    return out


def plan_down() -> list[str]:
    """The reverse: a row goes once everything that needs it has gone; components of one round stop
    together, then the undos of that round's steps run."""
    needed_by = dependents()
    gone: set[str] = set()
    lines: list[str] = []
    order = start_order() + sorted(hooks())
    while len(gone) < len(order):
        this_round = [n for n in order if n not in gone and needed_by[n] <= gone]
        if not this_round:
            raise Failed("the table's needs form a cycle")
        stops = [n for n in this_round if isinstance(ROWS[n], Component)]
        if stops:
            lines.append("stop " + " ".join(stops))
        lines.extend(f"undo {n}" for n in this_round if isinstance((r := ROWS[n]), Step) and r.undo)
        gone.update(this_round)
    return lines


def plan_restart(names: Sequence[str], kill: bool) -> list[str]:
    """Stop (or crash) the named components, start them again in start order with their hooks,
    wait for them."""
    unknown = [n for n in names if not isinstance(ROWS.get(n), Component)]
    known = " ".join(component_names())
    if unknown:
        raise Failed(f"unknown component {' '.join(unknown)} (of: {known})")
    if not names:
        raise Failed(f"usage: cluster.sh restart [--kill] COMPONENT... (of: {known})")
    ordered = [n for n in component_names() if n in names]
    lines = [("crash " if kill else "stop ") + " ".join(ordered)]
    for name in ordered:
        row = ROWS[name]
        assert isinstance(row, Component)
        lines.extend(f"step {h}" for h in row.before_start)
        lines.append(f"start {name}")
    lines.append(f"wait --timeout {RESTART_TIMEOUT} " + " ".join(ordered))
    return lines


# ---------------------------------------------------------------------------------------------
# Processes


def component(name: str) -> Component:
    row = ROWS.get(name)
    if not isinstance(row, Component):
        raise Failed(f"unknown component {name} (of: {' '.join(component_names())})")
    return row


def _files(layout: Layout, name: str, kind: str) -> Path:
    return Path(layout.run) / f"{name}.{kind}"


def _forget(layout: Layout, name: str) -> None:
    """A process gone (or about to start): its pidfile and ready file go with it."""
    for kind in ("pid", "ready"):
        _files(layout, name, kind).unlink(missing_ok=True)


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def pid_of(layout: Layout, row: Component) -> int | None:
    """Our running process: the pidfile's pid, if it still runs our binary or script (pids are
    reused; a zombie has an empty command line)."""
    try:
        text = _files(layout, row.name, "pid").read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    argv = _cmdline(int(text))
    binary = row.binary(layout)
    return int(text) if binary in argv[:2] else None


def _env_text(layout: Layout, row: Component) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(row.env(layout).items()))


def is_current(layout: Layout, row: Component) -> bool:
    """Runs with exactly the command line and environment `up` would give it now."""
    pid = pid_of(layout, row)
    if pid is None or _cmdline(pid) != row.argv(layout):
        return False
    try:
        return _files(layout, row.name, "env").read_text() == _env_text(layout, row)
    except OSError:
        return False


def healthy(layout: Layout, row: Component) -> bool:
    return pid_of(layout, row) is not None and row.probe(layout)


def _tail(layout: Layout, name: str, lines: int = 30) -> None:
    path = Path(layout.logs) / f"{name}.log"
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return
    log(f"last lines of {path}:")
    print("\n".join(text), file=sys.stderr, flush=True)


def start(layout: Layout, name: str) -> None:
    """Detached in its own session, so it outlives cluster.sh and its job control; no descriptor but
    0-2 is inherited (a daemon holding the caller's pipe would make `$(cluster.sh up)` hang)."""
    row = component(name)
    if pid_of(layout, row) is not None:
        log(f"{name} runs with an old command line or config; restarting it")
        stop(layout, [name])
    for key in row.port_keys:
        if port_open(layout.port(key)):
            raise Failed(f"port {layout.port(key)} (for {name}) is in use by another process; "
                         "choose ports with KIMIK3_PORT_BASE")
    logs = Path(layout.logs) / f"{name}.log"
    if logs.exists():
        logs.replace(logs.with_suffix(".log.prev"))
    _forget(layout, name)
    # The caller's environment without the layout (K3E_*: ours, not the component's); KWOK_WORKDIR
    # keeps kwok from reading a user's ~/.kwok/kwok.yaml.
    env = {k: v for k, v in os.environ.items() if not k.startswith("K3E_")}
    env |= {"KWOK_WORKDIR": f"{layout.state}/kwok", **row.env(layout)}
    try:
        with logs.open("wb") as out:
            process = subprocess.Popen(row.argv(layout), stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)
    except OSError as error:
        raise Failed(f"{name} cannot run {row.argv(layout)[0]}: {error} (did build.sh run?)") from None
    _files(layout, name, "pid").write_text(f"{process.pid}\n")
    _files(layout, name, "env").write_text(_env_text(layout, row))
    deadline = time.monotonic() + 2  # /proc/PID/cmdline is the new program's a moment after exec
    while pid_of(layout, row) is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.returncode = process.returncode or 0  # not ours to reap: it is left running when we exit
    if pid_of(layout, row) is None:
        _tail(layout, name, 20)
        raise Failed(f"{name} did not start")
    log(f"started {name} (pid {process.pid}, log {logs})")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop(layout: Layout, names: Sequence[str]) -> None:
    """TERM, wait up to 15 s, then KILL what is left; only pids from our pidfiles."""
    rows = [component(n) for n in names]
    left: dict[str, int] = {}
    for row in rows:
        if (pid := pid_of(layout, row)) is not None:
            os.kill(pid, signal.SIGTERM)
            left[row.name] = pid
    deadline, killed = time.monotonic() + 15, False
    while left:
        # The command line empties before the process is gone: wait for the pid itself, as crash() does.
        left = {n: pid for n, pid in left.items() if _alive(pid)}
        if not left:
            break
        if time.monotonic() >= deadline + 5:
            raise Failed(f"could not stop: {' '.join(left)}")
        if time.monotonic() >= deadline and not killed:
            for name, pid in left.items():
                log(f"{name} did not stop after 15 s, killing it")
                if pid_of(layout, component(name)) == pid:  # still ours: a reused pid is not
                    os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.2)
    for row in rows:
        _forget(layout, row.name)


def crash(layout: Layout, names: Sequence[str]) -> None:
    """SIGKILL, as a crashed process ends; return once it and its ports are gone."""
    for name in names:
        row = component(name)
        if (pid := pid_of(layout, row)) is None:
            continue
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10  # the cmdline empties before the sockets close: wait for the pid
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            raise Failed(f"{name} survived SIGKILL")
        for key in row.port_keys:
            deadline = time.monotonic() + 10
            while port_open(layout.port(key)) and time.monotonic() < deadline:
                time.sleep(0.1)
        _forget(layout, name)


def wait(layout: Layout, names: Sequence[str], timeout: int | None) -> None:
    for name in names:
        row = component(name)
        limit = timeout or row.ready_timeout
        deadline = time.monotonic() + limit
        while not healthy(layout, row):
            if pid_of(layout, row) is None:
                _tail(layout, name)
                raise Failed(f"{name} failed to start")
            if time.monotonic() >= deadline:
                _tail(layout, name)
                raise Failed(f"{name} not healthy after {limit} s")
            time.sleep(0.2)


def status(layout: Layout) -> int:
    worst = 0
    print(f"{'COMPONENT':<26} {'PID':<8} {'PORTS':<12} STATE")
    for name in component_names():
        row = component(name)
        pid = pid_of(layout, row)
        if pid is None:
            state, worst = "stopped", 1
        elif not row.probe(layout):
            state, worst = "running, not healthy", 1
        elif not is_current(layout, row):
            state = "healthy (old command line: next up restarts it)"
        else:
            state = "healthy"
        ports = ",".join(str(layout.port(k)) for k in row.port_keys)
        print(f"{name:<26} {pid or '-'!s:<8} {ports:<12} {state}")
    return worst


# ---------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="supervisor.py", description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    plan = sub.add_parser("plan")
    plan.add_argument("what", choices=["up", "down", "restart"])
    plan.add_argument("--stale", default="")
    plan.add_argument("--kill", action="store_true")
    plan.add_argument("names", nargs="*")
    for verb in ("start", "stop", "crash"):
        sub.add_parser(verb).add_argument("names", nargs="+")
    waiting = sub.add_parser("wait")
    waiting.add_argument("--timeout", type=int)
    waiting.add_argument("names", nargs="+")
    sub.add_parser("running").add_argument("name")
    sub.add_parser("names")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    try:
        check_table()
        if args.verb == "names":
            print("\n".join(component_names()))
            return 0
        if args.verb == "plan" and args.what == "down":
            print("\n".join(plan_down()))
            return 0
        if args.verb == "plan" and args.what == "restart":
            print("\n".join(plan_restart(args.names, args.kill)))
            return 0
        layout = Layout.from_environment()
        if args.verb == "plan":
            print("\n".join(plan_up(layout, set(filter(None, args.stale.split(","))))))
        elif args.verb == "start":
            for name in args.names:
                start(layout, name)
        elif args.verb == "stop":
            stop(layout, args.names)
        elif args.verb == "crash":
            crash(layout, args.names)
        elif args.verb == "wait":
            wait(layout, args.names, args.timeout)
        elif args.verb == "running":
            return 0 if pid_of(layout, component(args.name)) is not None else 1
        elif args.verb == "status":
            return status(layout)
    except Failed as error:
        log(f"error: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
