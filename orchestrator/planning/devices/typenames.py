"""GPU type names: one canonical name for what NVML or a config calls a GPU model
(``Tesla V100-SXM2-32GB``) and for what a user asks for (``--gpu-type V100``), the same
way for both. Pure, and light (no numpy): the submit path reads it.

The name is split into words at every character that is not a letter or a digit; the
vendor's and the product line's words (``nvidia``, ``tesla``, ``quadro``, ``geforce``),
the form factor's (``sxm4``, ``pcie``, ``nvl``, ``hbm3``) and the memory size (``80gb``)
are dropped, and the rest is joined: ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``Quadro RTX
6000`` and ``rtx-6000`` -> ``rtx6000``, ``RTX 6000 Ada Generation`` -> ``rtx6000ada``,
``NVIDIA RTX A4000`` -> ``a4000``.
Whole words only: ``Quadro P1000`` is ``p1000``, not a P100; ``RTX A4000`` is ``a4000``,
not an A40; ``xa100`` is no A100. Memory sizes are not told apart: an A100 of 80 GB and
one of 40 GB are both ``a100`` (a lab that must tell them apart gives its nodes labels
of its own; see the README).
"""

from __future__ import annotations

import re

MAX_LABEL = 64
# words that name the vendor, the product line, the form factor or the memory, not the GPU
_NOISE = re.compile(
    r"(nvidia|tesla|quadro|geforce|graphics|generation|gpu|pcie|nvl|nvlink|"
    r"sxm\d*|hbm\d*e?|gddr\d*x?|\d+(gb|g|gib))"
)


def type_of(name: str | None) -> str | None:
    """The canonical type of a GPU model name or of a user's ``--gpu-type`` (``"Tesla
    V100-SXM2"`` -> ``"v100"``; an unknown model keeps its own words: ``"NVIDIA L40S"`` ->
    ``"l40s"``); None: none given, or nothing left of it (``"!!!"``, ``"NVIDIA"``)."""
    words = [w for w in re.split(r"[^a-z0-9]+", (name or "").strip().lower()) if w]
    kept = [
        w
        for n, w in enumerate(words)
        if not _NOISE.fullmatch(w)
        # "RTX A4000" is the A4000 (Ampere's line names its model); "RTX 6000" is one
        and not (w == "rtx" and n + 1 < len(words) and words[n + 1][0].isalpha())
    ]
    return "".join(kept)[:MAX_LABEL] or None


def named(name: str | None) -> bool:
    """Whether ``name`` is empty (no type asked for) or names a type (not ``"!!!"``)."""
    return not (name or "").strip() or type_of(name) is not None
