"""``python -m orchestrator`` is the ``gridshift`` command."""

from orchestrator.cli.app import main

main()
