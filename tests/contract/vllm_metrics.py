#!/usr/bin/env python3
"""Print the /metrics text vLLM 0.33.0's own stat logger exports for an engine, as JSON.

Run with the python of the venv made by scripts/vllm-venv.sh (the project's venv has no vllm):

    echo '[{"name": "d", "kv_role": "kv_consumer", "spec_tokens": 7, "engines": 2,
            "max_model_len": 1048576, "model_name": "kimi-k3"}]' \\
      | "$(scripts/vllm-venv.sh)/bin/python" tests/contract/vllm_metrics.py
    -> {"d": "# HELP vllm:num_requests_running ...", ...}   (generate_latest's text per case)

It builds vLLM's PrometheusStatLogger (v1/metrics/loggers.py) exactly as AsyncLLM does, with the
default ObservabilityConfig and CacheConfig, and calls log_engine_initialized (which adds
vllm:cache_config_info). Two things are stood in for, because this venv is only the parser's
(no einops, no NIXL library): the model and speculative configs are plain objects carrying the
fields the logger reads (served_model_name, max_model_len, is_diffusion, num_speculative_tokens),
and the connector factory returns a class whose build_prom_metrics is NixlConnector's (it returns
NixlPromMetrics, imported from nixl/stats.py without running the nixl package's __init__, which
loads the worker). Everything registered, names, types, labels and buckets, is vLLM's own code.
"""

from __future__ import annotations

import json
import os
import sys
import types

os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # building vLLM's configs fails on a host with no GPU otherwise


def _nixl_prom_metrics() -> type:
    import vllm.distributed.kv_transfer.kv_connector.v1 as v1

    name = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
    folder = os.path.join(os.path.dirname(v1.__file__), "nixl")
    with open(os.path.join(folder, "connector.py")) as f:
        if "return NixlPromMetrics(" not in f.read():
            raise SystemExit("nixl/connector.py no longer builds NixlPromMetrics: update vllm_metrics.py")
    package = types.ModuleType(name)
    package.__path__ = [folder]
    sys.modules.setdefault(name, package)
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlPromMetrics

    return NixlPromMetrics


def exposition(case: dict, stat_logger: type, kv_config: type, observability: type, cache: type) -> str:
    """vLLM's /metrics text for one engine (the process and GC families of the default registry too)."""
    from prometheus_client import REGISTRY, generate_latest

    kv_role = case.get("kv_role")
    spec = case.get("spec_tokens") or 0
    config = types.SimpleNamespace(
        observability_config=observability(),
        model_config=types.SimpleNamespace(served_model_name=case["model_name"], max_model_len=case["max_model_len"],
                                           is_diffusion=False),
        speculative_config=types.SimpleNamespace(num_speculative_tokens=spec) if spec else None,
        kv_transfer_config=kv_config(kv_connector="NixlConnector", kv_role=kv_role) if kv_role else None,
        ec_transfer_config=None, watermark_config=None, lora_config=None, cache_config=cache(),
    )
    logger = stat_logger(config, list(range(case["engines"])))
    logger.log_engine_initialized()
    return generate_latest(REGISTRY).decode()


def main() -> int:
    cases = json.load(sys.stdin)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # vLLM logs to stdout
    nixl_prom_metrics = _nixl_prom_metrics()
    from vllm.config import CacheConfig, KVTransferConfig, ObservabilityConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class NixlConnectorMetrics:
        """NixlConnector.build_prom_metrics (nixl/connector.py), without importing the worker."""

        @classmethod
        def build_prom_metrics(cls, *args):  # type: ignore[no-untyped-def]
            return nixl_prom_metrics(*args)

    KVConnectorFactory.get_connector_class = classmethod(lambda cls, config: NixlConnectorMetrics)
    result = {c["name"]: exposition(c, PrometheusStatLogger, KVTransferConfig, ObservabilityConfig, CacheConfig)
              for c in cases}
    json.dump(result, out, indent=0, sort_keys=True)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
