"""One rank's last act in a job: its part has landed (model/rank_parts.py), started together
with the other ranks' (each waits until every one is ready), as torchrun ranks finishing their
last step at once do. Prints "wrote" when this rank wrote the job's profile.

Usage: assemble_worker.py PROFILE WORLD RUN_ID RANK READY_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from neuron_explorer.model import rank_parts

profile, world, run_id, rank, ready = sys.argv[1:6]
ready_dir = Path(ready)
(ready_dir / rank).touch()
while len(list(ready_dir.iterdir())) < int(world):
    time.sleep(0.001)
if rank_parts.part_landed(Path(profile), int(world), run_id, int(rank)):
    print("wrote")
