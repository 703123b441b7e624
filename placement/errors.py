"""Errors of the placement package."""


class PlacementError(Exception):
    """A request that the cluster could never satisfy."""
