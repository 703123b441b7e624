"""Which GPUs a job gets. A leaf package: pure functions over a snapshot of the cluster,
no clock, no I/O, nothing else of gridshift."""
