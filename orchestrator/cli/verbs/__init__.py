"""pueue's verbs: ``restart``, ``hold``, ``release``, ``edit`` (``change``) and ``wait``
(``wait``), each one request (``orchestrator.daemon.ops.verbs``)."""
