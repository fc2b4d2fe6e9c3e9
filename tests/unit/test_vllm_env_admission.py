"""engine.env may set any VLLM_* variable vLLM 0.33.0 knows and none it does not: under the
--fail-on-environ-validation the operator renders, one unknown name stops every engine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kimik3_operator.api.spec import OWNED_ENV, Engine, unknown_vllm_env
from kimik3_operator.api.vllm_env import KNOWN_VLLM_ENV


@pytest.mark.parametrize("name", ["VLLM_ROUTER_SERVICE_HOST", "VLLM_X_PORT_8000_TCP", "VLLM_RPC_TIMEOUT",
                                  "VLLM_", "VLLM_LOGGING_LEVL"])
def test_unknown_vllm_names_are_refused_and_named(name: str) -> None:
    with pytest.raises(ValidationError, match=f"does not know .*: {name}"):
        Engine.model_validate({"env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": name, "value": "1"}]})


def test_known_names_and_other_variables_pass() -> None:
    free = sorted(KNOWN_VLLM_ENV - set(OWNED_ENV))
    env = [{"name": n, "value": "1"} for n in free[:: max(1, len(free) // 40)]][:63]
    assert Engine.model_validate({"env": [*env, {"name": "vllm_lowercase", "value": "x"}]}).env
    assert unknown_vllm_env(["NCCL_DEBUG", "VLLM_LOGGING_LEVEL", "HF_HUB_OFFLINE"]) is None
    assert unknown_vllm_env(["VLLM_LOGGING_LEVEL", "VLLM_NOPE", "VLLM_NOPE2"]) == "VLLM_NOPE"
