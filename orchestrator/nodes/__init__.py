"""Nodes: the one place that names concrete executor backends and GPU controls.

The node inventory (GPUs per node, resolved from the config and discovery), SSH servers'
discovery and links, power caps over ``GpuControl``, and the factories that build the
executors (local, SSH, Slurm, the router) and GPU controls (NVML, ``nvidia-smi``, fakes)
the daemon and the CLI use; what the site power limit reads from the store (``sitestore``);
the notes of jobs waiting for a server's wake (``wakenotes``).

May import: the root, ``queue`` and ``executors``. Not ``daemon``, ``planning``, ``sim``
or ``cli``.
"""
