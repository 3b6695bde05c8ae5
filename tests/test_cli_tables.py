"""Terminal tables at 80 columns (piped, or a narrow terminal) and at full width: nothing is cut
to `kerne…`, numbers stay whole, and a wide terminal gets the plain wide table."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_explorer.cli.tables import fit_table, wrap_parts

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "profiles" / "gpt_train"


def _cli(*args: str, columns: int | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns:
        env["COLUMNS"] = str(columns)
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _render(renderable: object, width: int) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("args", [("summary", str(SAMPLE)), ("query", str(SAMPLE),
                         "SELECT name, kind, src_file, src_line, dur_ns FROM events "
                         "WHERE src_file IS NOT NULL ORDER BY dur_ns DESC LIMIT 5")])  # fmt: skip
def test_piped_output_fits_80_columns_and_cuts_nothing(args):
    out = _cli(*args)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    if args[0] == "summary":
        # the Devices table, too wide for 80 columns, is turned: one line per column
        assert any(line.split("│")[1:2] == [" idle in window "] for line in out.splitlines())
        # "wall N ms" stays on one line wherever the header breaks (the path's length decides)
        assert re.search(r"\bwall [0-9][0-9,.]* ms", out)
        assert "native_layer_norm" in out  # long kernel names wrap, they are not cut
    else:
        assert "/work" in out or "samples" in out  # the paths are there, whole or wrapped


def test_a_wide_terminal_gets_the_wide_tables():
    out = _cli("summary", str(SAMPLE), columns=200)
    header = next(line for line in out.splitlines() if "idle in window" in line)
    assert "kernels" in header and "busy share" in header  # one row per device, as wide as it is
    assert max(len(line) for line in out.splitlines()) > 120


def test_fit_table_keeps_numbers_whole_and_wraps_text():
    rows = [[f"a_rather_long_kernel_name_number_{i}", f"{i * 1234.5678:,.3f} ms", f"{i}%"]
            for i in range(3)]  # fmt: skip
    text = _render(fit_table(40, ["kernel", "total", "share"], rows, right=(1, 2)), 40)
    assert max(len(line) for line in text.splitlines()) <= 40
    assert "2,469.136 ms" in text and "…" not in text
    wide = _render(fit_table(120, ["kernel", "total", "share"], rows), 120)
    assert "a_rather_long_kernel_name_number_2" in wide  # natural width when it fits


def test_too_many_columns_turn_and_too_many_rows_become_blocks():
    heads = [f"column {i}" for i in range(12)]
    few = [[f"{r}.{i}" for i in range(12)] for r in range(2)]
    turned = _render(fit_table(50, heads, few), 50)
    assert any(line.split("│")[1:2] == [" column 11 "] for line in turned.splitlines())
    many = [[f"{r}.{i}" for i in range(12)] for r in range(10)]
    blocks = _render(fit_table(50, heads, many), 50)
    assert "column 11  9.11" in blocks and max(len(x) for x in blocks.splitlines()) <= 50


def test_wrap_parts_breaks_between_parts_only():
    text = wrap_parts(30, ["steps: 3", "mean 23.739 ms", "median 24.133 ms", "max 24.310 ms"])
    assert text.splitlines() == ["steps: 3, mean 23.739 ms,", "  median 24.133 ms,",
                                 "  max 24.310 ms"]  # fmt: skip
