"""Planning policies: ``plan(snapshot) -> Plan``, registered by name, shared by the live
daemon and the what-if simulator."""

from orchestrator.policies.base import (
    Decision,
    Plan,
    Policy,
    QueuedJob,
    Snapshot,
    policy_names,
    resolve_policy,
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
