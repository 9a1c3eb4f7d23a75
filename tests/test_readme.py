"""The README's examples run as written (extracted into a file, since kernels need readable source)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_examples_run(tmp_path):
    src = (ROOT / "README.md").read_text()
    code = "import numpy as np\n" + "\n".join(re.findall(r"```python\n(.*?)```", src, re.S))
    script = tmp_path / "readme_examples.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "[128. 128. 128. 128.]" in run.stdout      # the capped loop doubles 1 until it reaches 128
    assert "[65536.]" in run.stdout                   # the loss on jax.Arrays: 4 * 128 ** 2
