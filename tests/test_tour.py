"""The builder tour, as the script `python -m eagle_fx` runs and as notebooks/tour.ipynb, against
the tour's expected output (refusal messages compare by exception type, as check_tour does).

The expected output marks sections with '## ' lines; the script prints numbered headings with their
prose instead, so both sides compare without headings, prose and blank lines."""
import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXPECTED = (ROOT / "tests" / "data" / "tour.expected").read_text().splitlines()
REFUSAL = re.compile(r"^  (\w+(?:Error|Exception|Warning)): (.+)$")


def _prose():
    """The prose under the tour's headings: the string arguments of its section(...) calls."""
    tree = ast.parse((ROOT / "eagle_fx" / "tour.py").read_text())
    return [" ".join(ast.literal_eval(a) for a in node.args[1:]) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "section"]


PROSE = _prose()


def normalise(lines):
    out = []
    for line in lines:
        if line.startswith("## ") or not line.strip() or any(line in p for p in PROSE):
            continue                             # headings, blank lines and the prose wrapped under headings
        m = REFUSAL.match(line)
        out.append(f"  {m.group(1)}: <message>" if m and m.group(2).strip() else line)
    return out


def headings(lines):
    return [line[3:] for line in lines if line.startswith("## ")]


def test_python_m_eagle_fx_prints_the_tour():
    run = subprocess.run([sys.executable, "-m", "eagle_fx"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr == ""                     # the uncapped-loop warning is shown once, in the tour's output
    assert normalise(run.stdout.splitlines()) == normalise(EXPECTED)
    assert sum(line.startswith("uncapped device loop at") for line in run.stdout.splitlines()) == 1
    numbered = headings(run.stdout.splitlines())[1:]
    assert [h.split(" ")[0].rstrip(".") for h in numbered] == [
        "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "10.1", "10.2", "10.3", "10.4", "10.5", "10.6", "11"]
    prose = [line for line in run.stdout.splitlines() if line.strip() and any(line in p for p in PROSE)]
    assert " ".join(prose) == " ".join(p for p in PROSE if p)   # the prose in full, wrapped between words
    assert all(len(line) <= 100 for line in prose)


def test_the_notebook_shows_the_same_sections():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "notebooks" / "tour.ipynb", as_version=4)
    titles = [c.source.splitlines()[0].lstrip("# ") for c in nb.cells if c.cell_type == "markdown"]
    run = subprocess.run([sys.executable, "-m", "eagle_fx"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert titles == headings(run.stdout.splitlines())


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
from eagle_fx.backends.select import use_backend
with use_backend("jax"):       # every graph of the tour on the jax backend (record=True ones stay on NumPy)
    runpy.run_module("eagle_fx.tour", run_name="__main__")
"""


def test_the_tour_on_the_jax_backend():
    pytest.importorskip("jax")
    run = subprocess.run([sys.executable, "-c", TOUR_ON_JAX], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert normalise(run.stdout.splitlines()) == normalise(EXPECTED)


def _functions(path, rename=None):
    """name -> the AST of each top-level function in path, the first definition of a name first; rename
    maps the names a test module gives the tour's section-10 builders back to the tour's."""
    rename = rename or {}
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and n.id in rename:
                    n.id = rename[n.id]
            node.name = rename.get(node.name, node.name)
            out.setdefault(node.name, []).append(ast.dump(node))
    return out


def test_the_tests_run_the_tours_builders():
    """The tests import the tour's kernels and builders from tests/tour_kernels.py and tour_builders.py
    (the tour prints as it runs, so it cannot be imported): they must stay the tour's, as written."""
    tour = _functions(ROOT / "eagle_fx" / "tour.py")
    kernels = _functions(ROOT / "tests" / "tour_kernels.py")
    for name in ("inc", "dbl", "add", "square", "affine", "below", "over", "accumulate"):
        assert kernels[name][0] == tour[name][0], f"tests/tour_kernels.py: {name} is not the tour's"
    builders = _functions(ROOT / "tests" / "tour_builders.py", {"twice2": "twice", "accumulate3": "accumulate"})
    for name, codes in builders.items():
        assert all(code in tour[name] for code in codes), f"tests/tour_builders.py: {name} is not the tour's"
