"""The simulated cluster's hardware beyond placement: GPU types and the speed and curve of
a job on the type it was given (``devices``), two jobs sharing a GPU (``colocation``), and
servers' power states, idle energy and right-sizing (``power``)."""
