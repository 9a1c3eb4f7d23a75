"""The ```python blocks of docs/sharp-bits.md run, in order, as one script (their asserts hold), and
the Program the "NumPy inside builders" section prints is the one shown below it."""
from __future__ import annotations

import contextlib
import io
import pathlib
import re
import runpy

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "sharp-bits.md"


def test_the_sharp_bits_examples_run_and_print_what_the_page_shows(tmp_path):
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    script = tmp_path / "sharp_bits.py"
    script.write_text("import numpy as np\nimport eagle_fx as eagle\nimport hawk_fx as hawk\n"
                      "from hawk_fx import Scalar\n" + "\n".join(blocks))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    section = text[text.index("## NumPy inside builders"):]
    shown = re.search(r"```\n(\{ lambda.*?)```", section, re.S).group(1)
    assert shown.strip() in out.getvalue()
