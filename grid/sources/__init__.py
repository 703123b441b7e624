"""One module per provider; each a ``GridSource``."""
