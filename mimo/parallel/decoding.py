"""Greedy decoding on a laid-out model, in its training layout: every rank runs the same whole batch in step.

Decoding feeds the LM one new token at a time, which neither sequence parallelism (a sequence split over the
TP group) nor context parallelism (a sequence split over the CP group) can cut. `whole_sequences` switches both
off for a block: each TP rank then runs the whole sequence as under plain TP (inputs copied into the TP region,
row-parallel outputs all-reduced, full-vocabulary logits gathered) and each CP rank runs it with its layers' own
attention. No weight moves; TP, FSDP and expert sharding stay as trained.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from mimo.config.schema import LANGUAGE
from mimo.models.multimodal import MimoModel
from mimo.parallel.plan import ParallelPlan
from mimo.parallel.tensor import set_lm_sequence_parallel, tp_lm_logits


@contextlib.contextmanager
def whole_sequences(plan: ParallelPlan, model: MimoModel) -> Iterator[None]:
    """Inside the block `model` (laid out by `plan.parallelize`) takes whole, unsplit sequences on every rank;
    the layout as trained is restored on exit: the model runs a runtime of whole sequences
    (`MimoModel.running`), its LM's layers their unsplit forms. Refuses a layout that cannot decode in place
    (`ParallelPlan.decodes_in_place`). Not collective itself; the model's forwards inside stay collective."""
    if not plan.decodes_in_place():
        raise ValueError("this layout cannot decode in place (pipelined, or a bridge between data lanes of "
                         "different widths); evaluate the run folder with `mimo eval --run`")
    lm_cfg = plan.module_cfg[LANGUAGE]
    split = (lm_cfg is not None and lm_cfg.sequence_parallel and plan.layout.grids[LANGUAGE].tp > 1
             and plan.holds(LANGUAGE))
    runtime = dataclasses.replace(model.runtime, shard_sequence=None, gather_sequence=None, mask_positions=None,
                                  lm_attention=None)
    if split:
        set_lm_sequence_parallel(model.language_model, False)
        runtime = dataclasses.replace(runtime, logits_fn=tp_lm_logits(plan.groups[LANGUAGE].group("tp"), False))
    try:
        with model.running(runtime):
            yield
    finally:
        if split:
            set_lm_sequence_parallel(model.language_model, True)
