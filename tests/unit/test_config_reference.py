"""The configuration reference: every key of the schema documented in one line, docs/configuration.md
regenerated from it (stale means this test fails), and `mimo config KEY` explaining one key."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from mimo.config.reference import config_keys, explain, reference_markdown
from mimo.config.schema import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"


def test_docs_configuration_md_is_the_generated_reference():
    assert REFERENCE.read_text() == reference_markdown(), (
        "docs/configuration.md is stale: run `python -m mimo config --reference > docs/configuration.md`")


def _leaf_keys(node, prefix: str = "") -> set[str]:
    """Every field of the config tree that is not a table of its own, by its dotted name (an independent walk)."""
    out = set()
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        out |= _leaf_keys(value, key) if dataclasses.is_dataclass(value) else {key}
    return out


def test_every_key_has_a_one_line_doc_and_is_in_the_reference():
    keys = {k.key: k for k in config_keys()}
    assert {k for k in keys if "<name>" not in k} == _leaf_keys(Config())
    assert "model.modalities.<name>.vit.patch" in keys and "parallel.modules.<name>.tp" in keys
    for key, k in keys.items():
        assert k.doc and "\n" not in k.doc and k.doc.endswith((".", ")")), key
        assert f"| `{key.rsplit('.', 1)[-1]}` |" in reference_markdown()


def test_a_key_is_explained_with_its_type_default_and_values():
    assert explain("perf.attention_backend").splitlines() == [
        'perf.attention_backend  (str, default "default")',
        "  The only scaled-dot-product-attention backend allowed on CUDA (default: PyTorch picks).",
        '  allowed: "default", "cudnn", "flash", "efficient", "math"']
    assert explain("model.modalities.images.vit.patch").startswith("model.modalities.images.vit.patch  (int, "
                                                                   "default 8)")
    with pytest.raises(ConfigError, match="train.keep_checkpoints moved to checkpoint.keep"):
        explain("train.keep_checkpoints")
    with pytest.raises(ConfigError, match="'perf.compil' is no config key; did you mean perf.compile"):
        explain("perf.compil")


def test_mimo_config_prints_a_key():
    out = subprocess.run([sys.executable, "-m", "mimo", "config", "checkpoint.keep"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=True).stdout
    assert out == "checkpoint.keep  (int, default 2)\n  The newest checkpoints kept.\n"
