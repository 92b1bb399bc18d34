"""The config's sections: a key that moved is refused with its new name and a retired one naming why (the
migration tables, in a TOML file and on the command line; a run folder's saved config.toml loads with them), and an
enumeration is checked by its `Literal` type, naming the values."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from mimo.config.load import load_config
from mimo.config.migrate import MOVED_KEYS, RETIRED_KEYS
from mimo.config.reference import explain
from mimo.config.schema import Config, ConfigError
from tests.support.configs import CONFIGS

DEMO = CONFIGS / "demo_vlm.toml"


def test_an_old_key_in_a_toml_file_names_its_new_key(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text(DEMO.read_text().replace("[train]\n", "[train]\ncompile = true\n", 1))
    with pytest.raises(ConfigError, match=rf"^train.compile moved to perf.compile; rename it in '{old}'$"):
        load_config(old)
    old.write_text(DEMO.read_text().replace("[run]\n", "[run]\ntensorboard = false\n", 1))
    with pytest.raises(ConfigError, match=r"^run.tensorboard moved to metrics.tensorboard"):
        load_config(old)


def test_a_run_folders_config_written_before_the_move_loads_under_the_new_keys(tmp_path):
    """A saved run's config.toml (mimo wrote it; its keys keep their meaning) is read with the moved keys renamed,
    so an older run still exports, evaluates and generates."""
    saved = tmp_path / "config.toml"
    saved.write_text(DEMO.read_text().replace("[train]\n", "[train]\nkeep_checkpoints = 5\nfuse_qkv = true\n", 1)
                     .replace("[run]\n", "[run]\nprogress = false\n", 1))
    cfg = load_config(saved, saved_run=True)
    assert (cfg.checkpoint.keep, cfg.perf.fuse_qkv, cfg.metrics.progress) == (5, True, False)
    with pytest.raises(ConfigError, match=r"^train.fuse_qkv moved to perf.fuse_qkv"):  # the table's first
        load_config(saved)



@pytest.mark.parametrize("key", sorted(RETIRED_KEYS))
def test_a_retired_key_is_refused_naming_why_and_a_saved_run_loads_without_it(tmp_path, key):
    section, name = key.split(".")
    why = r" was retired \(.*BENCHMARKS.md\); remove it in "
    with pytest.raises(ConfigError, match=rf"^{key}{why}the command line's overrides$"):
        load_config(DEMO, [f"--{key}=true"])
    saved = tmp_path / "config.toml"
    saved.write_text(f"{DEMO.read_text()}\n[{section}]\n{name} = true\n" if f"[{section}]\n" not in DEMO.read_text()
                     else DEMO.read_text().replace(f"[{section}]\n", f"[{section}]\n{name} = true\n", 1))
    with pytest.raises(ConfigError, match=rf"^{key}{why}'{saved}'$"):
        load_config(saved)
    assert load_config(saved, saved_run=True) == load_config(DEMO, saved_run=True)
    with pytest.raises(ConfigError, match=rf"^{key} was retired"):
        explain(key)

@pytest.mark.parametrize("override, new", [("--train.keep_checkpoints=3", "checkpoint.keep"),
                                           ("--train.dtype=bfloat16", "precision.dtype"),
                                           ("--train.resume=true", "checkpoint.resume"),
                                           ("--run.wandb=true", "metrics.wandb")])
def test_an_old_key_on_the_command_line_names_its_new_key(override, new):
    old = override[2:].split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{old} moved to {new}; rename it in the command line's overrides$"):
        load_config(DEMO, [override])


def test_every_moved_key_names_a_key_that_exists_and_no_old_one_does():
    cfg = Config()
    keys = {f"{s.name}.{f.name}" for s in dataclasses.fields(cfg) for f in dataclasses.fields(getattr(cfg, s.name))}
    assert set(MOVED_KEYS.values()) <= keys
    assert not (set(MOVED_KEYS) | set(RETIRED_KEYS)) & keys
    assert load_config(DEMO, ["--perf.compile=false", "--checkpoint.keep=3"]).checkpoint.keep == 3


def test_an_enumeration_is_checked_by_its_type_naming_the_key_and_its_values():
    with pytest.raises(ConfigError, match=r"^optim.schedule = 'cosin'; choose one of 'cosine', 'linear', 'constant'$"):
        load_config(DEMO, ["--optim.schedule=cosin"])
    with pytest.raises(ConfigError, match=r"^model.modalities.images.kind = 'video'; choose one of 'vision', "):
        load_config(DEMO, ["--model.modalities.images.kind=video"])
    with pytest.raises(ConfigError, match=r"^precision.module_dtype.images = 'fp16'; choose one of 'float32', "):
        load_config(DEMO, ["--precision.module_dtype.images=fp16"])
    with pytest.raises(ConfigError, match=r"^model.llm.layer_types\[1\] = 'local'; choose one of 'sliding', 'full'"):
        load_config(DEMO, ["--model.llm.layers=2", '--model.llm.layer_types=["full", "local"]'])
    assert load_config(DEMO, ["--perf.attention_backend=math"]).perf.attention_backend == "math"


@pytest.mark.parametrize("section, key", [("precision", "dtype"), ("precision", "float8_recipe"),
                                          ("perf", "attention_backend"), ("perf", "encoder_compile"),
                                          ("perf", "compile_backend"), ("optim", "schedule")])
def test_the_enumerations_checked_by_hand_before_are_typed(section, key):
    cls = type(getattr(Config(), section))
    assert typing.get_origin(typing.get_type_hints(cls)[key]) is typing.Literal
