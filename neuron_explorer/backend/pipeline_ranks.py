"""A pipeline schedule (`torch.distributed.pipelining`) in a modeled job (`--model-ranks N`,
backend/model_ranks.py): rank 0 runs stage 0, and the other stages are copies of it.

Two things a real job's peers would give rank 0 are made here from its own stage:

- **Metadata.** Stage 0 asks stage 1 (`_recv_meta`) for the gradient metadata of its outputs:
  a gradient has the shape, strides and dtype of the activation stage 0 sent, so that answer
  is derived from stage 0's outputs (`_derive_grad_metas`, what stage 1 computes). A stage
  that needs its *inputs'* metadata from a previous stage (rank 0 running a stage other than
  the first, or several stages a rank: `PipelineScheduleMulti`) cannot be answered from its
  own, and the run stops with one error saying so.
- **Time.** Each receive of a gradient waits, on the one modeled clock, until the copy of
  stage 1 would have sent it. The copies run their schedule's order (`order`, as each
  stage's `_step_microbatches` runs it) at stage 0's measured costs: a forward of a
  micro-batch the least it took on rank 0; a backward the least any took, less the adding of
  its gradients to an earlier micro-batch's, plus that adding as rank 0 did it for the same
  micro-batch and the gradient of the copy's input, which stage 0 never computes and a later
  stage does; the last stage's copy adds its loss to each forward and backward, and the merge
  of its outputs to its step (all priced by the cost model: backend/pipeline_costs.py);
  before any backward ran, twice the forward. An activation or a gradient arrives one
  modeled point-to-point transfer after it was sent (costmodel/collectives.py). So rank 0's
  wait for stage 1 is the bubble of a pipeline of identical stages, and `stages()` is each
  copy's busy time and waits in the step (the profile's manifest keeps the last recorded
  step's).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections import deque
from typing import Any

from neuron_explorer.backend import pipeline_costs
from neuron_explorer.errors import ExplorerError

_STAGE = "torch.distributed.pipelining.stage"
_SCHEDULES = "torch.distributed.pipelining.schedules"


def install() -> None:
    """Hook torch.distributed.pipelining once it is imported (a modeled job only)."""
    from neuron_explorer.backend import after_import

    after_import.run_after(_STAGE, _hook_stage)
    after_import.run_after(_SCHEDULES, _hook_schedules)


class _Peers:
    """The copies of a pipeline's stages, as rank 0's schedule sees them, for one step."""

    def __init__(self, schedule: Any, stage: Any) -> None:
        self.schedule = schedule
        self.stage = stage
        self.n_stages = stage.num_stages
        m = schedule._n_microbatches
        self.actions = {s: order(type(schedule).__name__, s, self.n_stages, m)
                        for s in range(1, self.n_stages)}  # fmt: skip
        # the least measured costs, kept between steps: a host pause on rank 0 (its Python,
        # a busy machine) is its own, not its copies'
        self.forward_ns: dict[int, int] = {}  # micro-batch -> its forward's
        self.backward_ns = 0  # any backward's, less its gradients' accumulation
        self.accumulate_ns: dict[int, int] = {}  # micro-batch -> adding to earlier gradients
        self.input_grad_ns = 0  # what a later stage's backward adds: its input's gradient
        self.loss_ns = (0, 0, 0)  # the last stage's loss, forward and backward; its merge
        self.priced: tuple | None = None  # the shapes the two above were priced for
        self.start()

    def start(self) -> None:
        self.sent: dict[int, int] = {}  # micro-batch -> stage 0's forward end (its send)
        self.step_start: int | None = None
        self.transfer_ns = 0
        self.grads: deque[int] = deque()  # micro-batches whose gradient rank 0 receives next

    def price(self, args: Any, kwargs: Any, out: Any) -> None:
        """Price what a later stage adds to stage 0's work (pipeline_costs.py), once for each
        set of shapes stage 0 runs."""
        import torch

        key = tuple((tuple(t.shape), t.dtype) for t in _tensors((args, kwargs, out)))
        if key == self.priced:
            return
        self.priced = key
        sch = self.schedule
        first = out if isinstance(out, torch.Tensor) else next(iter(_tensors(out)), None)
        try:
            self.input_grad_ns = pipeline_costs.input_grad_ns(self.stage.submod, args, kwargs)
            self.loss_ns = pipeline_costs.loss_ns(
                sch._loss_fn, first, sch._merge_outputs, sch._n_microbatches
            )
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:  # no meta run
            warnings.warn(f"--model-ranks: the pipeline's later stages are modeled without "
                          f"their input's gradient and loss, which could not be priced on "
                          f"meta tensors ({type(e).__name__}: {e})", stacklevel=2)  # fmt: skip

    def backward_cost(self, mb: int) -> int:
        """A copy's backward of `mb`: the least of those rank 0 ran, less the adding of its
        gradients to earlier micro-batches' (a step's first backward comes before rank 0 runs
        any, and its time can hold a wait for the gradient), plus that adding as rank 0 did it
        for `mb` and the gradient of the copy's input, which stage 0 never computes; before
        any ran, twice the forward (two matmuls for each of the forward's)."""
        if self.backward_ns:
            return self.backward_ns + self.accumulate_ns.get(mb, 0) + self.input_grad_ns
        return 2 * self.forward_ns.get(mb, 0)

    def sender_end(self, mb: int) -> int | None:
        """When the copy of stage 1 sends the gradient of micro-batch `mb`, None if the
        copies cannot get there with what rank 0 sent so far."""
        return self.run()[0].get(("B", 1, mb))

    def run(self) -> tuple[dict[tuple[str, int, int], int], dict[int, int], dict[int, int]]:
        """The copies' step as far as what rank 0 sent allows: each action's end by (kind,
        stage, micro-batch), and each copy's busy time and its waits for an activation or a
        gradient after its first action (before it, the pipeline's fill)."""
        start = self.step_start or 0
        free = dict.fromkeys(self.actions, start)
        done: dict[tuple[str, int, int], int] = {}
        busy, wait = dict.fromkeys(self.actions, 0), dict.fromkeys(self.actions, 0)
        at = dict.fromkeys(self.actions, 0)
        progressed = True
        while progressed:
            progressed = False
            for s, acts in self.actions.items():
                while at[s] < len(acts):
                    kind, j = acts[at[s]]
                    last = s == self.n_stages - 1
                    if kind == "F":
                        src = self.sent.get(j) if s == 1 else done.get(("F", s - 1, j))
                        cost = self.forward_ns.get(j)
                    else:
                        src = free[s] if last else done.get(("B", s + 1, j))
                        cost = self.backward_cost(j)
                    if src is None or cost is None:
                        break
                    if last:  # its loss: after the forward, at the start of the backward
                        cost += self.loss_ns[0] if kind == "F" else self.loss_ns[1]
                    hop = 0 if kind == "B" and s == self.n_stages - 1 else self.transfer_ns
                    if at[s]:
                        wait[s] += max(0, src - free[s])
                    free[s] = done[(kind, s, j)] = max(free[s], src) + hop + cost
                    busy[s] += cost
                    at[s] += 1
                    progressed = True
        return done, busy, wait

    def stages(self) -> dict[str, Any]:
        """What the copies did in the step (docs/device.md): each one's busy time and waits,
        beside the busy time of stage 0 as rank 0 ran it and its gradients' adding, priced
        for each micro-batch."""
        _, busy, wait = self.run()
        busy[self.n_stages - 1] += self.loss_ns[2]  # the merge of the outputs step returns
        own = sum(self.forward_ns[j] + self.backward_ns + self.accumulate_ns.get(j, 0)
                  for j in self.forward_ns)  # fmt: skip
        copies = [{"stage": s, "busy_ns": busy[s], "wait_ns": wait[s]} for s in busy]
        adds = [self.accumulate_ns.get(j, 0) for j in sorted(self.forward_ns)]
        return {"stage0_busy_ns": own, "stage0_accumulate_ns": adds, "copies": copies}


def order(schedule: str, stage: int, n_stages: int, m: int) -> list[tuple[str, int]]:
    """The forwards ("F", micro-batch) and backwards ("B", micro-batch) stage `stage` runs in
    one step of `schedule`, in the order its `_step_microbatches` runs them (torch's
    `pipeline_order` of Schedule1F1B, a drawing, starts the last stage at micro-batch 1)."""
    forwards, backwards = [("F", j) for j in range(m)], [("B", j) for j in range(m)]
    if schedule == "ScheduleGPipe":
        return forwards + backwards
    if schedule == "_ScheduleForwardOnly":
        return forwards
    if schedule != "Schedule1F1B":
        raise ExplorerError(
            f"--model-ranks: no model of the {schedule} pipeline schedule's order for the "
            "copies of its stages: model ScheduleGPipe or Schedule1F1B, or run this one as "
            "a real torchrun job"
        )
    warmup = min(m, n_stages - stage)
    steps = forwards[:warmup]
    for j in range(m):  # one backward, then the next forward while any is left
        steps.append(backwards[j])
        if warmup + j < m:
            steps.append(forwards[warmup + j])
    return steps


_peers: dict[int, _Peers] = {}  # id(stage) -> its copies
_active: list[_Peers] = []  # the schedule stepping now
last_step: dict[str, Any] = {}  # the copies of the last step a profiler recorded (stages())


def _measuring(stage: Any) -> _Peers | None:
    """The copies of `stage` while it steps and a profiler records (the modeled clock runs
    only then: a step outside it measures the simulator, not the chip)."""
    from torch.autograd import profiler

    if not (_active and _active[-1].stage is stage and profiler._is_profiler_enabled):
        return None
    return _active[-1]


def _now_on_device() -> int:
    """The modeled instant the host and the device are both at (what a send would carry)."""
    from neuron_explorer.backend.runtime import model

    return model.origin_ns + max(model.modeled_now(time.time_ns()), model.device_idle_at())


def sender(peer: int) -> int | None:
    """The modeled send of the gradient rank 0 receives now from group rank `peer`, None when
    it is no pipeline gradient (runtime/arrivals.py asks it of every modeled receive)."""
    if not _active:
        return None
    peers = _active[-1]
    stage = peers.stage
    if stage.is_last or peer != stage.stage_index_to_group_rank.get(stage.stage_index + 1):
        return None
    if not peers.grads:
        return None
    return peers.sender_end(peers.grads.popleft())


def _hook_schedules() -> None:
    from torch.distributed.pipelining import schedules

    single, multi = schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti
    if getattr(single.step, "_neuron", False):
        return
    step_single, step_multi = single.step, multi.step

    @functools.wraps(step_single)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        stage = self._stage
        peers = _peers.get(id(stage))
        if peers is None or peers.stage is not stage:
            peers = _peers[id(stage)] = _Peers(self, stage)
        peers.start()
        _active.append(peers)
        try:
            out = step_single(self, *args, **kwargs)
            if _measuring(stage):
                last_step.clear()
                last_step.update(peers.stages())
            return out
        finally:
            _active.pop()

    @functools.wraps(step_multi)
    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ExplorerError(
            f"--model-ranks: {type(self).__name__} runs several pipeline stages a rank, and "
            "rank 0's later stages take their inputs from stages no copy runs: model a "
            "single-stage schedule (ScheduleGPipe, Schedule1F1B), or run this one as a real "
            "torchrun job"
        )

    step._neuron = True  # type: ignore[attr-defined]
    single.step = step  # type: ignore[method-assign]
    multi.step = refuse  # type: ignore[method-assign]


def _hook_stage() -> None:
    from torch.distributed.pipelining import stage as stage_module

    base, plain = stage_module._PipelineStageBase, stage_module.PipelineStage
    if getattr(base.forward_one_chunk, "_neuron", False):
        return
    forward, backward = base.forward_one_chunk, base.backward_one_chunk
    grads = base.get_bwd_recv_ops

    @functools.wraps(forward)
    def forward_one_chunk(self: Any, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        peers = _measuring(self)
        begin = _now_on_device() if peers else 0
        out = forward(self, fwd_chunk_id, *args, **kwargs)
        if peers:
            end = _now_on_device()
            cost = end - begin
            peers.forward_ns[fwd_chunk_id] = min(cost, peers.forward_ns.get(fwd_chunk_id, cost))
            peers.sent[fwd_chunk_id] = end
            if peers.step_start is None:
                peers.step_start = begin
            peers.transfer_ns = _transfer_ns(out)
            inputs = args[0] if args else kwargs.get("args", ())
            peers.price(inputs, args[1] if len(args) > 1 else kwargs.get("kwargs"), out)
        return out

    @functools.wraps(backward)
    def backward_one_chunk(self: Any, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        peers = _measuring(self)
        begin = _now_on_device() if peers else 0
        adds = pipeline_costs.accumulate_ns(self.submod) if peers else 0
        out = backward(self, bwd_chunk_id, *args, **kwargs)
        if peers:
            cost = max(1, _now_on_device() - begin - adds)
            peers.backward_ns = min(cost, peers.backward_ns or cost)
            peers.accumulate_ns[bwd_chunk_id] = adds
        return out

    @functools.wraps(grads)
    def get_bwd_recv_ops(self: Any, bwd_chunk_id: int) -> Any:
        ops = grads(self, bwd_chunk_id)
        if ops and _active and _active[-1].stage is self:
            _active[-1].grads.append(bwd_chunk_id)
        return ops

    forward_one_chunk._neuron = True  # type: ignore[attr-defined]
    base.forward_one_chunk = forward_one_chunk  # type: ignore[method-assign]
    base.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]
    base.get_bwd_recv_ops = get_bwd_recv_ops  # type: ignore[method-assign]
    plain._recv_meta = _recv_meta_from_own_outputs  # type: ignore[method-assign]


def _recv_meta_from_own_outputs(self: Any, src_stage: int) -> Any:
    """What stage `src_stage` would send this stage: the metadata of the gradients of this
    stage's outputs (they have the outputs' shapes); a previous stage's outputs are unknown."""
    from torch.distributed.pipelining._utils import _derive_grad_metas, _StageBackwardMeta

    outputs = self._stage_meta.outputs
    if src_stage == self.stage_index + 1 and outputs is not None:
        return _StageBackwardMeta(backward_metas=_derive_grad_metas(outputs))
    raise ExplorerError(
        f"--model-ranks: rank 0 runs pipeline stage "
        f"{self.stage_index}, whose inputs come from stage {src_stage} that no copy runs "
        "(a modeled pipeline executes its first stage): give rank 0 stage 0, or run the "
        "pipeline as a real torchrun job"
    )


def _transfer_ns(out: Any) -> int:
    """The modeled point-to-point transfer of a stage's output (an activation; its gradient
    has the same bytes)."""
    import torch

    from neuron_explorer.backend.costmodel import collectives as cc
    from neuron_explorer.backend.runtime import model

    tensors = [out] if isinstance(out, torch.Tensor) else list(out or ())
    nbytes = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return cc.collective_cost(cc.P2P, nbytes, 2, model.spec().collectives).transfer_ns


def _tensors(tree: Any) -> list[Any]:
    import torch
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]
