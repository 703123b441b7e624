"""The daemon's socket, as its clients see it: the protocol (framing, limits, versions,
errors) and the thin client the CLI talks to the daemon with.

Standard library only (no pydantic, sqlmodel or rich), so that a command answered
through the socket starts fast. May import: ``orchestrator.errors`` (itself standard
library only) and nothing else of the project; ``daemon`` (the server) and ``cli`` import
it.
"""
