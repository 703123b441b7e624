"""Planning policies: ``plan(snapshot) -> Plan``, shared by the live daemon and the what-if
simulator, and their registry by name.

The registry lives here, not in ``base``: the policy modules import ``base`` (the types
they share) and nothing imports them back. They are imported when a name is first looked
up, so a command that never plans does not load numpy or HiGHS.
"""

from __future__ import annotations

from functools import cache

from orchestrator.errors import SpecError
from orchestrator.planning.policies.base import (
    Decision,
    Plan,
    Policy,
    QueuedJob,
    Snapshot,
)

__all__ = [
    "Decision",
    "Plan",
    "Policy",
    "QueuedJob",
    "Snapshot",
    "policy_names",
    "resolve_policy",
]


@cache
def _registry() -> dict[str, type[Policy]]:
    from orchestrator.planning.policies import baselines, budget, milp

    policies = (
        baselines.Fifo,
        baselines.LowestWindow,
        baselines.LowestSlots,
        budget.BudgetPlanner,
        budget.BudgetFifo,
        milp.Optimal,
        milp.Oracle,
    )
    return {cls.name: cls for cls in policies}


def policy_names() -> list[str]:
    """The policies' names, sorted (a stable list for messages)."""
    return sorted(_registry())


def resolve_policy(name: str) -> Policy:
    cls = _registry().get(name.strip().lower())
    if cls is None:
        raise SpecError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    return cls()
