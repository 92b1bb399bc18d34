"""`perf.compile` with `perf.encoder_compile = "blocks"` compiles each block of the native-resolution tower (its
`blocks`, not `layers`); the compiled tower gives the eager tower's rows, and batches of new image sizes (new
segment groupings) after the first two reuse the compiled graphs: segment attention and the host layout run outside
them, so the whole tower compiles too without `.item()` breaks."""

import pytest
import torch
from torch._dynamo.utils import counters
from torch.distributed._composable import checkpoint

from mimo.config.schema import Config
from mimo.config.train_config import PerfConfig
from mimo.models.build import build_model
from mimo.perf.apply import apply_fast_paths, transformer_blocks
from tests.support.configs import tiny_native_vlm

pytestmark = pytest.mark.usefixtures("one_thread")

GRIDS = [[[1, 10, 14], [3, 6, 4]], [[1, 4, 4], [1, 2, 6]], [[1, 8, 8], [1, 6, 10], [2, 4, 4]], [[1, 12, 6]]]


def test_blocks_compile_the_native_towers_blocks():
    torch.manual_seed(0)
    cfg = Config(model=tiny_native_vlm(layers=3, full_attention_layers=[1]),
                 perf=PerfConfig(compile=True, compile_backend="eager"))
    assert cfg.perf.encoder_compile == "blocks"
    plain = build_model(cfg.model).eval()
    model = build_model(cfg.model).eval()
    model.load_state_dict(plain.state_dict())
    torch.compiler.reset()
    counters.clear()
    apply_fast_paths(cfg, model)
    tower = next(iter(model.modality_submodules["images"].encoders.values()))
    blocks = transformer_blocks(model, "images")
    assert blocks == list(tower.blocks.values()) and len(blocks) == 3
    assert all(b._compiled_call_impl is not None for b in blocks)
    eager = next(iter(plain.modality_submodules["images"].encoders.values()))
    graphs = []
    for grids in GRIDS:
        g = torch.tensor(grids)
        pixels = torch.randn(int(g.prod(-1).sum()), tower.cfg.patch_pixels)
        with torch.no_grad():
            torch.testing.assert_close(tower(pixels, g), eager(pixels, g), rtol=0, atol=1e-6)
        graphs.append(counters["stats"]["unique_graphs"])
    # each block: the graph before its attention and the one after; once static, then once with dynamic N
    assert graphs[0] > 0 and graphs[1] == graphs[2] == graphs[3]
    torch.compiler.reset()


def test_activation_checkpointing_of_images_checkpoints_the_native_tower():
    """The tower's blocks are checkpointed too: the same rows and pixel gradients as the plain tower."""
    torch.manual_seed(0)
    cfg = Config(model=tiny_native_vlm(layers=3, full_attention_layers=[1]),
                 perf=PerfConfig(activation_checkpointing=["images"]))
    plain, model = build_model(cfg.model), build_model(cfg.model)
    model.load_state_dict(plain.state_dict())
    apply_fast_paths(cfg, model)
    g = torch.tensor(GRIDS[0])
    pixels = torch.randn(int(g.prod(-1).sum()), 3 * 2 * 4 * 4)
    grads = []
    for m in (plain, model):
        x = pixels.clone().requires_grad_()
        next(iter(m.modality_submodules["images"].encoders.values()))(x, g).square().sum().backward()
        grads.append(x.grad)
    assert all(checkpoint.state(b) is not None for b in transformer_blocks(model, "images"))  # checkpoint_blocks
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-6)


def test_whole_tower_compiles_with_no_break_but_its_host_layout_and_attention():
    """`encoder_compile = "whole"` on padded per-item pixels (the data pipeline's): the grid is read and the
    layout built once per forward outside the graph, so Dynamo breaks only at the two disabled functions (no
    `.item()`, no data-dependent shape) and, after the second batch, new image sizes add no graphs."""
    torch.manual_seed(0)
    cfg = Config(model=tiny_native_vlm(layers=3, full_attention_layers=[1]),
                 perf=PerfConfig(compile=True, compile_backend="eager", encoder_compile="whole"))
    plain, model = build_model(cfg.model).eval(), build_model(cfg.model).eval()
    model.load_state_dict(plain.state_dict())
    torch.compiler.reset()
    counters.clear()
    apply_fast_paths(cfg, model)
    tower, eager = (next(iter(m.modality_submodules["images"].encoders.values())) for m in (model, plain))
    graphs = []
    for grids in GRIDS:
        g = torch.tensor(grids)
        pixels = torch.randn(len(grids), int(g.prod(-1).max()), tower.cfg.patch_pixels)
        with torch.no_grad():
            torch.testing.assert_close(tower(pixels, g), eager(pixels, g), rtol=0, atol=1e-6)
        graphs.append(counters["stats"]["unique_graphs"])
    breaks = list(counters["graph_break"])
    named = {f for f in ("tower_layout", "segment_attention") for reason in breaks if f"`{f}`" in reason}
    assert named == {"tower_layout", "segment_attention"} and len(breaks) == 2, breaks
    assert graphs[0] > 0 and graphs[1] == graphs[2] == graphs[3]
    torch.compiler.reset()
