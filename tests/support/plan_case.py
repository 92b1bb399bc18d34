"""The planner tests' tiny language model and its memory estimate under a layout."""

from __future__ import annotations

from mimo.planner.candidates import layout_of
from mimo.planner.memory import estimate, module_sizes

# A text-only LM small enough to count by hand (no biases, untied head):
#   embedding 64 x 32 = 2048, head 2048, final norm 32;
#   per layer: q 32x32 = 1024, k and v 16x32 = 512 each (2 kv heads of 8), o 1024, gate/up/down 3 x 64x32 = 6144
#   -> 9216 in 2-D weights, + 2 x 32 = 64 in the two norms.
#   total = 2048 + 2048 + 32 + 2 x (9216 + 64) = 22688 parameters.
TINY = ["--model.llm.vocab=64", "--model.llm.hidden=32", "--model.llm.layers=2", "--model.llm.heads=4",
        "--model.llm.kv_heads=2", "--model.llm.mlp=64", "--model.llm.qkv_bias=false", "--data.global_batch=8",
        "--data.seq_len=16", "--precision.dtype=bfloat16"]


def usage_of(cfg, modules, gpus):
    layout = layout_of(cfg, modules, gpus)
    assert layout is not None
    return estimate(cfg, layout, module_sizes(cfg), modules)
