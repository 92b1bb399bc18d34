"""Config: TOML + dotted overrides, unknown keys and wrong types are errors that name the key."""

from pathlib import Path

import pytest

from mimo.config.load import dump_toml, load_config, parse_overrides
from mimo.config.schema import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo_vlm.toml"


def test_demo_loads_and_overrides_apply():
    cfg = load_config(DEMO, ["--train.steps=50", "--model.llm.layers", "4", "--optim.lr=2e-4"])
    assert cfg.train.steps == 50 and cfg.model.llm.layers == 4 and cfg.optim.lr == 2e-4
    assert cfg.model.modalities["images"].vit.patch == 8


def test_unknown_key_names_it_and_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown config key 'train.stepz'; valid keys in 'train': steps"):
        load_config(DEMO, ["--train.stepz=5"])
    with pytest.raises(ConfigError, match=r"'model.modalities.images.vit.bogus'"):
        load_config(DEMO, ["--model.modalities.images.vit.bogus=1"])


def test_wrong_types_are_errors():
    with pytest.raises(ConfigError, match="'train.steps' must be an integer"):
        load_config(DEMO, ["--train.steps=abc"])
    with pytest.raises(ConfigError, match="'model.llm.qkv_bias' must be true or false"):
        load_config(DEMO, ["--model.llm.qkv_bias=1"])
    assert load_config(DEMO, ["--optim.lr=1"]).optim.lr == 1.0


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="heads .* must be divisible by model.llm.kv_heads"):
        load_config(DEMO, ["--model.llm.kv_heads=3"])
    with pytest.raises(ConfigError, match="parallel.modules.vision names no module"):
        load_config(DEMO, ["--parallel.modules.vision.tp=2"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("nope.toml")
    with pytest.raises(ConfigError, match="drop_first_patch is for towers without a class token"):
        load_config(DEMO, ["--model.modalities.images.vit.drop_first_patch=true"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(DEMO, ["--train.steps=7"])
    p = tmp_path / "c.toml"
    p.write_text(dump_toml(cfg))
    assert load_config(p) == cfg


def test_override_parsing():
    assert parse_overrides(["--a.b=1", "--a.c=x", "--d=[1, 2]"]) == {"a": {"b": 1, "c": "x"}, "d": [1, 2]}
    with pytest.raises(ConfigError, match="expected an override"):
        parse_overrides(["a=1"])
