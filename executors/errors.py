"""Errors raised by executors. The orchestrator translates them into its own tree."""


class ExecutorError(Exception):
    """Running, polling or signalling a job failed."""


class LaunchError(ExecutorError):
    """A job could not be started."""


class GpuControlError(ExecutorError):
    """NVML (or the GPU control backend) failed or is unavailable."""
