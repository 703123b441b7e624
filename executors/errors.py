"""Errors raised by executors. The orchestrator translates them into its own tree."""


class ExecutorError(Exception):
    """Running, polling or signalling a job failed."""


class LaunchError(ExecutorError):
    """A job could not be started."""


class HostUnreachable(ExecutorError):
    """The server (or a batch cluster's controller) could not be reached: refused, timed
    out, dropped, or its host key did not match. The state of its jobs is unknown, not
    failed."""


class GpuControlError(ExecutorError):
    """NVML (or the GPU control backend) failed or is unavailable."""
