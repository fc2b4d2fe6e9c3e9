"""The one error the planner raises: a spec that cannot be served as asked, with a status reason.

Its own module, below every planner module, so that the plan's types and the rules that fill them
(loading.py among them) never import each other.
"""

from __future__ import annotations


class PlanningError(Exception):
    """The spec cannot be served as asked (or not yet on the nodes present).

    `reason` is a stable CamelCase status reason; the message names what to change.
    """

    def __init__(self, reason: str, message: str, *, depends_on_nodes: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.depends_on_nodes = depends_on_nodes
        """True when the same spec may plan once nodes (or the operator's settings) change: a
        condition, not a rejection."""
