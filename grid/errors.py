"""Errors of the grid package. The orchestrator maps them into its own tree:
``SourceSpecError`` and ``MissingCredentials`` are the user's to fix (exit 2), the others
are failures of a provider or a file. A key the provider refuses (HTTP 401/403:
``CredentialsRefused``) is that provider's failure: a chain tries its next source, then
the cache."""


class GridDataError(Exception):
    """A grid signal could not be had."""


class SourceSpecError(GridDataError):
    """A source spec, file or option that cannot be used as given."""


class MissingCredentials(SourceSpecError):
    """The provider needs a key (or login) that the settings do not hold."""


class ProviderError(GridDataError):
    """The provider failed: outage, throttling beyond the retries, malformed answer."""


class CredentialsRefused(ProviderError):
    """The provider refused the key, login or token it was given (HTTP 401 or 403)."""
