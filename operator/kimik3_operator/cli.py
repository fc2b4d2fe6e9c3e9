"""The `kimik3` command: generate the CRD, run the operator."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .api.crd import CRD_FILENAME, crd_yaml


def _crd(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / CRD_FILENAME).write_text(text)
    print(out / CRD_FILENAME)
    return 0


def _run(args: argparse.Namespace) -> int:
    from .reconcile.runner import run_operator  # imports kopf: only for this command

    if args.namespace:
        os.environ["KIMIK3_NAMESPACE"] = args.namespace
    run_operator(namespace=args.namespace, liveness=args.liveness)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kimik3", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    crd = sub.add_parser("crd", help="write the KimiK3Deployment CRD generated from the API models")
    crd.add_argument("--out", default="crds", help="directory to write into, or - for stdout")
    crd.set_defaults(func=_crd)
    run = sub.add_parser("run", help="run the operator against the current kubeconfig or in-cluster")
    run.add_argument("--namespace", help="watch one namespace (default: all)")
    run.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.set_defaults(func=_run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
