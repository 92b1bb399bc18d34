"""benchmarks/planner's configs on the CPU: the images-and-audio config resolving to the eager step it documents."""

from mimo.config.load import load_config
from mimo.perf.gpu_defaults import apply_gpu_defaults


def test_the_images_and_audio_config_stays_eager_under_the_gpu_defaults():
    """Its image and clip counts vary from batch to batch: compiled, its encoders and the LM's layers would
    recompile on the first steps (the GPU call that gave no row), so the file turns compile off itself."""
    cfg = load_config("benchmarks/planner/avlm_h200.toml", [])
    applied = apply_gpu_defaults(cfg, None)
    assert cfg.train.device == "cuda" and "compile" not in applied and cfg.train.compile is False
    assert not cfg.train.step_graph and cfg.data.global_batch == 128
