"""The builder tour, as the script `python -m eagle_fx` runs and as notebooks/tour.ipynb, against
the tour's expected output (refusal messages compare by exception type, as check_tour does)."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXPECTED = (ROOT / "tests" / "data" / "tour.expected").read_text().splitlines()
REFUSAL = re.compile(r"^  (\w+(?:Error|Exception|Warning)): (.+)$")


def normalise(lines):
    out = []
    for line in lines:
        m = REFUSAL.match(line)
        out.append(f"  {m.group(1)}: <message>" if m and m.group(2).strip() else line)
    return out


def test_python_m_eagle_fx_prints_the_tour():
    run = subprocess.run([sys.executable, "-m", "eagle_fx"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert normalise(run.stdout.splitlines()) == normalise(EXPECTED)


def test_tour_notebook_executes_and_matches():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "notebooks" / "tour.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    text = ""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                text += out["text"]
    assert normalise(text.splitlines()) == normalise(EXPECTED)


TOUR_ON_JAX = """
import runpy
import jax
jax.config.update("jax_enable_x64", True)
from eagle_fx.backends.cuda import use_backend
with use_backend("jax"):       # every graph of the tour on the jax backend (record=True ones stay on NumPy)
    runpy.run_module("eagle_fx.tour", run_name="__main__")
"""


def test_the_tour_on_the_jax_backend():
    pytest.importorskip("jax")
    run = subprocess.run([sys.executable, "-c", TOUR_ON_JAX], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert normalise(run.stdout.splitlines()) == normalise(EXPECTED)
