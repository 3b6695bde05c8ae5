"""Which source files a capture keeps in sources/ (explorer/capture/sources.py)."""

from __future__ import annotations

import os

from neuron_explorer.capture.sources import MAX_SOURCE_BYTES, readable


def test_only_small_text_files_under_a_root_are_kept(tmp_path):
    root, outside = tmp_path / "project", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (root / "big.py").write_text("#" * (MAX_SOURCE_BYTES + 1))
    (root / "binary.py").write_bytes(b"\xff\xfe\x00")
    (outside / "secret.py").write_text("token = 1\n")
    os.symlink(outside / "secret.py", root / "link.py")  # resolves outside the root
    names = [str(root / n) for n in ("train.py", "big.py", "binary.py", "link.py", "gone.py")]
    names.append(str(outside / "secret.py"))
    kept = dict(readable(names, [str(root)]))
    assert kept == {str(root / "train.py"): "print('hi')\n"}
