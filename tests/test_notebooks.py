"""The notebooks: stored with their outputs, and re-executed here (each well under a minute).

The tour and transforms notebooks are executed by their own tests (test_tour.py,
test_transforms_notebook.py), which also check what they print; this file executes the others.
Each notebook checks its own numbers against an independent reference (NumPy, finite differences,
the implicit-function theorem, JAX) with asserts, so a wrong number fails its cell. The re-run's
printed text must equal the stored one with its numbers masked (iteration counts and last digits
may differ between library versions), except cells that time things.
"""
import pathlib
import re
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
EXECUTED_HERE = {"optimisation.ipynb": ("scipy", "matplotlib", "jax"), "research.ipynb": ("jax",),
                 "under-the-hood.ipynb": ()}

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

nbformat = pytest.importorskip("nbformat")


def stdout_by_cell(nb):
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "median_time(" in cell.source:
            continue
        text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == "stdout")
        out.append(NUMBER.sub("#", text))
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_with_outputs(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), f"{name} is stored unexecuted"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{name}: run top to bottom"
    for c in code:
        for o in c.outputs:
            assert o.output_type != "error", f"{name}: a stored error: {o.get('evalue')}"
            assert o.get("name") != "stderr", f"{name}: stderr output stored: {o.get('text', '')[:200]}"


@pytest.mark.parametrize("name", sorted(EXECUTED_HERE))
def test_executes_and_prints_what_is_stored(name):
    nbclient = pytest.importorskip("nbclient")
    for module in EXECUTED_HERE[name]:
        pytest.importorskip(module)
    stored = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    assert time.perf_counter() - start < 120
    assert stdout_by_cell(nb) == stdout_by_cell(stored)


def test_the_site_lists_every_notebook():
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in NOTEBOOKS:
        assert f"notebooks/{name}" in nav, f"{name} is not in mkdocs.yml's nav"
