"""The transformations lessons run as written: notebooks/transforms.ipynb executes without a cell
error and prints what NumPy computes here, and the ```python blocks of docs/transforms.md run as
one script (written to a file, since kernels need readable source)."""
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --- NumPy references, computed here (not read from the notebook) ------------------------------

def numpy_loss(x, flag, n):
    if flag:
        x = np.sin(x) * x
    for _ in range(n):
        x = 1.1 * x + 0.1 * np.tanh(x)
    return np.sum(x * x)


def fd_grad(x, flag, n, eps=1e-6):
    return np.array([(numpy_loss(x + e, flag, n) - numpy_loss(x - e, flag, n)) / (2 * eps)
                     for e in np.eye(x.size) * eps])


def numpy_capped(x, lim, cap=50):
    flag = True
    for _ in range(cap):
        if not flag:
            break
        x = 2.0 * x
        flag = np.any(x < lim)
    return x


def numpy_branchy(x, c, sel):
    x = 2.0 * x if c else x + 1.0
    return 2.0 * x if sel == 0 else x + 1.0


# --- reading the notebook's printed values -----------------------------------------------------

def stdout_of(nb):
    text = ""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                text += out["text"]
    return text


def printed(text, label):
    """The NumPy array printed after `label =`: from the first '[' to its matching ']'."""
    start = text.index(label + " =") + len(label) + 2
    start = text.index("[", start)
    depth = 0
    for k in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[k], 0)
        if depth == 0:
            break
    body = text[start:k + 1]
    rows = body.count("[") - 1 if body.startswith("[[") else 0          # 1-D or 2-D, as printed here
    flat = np.array(body.replace("[", " ").replace("]", " ").split(), dtype=float)
    return flat.reshape(rows, -1) if rows else flat


@pytest.fixture(scope="module")
def notebook_output():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "notebooks" / "transforms.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()                        # raises CellExecutionError on any cell error
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out.get("evalue")
    return stdout_of(nb)


def test_notebook_prints_programs(notebook_output):
    text = notebook_output
    assert text.count("{ lambda") >= 7
    assert "while[cap=50 inplace=((1, 1),)]" in text                      # the unbatched capped loop
    assert "cond[masked=True]" in text and "switch[cases=(0,) masked=True]" in text
    assert "# l, branch 1:0" in text                                     # a fork's branch comment
    assert "f64[3,4]" in text and "u32[3,1]" in text                     # batched planes and cells
    assert "[('while', True)]" in text and "[('cond', False), ('switch', False)]" in text
    assert "same as a Python loop over instances: True" in text
    assert text.count("Error:") >= 9                                     # the refusals, each printed


def test_notebook_vmap_values(notebook_output):
    text = notebook_output
    xs = np.arange(12.0).reshape(3, 4)
    a = np.array([1.0, 10.0, 100.0])
    np.testing.assert_allclose(printed(text, "scaled"), a[:, None] * xs)
    np.testing.assert_allclose(printed(text, "ys"), (2 * xs + 1) + 4 * xs)
    cs, sels = [1, 0, 1], [0, 0, 7]
    np.testing.assert_allclose(printed(text, "masked"),
                               np.stack([numpy_branchy(xs[b], cs[b], sels[b]) for b in range(3)]))
    lims = [10.0, 100.0, 1000.0]
    np.testing.assert_allclose(printed(text, "capped"),
                               np.stack([numpy_capped(xs[b] + 1.0, lims[b]) for b in range(3)]))
    np.testing.assert_array_equal(printed(text, "flags"), [0, 0, 0])
    np.testing.assert_allclose(printed(text, "counted"), np.ones((3, 2)) * np.array([[1.0], [2.0], [8.0]]))


def test_notebook_derivative_values(notebook_output):
    text = notebook_output
    x5 = np.linspace(-1.0, 1.2, 5)
    t = np.cos(np.arange(5.0))
    np.testing.assert_allclose(printed(text, "loss"), [numpy_loss(x5, 1, 3)], rtol=1e-7)
    g = fd_grad(x5, 1, 3)
    np.testing.assert_allclose(printed(text, "reverse"), g, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(printed(text, "forward"), [g @ t], rtol=1e-6)
    np.testing.assert_allclose(printed(text, "jvp"), [g @ t], rtol=1e-6)
    np.testing.assert_allclose(printed(text, "grad"), fd_grad(x5, 0, 2), rtol=1e-6, atol=1e-7)
    xb = np.random.default_rng(1).normal(size=(4, 5))
    np.testing.assert_allclose(printed(text, "per-instance grads"),
                               np.stack([fd_grad(xb[b], 1, 3) for b in range(4)]), rtol=1e-6, atol=1e-7)


def test_docs_code_blocks_run(tmp_path):
    src = (ROOT / "docs" / "transforms.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", src, re.S)
    assert len(blocks) >= 10
    script = tmp_path / "transforms_page.py"
    script.write_text("\n".join(blocks))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cond[masked=True]" in run.stdout and "while[cap=50" in run.stdout
    assert "not refused" not in run.stdout
