"""``python -m kimik3_operator.stager``: the staging Job's command, a wait, and a look at the marker.

    stage --uri hf://org/name --revision main --dest /cache/kimi-k3 [--progress-file F] [--verify quick|full]
          [--workers N] [--include GLOB]... [--exclude GLOB]... [--token-file PATH]
    wait  --dest /cache/kimi-k3 --timeout SECONDS [--commit SHA] [--uri URI] [--interval SECONDS]
    show  --dest /cache/kimi-k3

Secrets never come from arguments: the Hub token is ``HF_TOKEN`` (or ``HUGGING_FACE_HUB_TOKEN``, or the
file named by ``--token-file``, e.g. a mounted Secret); S3 credentials are the usual ``AWS_*`` variables.
Everything printed on stderr, and every progress record, is masked by redact.py (the secret values it
knows, and credentials in URLs).

stage prints one JSON progress record per line on stdout (see progress.py for the fields) and, with
``--progress-file``, keeps the latest record in that file (replaced atomically; written in place when the
file is a bind mount such as ``/dev/termination-log``), and with ``--report-configmap`` in that ConfigMap
(progress_configmap.py). Diagnostics go to stderr.
Exit codes: 0 done/ready, 1 failed or not ready in time (stderr: ``Reason: message``), 2 usage,
143 terminated (SIGTERM; partial downloads are kept and the next run resumes).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import WeightsError
from .flow import VERIFY_MODES, make_source, stage
from .manifest import read_manifest
from .progress import JsonSink, Progress
from .progress_configmap import ConfigMapReporter
from .redact import RedactingStream, Redactor
from .wait import wait_ready

TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "AWS_CONTAINER_AUTHORIZATION_TOKEN")


def _read_token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip() or None
        except OSError as exc:
            raise WeightsError("TokenUnreadable", f"--token-file {args.token_file}: {exc.strerror}") from exc
    for name in TOKEN_ENV:
        if os.environ.get(name):
            return os.environ[name].strip()
    return None


@contextmanager
def _masked_stderr(redact: Redactor) -> Iterator[None]:
    """stderr through the redactor while the stage runs: the stager's own log lines and whatever the
    libraries print (huggingface_hub logs the URL of a failed download, a signed CDN URL)."""
    original = sys.stderr
    sys.stderr = RedactingStream(original, redact)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = original


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (the masking stream while a stage runs)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


_HANDLER = _StderrHandler()
_HANDLER.setFormatter(logging.Formatter("%(levelname)s %(message)s"))


def _setup_logging(verbose: bool) -> None:
    log = logging.getLogger(__package__)  # every module's logger is a child of the package's
    log.handlers[:] = [_HANDLER]
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False


def _adopt_library_logs() -> None:
    """huggingface_hub (imported by the source, if at all) logs through a handler of its own, bound to the
    stderr of the moment it was imported: its records go through ours instead, to the masked stderr."""
    log = logging.getLogger("huggingface_hub")
    log.handlers[:] = [_HANDLER]
    log.propagate = False


def _fail(exc: BaseException) -> int:
    """The last stderr line (masked: stderr is the redacting stream here)."""
    if isinstance(exc, WeightsError):
        print(f"{exc.reason}: {exc.message}", file=sys.stderr)
    else:
        print(f"InternalError: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def cmd_stage(args: argparse.Namespace) -> int:
    redact = Redactor([os.environ.get(n, "") for n in SECRET_ENV])
    _setup_logging(args.verbose)
    with _masked_stderr(redact):
        return _stage(args, redact)


def _stage(args: argparse.Namespace, redact: Redactor) -> int:
    reporter = ConfigMapReporter(args.report_configmap, redact=redact) if args.report_configmap else None
    sink = JsonSink(sys.stdout, Path(args.progress_file) if args.progress_file else None, redact=redact,
                    forward=reporter)
    try:
        token = _read_token(args)
        if token:
            redact.values.append(token)
        dest = Path(args.dest)
        try:
            source = make_source(args.uri, token=token, env=os.environ, dest=dest)
        except WeightsError as exc:  # still leave a Failed record where the operator looks for it
            sink(Progress(phase="Failed", uri=args.uri, revision=args.revision, message=exc.message,
                          reason=exc.reason))
            raise
        redact.extra = source.secrets
        _adopt_library_logs()
        signal.signal(signal.SIGTERM, _on_sigterm)
        result = stage(args.uri, args.revision, dest, token=token, progress=sink, verify=args.verify,
                       workers=args.workers, include=args.include, exclude=args.exclude,
                       progress_interval=args.progress_interval, lock_timeout=args.lock_timeout, source=source)
    except WeightsError as exc:
        return _fail(exc)
    except (SystemExit, KeyboardInterrupt) as exc:  # SIGTERM: progress already says Interrupted
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 130
        print("Interrupted: stopped by a signal; partial downloads are kept for the next run", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # worker threads may sit in a stalled read: do not join them
    except Exception as exc:
        logging.getLogger(__package__).debug("traceback", exc_info=True)
        return _fail(exc)
    if result.unverified_files:
        print(f"WARNING {len(result.unverified_files)} file(s) had no checksum from the source "
              f"(e.g. {result.unverified_files[0]})", file=sys.stderr)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    def said(why: str) -> None:
        print(f"waiting: {why}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        r = wait_ready(args.dest, timeout=args.timeout, interval=args.interval, commit=args.commit, uri=args.uri,
                       check_files=not args.no_check_files, on_wait=said)
    except WeightsError as exc:
        print(f"{exc.reason}: {exc.message}", file=sys.stderr)
        return 1
    print(json.dumps({"ready": True, "uri": r.manifest.uri, "commit": r.manifest.commit,
                      "files": len(r.manifest.files), "bytes": r.manifest.total_bytes,
                      "waitedSeconds": round(r.waited_seconds, 1)}, sort_keys=True))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    m = read_manifest(Path(args.dest))
    if m is None:
        print(f"NotReady: no completion marker under {args.dest}", file=sys.stderr)
        return 1
    d = m.as_json()
    if not args.files:
        d.pop("files")
    print(json.dumps(d, sort_keys=True, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kimik3_operator.stager", allow_abbrev=False,
                                description="Stage model weights into a cache volume; wait for them.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("stage", allow_abbrev=False,
                       help="download/verify into --dest, then write the completion marker")
    s.add_argument("--uri", required=True, help="hf://org/name, s3://bucket/prefix or pvc://claim/path")
    s.add_argument("--revision", default="main",
                   help="hf: branch, tag or commit (default main); s3/pvc: a previous commit to pin, else ignored")
    s.add_argument("--dest", required=True, help="destination folder on the shared volume (pvc: the mounted path)")
    s.add_argument("--progress-file", help="keep the latest progress record (JSON) in this file")
    s.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress records")
    s.add_argument("--report-configmap", metavar="NAME",
                   help="in a cluster: also keep the latest record in this ConfigMap "
                        "(its namespace is the pod's; see progress_configmap.py)")
    s.add_argument("--verify", choices=VERIFY_MODES, default="quick",
                   help="quick: trust files whose size and mtime match the marker; full: re-hash everything")
    s.add_argument("--workers", type=int, default=8, help="files fetched in parallel")
    s.add_argument("--include", action="append", default=[], metavar="GLOB", help="only paths matching (repeat)")
    s.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip paths matching (repeat)")
    s.add_argument("--token-file", help="read the Hub token from this file (a mounted Secret) instead of HF_TOKEN")
    s.add_argument("--lock-timeout", type=float, default=24 * 3600.0,
                   help="seconds to wait for another stager of the same --dest")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(func=cmd_stage)

    w = sub.add_parser("wait", allow_abbrev=False,
                       help="exit 0 once --dest holds a complete stage (matching --commit/--uri)")
    w.add_argument("--dest", required=True)
    w.add_argument("--timeout", type=float, required=True, help="give up after this many seconds (0: check once)")
    w.add_argument("--interval", type=float, default=5.0, help="seconds between checks")
    w.add_argument("--commit", help="require this commit (the one in the deployment's status)")
    w.add_argument("--uri", help="require this source uri")
    w.add_argument("--no-check-files", action="store_true", help="trust the marker without stat-ing the files")
    w.set_defaults(func=cmd_wait)

    sh = sub.add_parser("show", allow_abbrev=False, help="print the completion marker")
    sh.add_argument("--dest", required=True)
    sh.add_argument("--files", action="store_true", help="include the per-file list")
    sh.set_defaults(func=cmd_show)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
