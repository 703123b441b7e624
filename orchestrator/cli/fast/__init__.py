"""The fast path of the ``gridshift`` command: the everyday verbs (``submit``, ``ls``,
``show``, ``status``, ``cancel``, ``logs`` and pueue's ``wait``, ``restart``, ``hold``,
``release``, ``edit``) parsed without building the typer/click
command tree or importing pydantic (typer coerces every value through it), by a small
strict parser derived from the commands' own signatures (``argv``), then run through the
same command functions (``run``). Anything it does not fully understand goes to the full
typer command line, which gives the usual help or error. ``GRIDSHIFT_NO_FAST=1`` turns
it off."""
