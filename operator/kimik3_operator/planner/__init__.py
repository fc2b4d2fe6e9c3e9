"""Pure planning: spec + node facts -> Plan. No I/O, no Kubernetes client."""

from .facts import PoolFacts, pool_facts
from .plan import EngineSettings, Layout, Plan, PlanningError, PoolPlan, RolePlan
from .router import FrontPlan, GatewayPlan, RouterPlan
from .topology import plan_deployment, with_staged
from .weights import WeightsPlan, WeightsSource

__all__ = [
    "EngineSettings", "FrontPlan", "GatewayPlan", "Layout", "Plan", "PlanningError", "PoolFacts", "PoolPlan",
    "RolePlan", "RouterPlan", "WeightsPlan", "WeightsSource", "plan_deployment", "pool_facts", "with_staged",
]
