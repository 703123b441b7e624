"""What the CLI prints: one table module for every table (``tables``), and the short
texts of ``ls`` and ``show`` (``jobtext``). Plain text when stdout is not a terminal."""
