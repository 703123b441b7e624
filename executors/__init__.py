"""Running commands on GPUs.

A leaf package: it imports nothing of the rest of gridshift. Backends: ``local`` (this
machine); ``ssh``, ``simulated`` and ``slurm`` follow. GPU control sits behind
:class:`executors.gpu.GpuControl` (NVML, or a fake on machines without GPUs).

Keep this module light: ``python -m executors.shim`` imports it for every job.
"""
