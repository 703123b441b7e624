"""``report``'s rows per label as its text and its plot show them (the request's answer,
``accounting.reports.report``, keeps every label as it is; kept apart from it so the
client need not import the store to draw them)."""

from __future__ import annotations

#: The row of other users' jobs (their labels are private to them).
OTHERS = "(other users)"
#: Names of the report's own rows: a label named so is shown quoted (``label_rows``).
_OWN_ROWS = frozenset({OTHERS, "total"})


def label_rows(data: dict) -> list[tuple[str, dict]]:
    """Each label's row (a label named as a row of the report's own, ``(other users)`` or
    ``total``, in quotes, so that no label passes for that row), then other users' jobs in
    one row, ``OTHERS`` (``others_labels_hidden``; none where no label is left out)."""
    rows = [(f'"{k}"' if k in _OWN_ROWS else k, r) for k, r in data["by_label"].items()]
    if data.get("others_labels_hidden"):
        rows.append((OTHERS, data["others_labels_hidden"]))
    return rows
