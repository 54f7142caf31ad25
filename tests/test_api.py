"""The public API: every name resolves, help(characterize) lists each with one line, and
the names a notebook reaches for agree with each other."""

from __future__ import annotations

import pydoc
import re

import characterize as chz
from characterize import _API
from tests.conftest import needs_tools


def test_every_public_name_resolves_and_help_lists_it_with_one_line():
    text = pydoc.render_doc(chz, renderer=pydoc.plaintext)
    for name in _API:
        assert getattr(chz, name) is not None, name
        assert re.search(rf"^\s+{re.escape(name)}\s+\S.*$", text, re.M), f"{name} is not listed in help(characterize)"
    assert chz.GPUS["a100-80gb"].arch == "sm_80" and chz.gpu_spec("h100-sxm").key == "h100-sxm"


@needs_tools
def test_predict_experiment_works_where_predict_does():
    exp = chz.load_experiment("quick")
    a = chz.predict(exp, ["sm_80"])
    b = chz.predict_experiment(exp, ["sm_80"])
    assert a.equals(b) and len(a) == len(exp.variants) * len(exp.datasets)
