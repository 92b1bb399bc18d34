"""The Python examples of README.md and docs/ use only names `mimo` exports, and compile; the README's two
examples run as written (in a scratch folder that sees the repository's configs)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch.distributed as dist

import mimo
from tests.support.cli_curve import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def mimo_names_used(source: str) -> list[str]:
    """Every name a block takes from mimo, as `module.name` for `from mimo... import name`, `module` for
    `import mimo...`, and `mimo.attr` for attribute access on the package."""
    used = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mimo":
            used += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            used += [a.name for a in node.names if a.name.split(".")[0] == "mimo"]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mimo":
            used.append(f"mimo.{node.attr}")
    return used


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_examples_import_only_what_mimo_exports(page):
    for i, block in enumerate(python_blocks(page)):
        compile(block, f"{page.name} block {i}", "exec")
        for name in mimo_names_used(block):
            assert name.count(".") == 1 and name.split(".")[1] in mimo.__all__, (
                f"{page.name} block {i} uses {name}: examples may use only `from mimo import <name>` with a name "
                f"of mimo.__all__ ({', '.join(mimo.__all__)})")


def test_mimo_names_used_sees_every_way_of_reaching_mimo():
    source = "import mimo.train\nfrom mimo.train.trainer import Trainer\nfrom mimo import load_config\nmimo.Trainer"
    assert mimo_names_used(source) == ["mimo.train", "mimo.train.trainer.Trainer", "mimo.load_config",
                                       "mimo.Trainer"]


def test_every_public_name_resolves():
    assert all(getattr(mimo, name) is not None for name in mimo.__all__)
    with pytest.raises(AttributeError):
        mimo.leave_distributed  # noqa: B018


def test_the_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    train_block, hf_block = python_blocks(ROOT / "README.md")
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(train_block, "README: train", "exec"), scope)
    out, model = scope["out"], scope["model"]
    assert int(out.num_tokens) == 2 * 7 and bool(out.loss_sum.isfinite())
    assert all(p.grad is not None for p in model.modality_submodules["images"].parameters())
    summary = json.loads(Path("runs/demo_vlm/summary.json").read_text())
    assert summary["steps"] == 20 and str(summary["final_loss"]) in capsys.readouterr().out
    exec(compile(hf_block, "README: Hugging Face", "exec"), hf_scope := {})
    assert (Path("hf_demo_vlm") / "config.json").is_file()
    imported = hf_scope["model"]
    assert sorted(imported.modality_submodules) == ["images"] and not dist.is_initialized()


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", [*PAGES, ROOT / "BENCHMARKS.md"], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    for link in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name} links to {link}, which does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in heading_anchors(target), f"{page.name} links to {link}: no such heading"
