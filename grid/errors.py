"""Errors of the grid package. The orchestrator maps them into its own tree:
``SourceSpecError`` and ``MissingCredentials`` are the user's to fix (exit 2), the others
are failures of a provider or a file."""


class GridDataError(Exception):
    """A grid signal could not be had."""


class SourceSpecError(GridDataError):
    """A source spec, file or option that cannot be used as given."""


class MissingCredentials(SourceSpecError):
    """The provider needs a key (or login) that the settings do not hold."""


class ProviderError(GridDataError):
    """The provider failed: outage, throttling beyond the retries, malformed answer."""
