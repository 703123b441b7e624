"""What a hostile review of pueue's verbs found, each pinned: ``logs -n`` splits lines
on ``\\n`` only and reads back at most ``TAIL_MAX`` bytes; ``wait`` names at most ten
missing ids; a table never prints a negative zero."""

from __future__ import annotations

import base64
import io

import pytest

from orchestrator.cli import logs
from orchestrator.cli.output.tables import num

BLOCK = 64 << 10


class _Log:
    """A log the daemon serves in blocks, counting the bytes it hands out."""

    def __init__(self, data: bytes, sized: bool = True):
        self.data, self.sized, self.served = data, sized, 0

    def read(self, offset: int) -> dict:
        block = self.data[offset : offset + BLOCK]
        self.served += len(block)
        size = len(self.data) if self.sized else None
        return {"state": "completed", "sources": 1, "data": base64.b64encode(block).decode(),
                "size": size}  # fmt: skip

    def tail(self, lines: int) -> bytes:
        out = io.BytesIO()
        assert logs._tail(self.read, self.read(0), lines, out) == len(self.data)
        return out.getvalue()


@pytest.mark.parametrize("sized", [True, False])
def test_logs_tail_ends_lines_at_newline_only(sized):
    bars = b"".join(b"\r%3d%%|####" % i for i in range(100))
    log = _Log(b"epoch 1\nepoch 2\n" + bars + b"\n" + bars, sized)
    assert log.tail(3) == b"epoch 2\n" + bars + b"\n" + bars
    assert log.tail(1) == bars


@pytest.mark.parametrize("sized", [True, False])
def test_logs_tail_keeps_at_most_a_mebibyte(sized):
    log = _Log(b"x" * (24 << 20) + b"y" * logs.TAIL_MAX, sized)  # no line break at all
    assert log.tail(1) == b"y" * logs.TAIL_MAX
    if sized:  # only the end is read (windows of 64 KiB, 512 KiB, 1 MiB)
        assert log.served <= 2 * logs.TAIL_MAX
    long_lines = _Log(b"a\n" + b"z" * (3 << 20) + b"\nlast", sized)
    assert long_lines.tail(2) == (b"z" * (3 << 20) + b"\nlast")[-logs.TAIL_MAX :]
    assert long_lines.tail(1) == b"last"


def test_num_never_prints_a_negative_zero():
    assert num(-0.0004, 0, "%") == "0%"
    assert num(-0.0004, 3) == "0.000"
    assert num(-0.0) == "0.0"
    assert num(-0.6, 0, "%") == "-1%"
    assert num(-0.05, 3) == "-0.050"


def test_wait_names_at_most_ten_missing_ids():
    from orchestrator.cli.verbs.wait import _some

    assert _some(list(range(1, 40001))) == "1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 39990 more"
    assert _some([3, 4]) == "3, 4"
