"""The README's Python API blocks run as written (in a scratch folder that sees the repository's configs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.cli_curve import ROOT


def _api_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_python_api_blocks_run(tmp_path, monkeypatch, capsys):
    blocks = _api_blocks()
    assert len(blocks) == 2
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    model_scope: dict = {}
    exec(compile(blocks[0], "README: model", "exec"), model_scope)
    out, model = model_scope["out"], model_scope["model"]
    assert int(out.num_tokens) == 2 * 7 and bool(out.loss_sum.isfinite())
    assert all(p.grad is not None for p in model.modality_submodules["images"].parameters())
    exec(compile(blocks[1], "README: trainer", "exec"), {})
    summary = json.loads(Path("runs/demo_vlm/summary.json").read_text())
    assert summary["steps"] == 20 and str(summary["final_loss"]) in capsys.readouterr().out
