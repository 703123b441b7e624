"""What the hardware does, as the planner needs it: GPU types (their power curves and
throughput ratios), co-location interference on a shared GPU, idle and host power and the
cost of keeping a server on or waking it. Pure, like the rest of ``planning``.
"""
