"""`mimo --help` answers before torch is imported: the CLI parses first, the rooms load when a command runs."""

from __future__ import annotations

import subprocess
import sys

import mimo


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def test_importing_the_cli_and_printing_help_loads_no_torch():
    code = ("import sys, contextlib, io\nimport mimo.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()) as buf, contextlib.suppress(SystemExit):\n"
            "    mimo.cli.main(['--help'])\n"
            "print('torch' in sys.modules, 'usage: mimo' in buf.getvalue())")
    assert run_python(code) == "False True"


def test_the_public_api_loads_on_first_use():
    from mimo.config.load import load_config
    from mimo.config.schema import Config
    from mimo.hf.build import build_model
    from mimo.models.multimodal import MimoModel, ModalitySubmodules

    assert (mimo.Config, mimo.load_config, mimo.build_model) == (Config, load_config, build_model)
    assert (mimo.MimoModel, mimo.ModalitySubmodules) == (MimoModel, ModalitySubmodules)
    assert set(mimo.__all__) <= set(dir(mimo))
    try:
        mimo.not_a_name  # noqa: B018
    except AttributeError as e:
        assert "not_a_name" in str(e)
    else:
        raise AssertionError("mimo.not_a_name resolved")
