"""The parallel layout of one replica: the shape every planner rule reads, in a module of its own
below them (plan.py re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """Parallel layout of one replica."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    expert: bool = False

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.data
