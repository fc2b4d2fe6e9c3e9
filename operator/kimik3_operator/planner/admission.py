"""What the validating webhook refuses: a spec the planner rejects whatever nodes exist.

Only spec-alone verdicts are refusals. A pool that leaves `gpu.product` to the nodes cannot be
judged without them, and anything that depends on the nodes present now (capacity, a missing
pool) is a status condition, never a rejection: nodes come and go, a spec must not bounce for it.
Planning ahead of the nodes takes the most permissive fabric (a full NVLink rack), so what fails
here fails on every cluster.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..api import KimiK3Deployment, first_error
from .facts import PoolFacts
from .plan import PlanningError
from .topology import plan_deployment


def admission_verdict(body: dict[str, Any]) -> str | None:
    """None to admit `body`, else the reason to refuse it ("Reason: message", the planner's words)."""
    try:
        spec = KimiK3Deployment.model_validate(body).spec
    except ValidationError as exc:
        return f"InvalidSpec: {first_error(exc)}"
    if any(pool.gpu.product == "Auto" for pool in spec.pools):
        return None  # the nodes decide the hardware: judged by the operator, as a condition
    try:
        plan_deployment(spec, {pool.name: PoolFacts() for pool in spec.pools})
    except PlanningError as exc:
        return None if exc.depends_on_nodes else f"{exc.reason}: {exc.message}"
    return None
