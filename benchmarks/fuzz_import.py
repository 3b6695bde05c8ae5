"""A longer importer fuzz run than the test's: N mutated real traces through
`neuron-explorer import` in-process, with the same contract (imports and opens with its row
counts, or one line and status 2). Reports inputs per second and the outcome by mutation.

    .venv/bin/python benchmarks/fuzz_import.py [--inputs N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz.fuzz_import import SEEDS, check_one
from fuzz.mutate import KINDS, mutate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    outcome: dict[str, list[int]] = {k: [0, 0] for k in KINDS}  # kind -> [imported, refused]
    broken = []
    t0 = time.perf_counter()
    for i in range(args.inputs):
        rng = random.Random(args.seed * 1_000_003 + i)
        kind = KINDS[i % len(KINDS)]
        seed = rng.randrange(len(SEEDS))
        try:
            ok = check_one(mutate(SEEDS[seed], kind, rng))
            outcome[kind][0 if ok else 1] += 1
        except Exception:  # noqa: BLE001 - a broken contract: keep going, report at the end
            broken.append((i, kind, seed, traceback.format_exc(limit=3)[-600:]))
    s = time.perf_counter() - t0
    imported = sum(v[0] for v in outcome.values())
    print(f"{args.inputs} inputs from {len(SEEDS)} real traces in {s:.0f} s ({args.inputs / s:.0f}/s): "
          f"{imported} imported, {args.inputs - imported - len(broken)} refused in one line, "
          f"{len(broken)} broke the contract")  # fmt: skip
    for kind, (ok, refused) in outcome.items():
        print(f"  {kind:22} imported {ok:5}  refused {refused:5}")
    for i, kind, seed, tb in broken[:10]:
        print(f"input {i} ({kind}, seed trace {seed}):\n{tb}")


if __name__ == "__main__":
    main()
