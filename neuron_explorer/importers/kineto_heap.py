"""The chunked import's C heap: freed blocks kept in the process for the next chunk's and the
next row group's temporaries, instead of handed back to the OS at once and faulted in fresh
again (benchmarks/README.md, "Seventh round": two thirds of the 1 GB import's page faults and
half its system time were memory given back and taken again).

glibc's malloc by default gives a block of 128 KB to 32 MB a mapping of its own (the threshold
rising with what is freed) and shrinks the heap whenever its free top passes 128 KB. Here
blocks under HEAP_BLOCK_BYTES stay on the heap and the heap is shrunk only where the import
says so (`give_back_free_memory`, between chunks); larger ones, numpy's with transparent huge
pages where the kernel gives them (numpy asks for arrays of 4 MB or more), keep their own
mappings, so the heap holds no chunk-sized holes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

from .kineto_columns import OWN_MAPPING_BYTES, give_back_free_memory

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
HEAP_BLOCK_BYTES = 4 << 20  # blocks under this come from (and go back to) the heap
NEVER_TRIM = 2**31 - 1  # (mallopt's largest) the heap's free top goes back only by a trim
DEFAULT_TRIM_BYTES = 128 << 10  # glibc's default trim threshold


def _mallopt(param: int, value: int) -> None:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(param, value)


@contextmanager
def freed_blocks_kept() -> Iterator[None]:
    """Within: freed blocks under HEAP_BLOCK_BYTES stay in the process (and in the forked
    workers, which inherit the setting) until a give_back_free_memory; after: the heap given
    back and the streaming import's setting (kineto_columns.map_large_blocks) in force."""
    _mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES)
    _mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)
    try:
        yield
    finally:
        _mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_BYTES)
        _mallopt(M_MMAP_THRESHOLD, OWN_MAPPING_BYTES)
        give_back_free_memory()
