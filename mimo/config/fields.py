"""`doc`: a config field with its one-line documentation, the one place a key's meaning is written.

Every field of every config section is declared `name: type = doc(default, "What it does.")`; the reference
(mimo.config.reference: docs/configuration.md, `mimo config KEY`) reads the text from the field's metadata.
"""

from __future__ import annotations

import copy
from dataclasses import field
from typing import Any

DOC = "doc"
"""The key of a field's metadata that holds its one-line documentation."""


def doc(default: Any, text: str) -> Any:
    """A dataclass field defaulting to `default` (a list or dict is copied for each instance) documented by
    `text`."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={DOC: text})
    return field(default=default, metadata={DOC: text})
