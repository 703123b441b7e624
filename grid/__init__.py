"""Grid signals (carbon intensity, electricity prices) in one normal form, with adapters
for public APIs and CSV traces. A leaf package: it knows nothing of jobs or GPUs.

The adapters arrive with the grid-data work; the queue runs without a signal until then.
"""
