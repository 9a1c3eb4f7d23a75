"""The transformations lessons run as written: notebooks/transforms.ipynb executes without a cell
error and prints what NumPy computes here, and the ```python blocks of docs/transforms.md run as
one script (written to a file, since kernels need readable source).

Every reference value is computed in this file with NumPy: the forward computations, their
gradients by the chain rule written out by hand, and second derivatives by central differences
of those gradients. None is read from the library."""
import ast
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


def numpy_grad(x, flag, n):
    """d numpy_loss / dx by the chain rule: every step is elementwise, so the gradient is too."""
    d = np.ones_like(x)
    if flag:
        d = np.sin(x) + x * np.cos(x)
        x = np.sin(x) * x
    for _ in range(n):
        d = d * (1.1 + 0.1 * (1.0 - np.tanh(x) ** 2))
        x = 1.1 * x + 0.1 * np.tanh(x)
    return 2.0 * x * d


def fd_along(grad, x, v, h=1e-5):
    """The derivative of `grad` at x along v: a Hessian-vector product when grad is a gradient."""
    return (grad(x + h * v) - grad(x - h * v)) / (2 * h)


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


def numpy_grown_grad(x, lim, cap=50):
    """Gradient of sum(x_K^2), x_{k+1} = 2 x_k + 0.1 tanh(x_k), stopping once no sample is below lim."""
    d = np.ones_like(x)
    for _ in range(cap):
        d = d * (2.0 + 0.1 * (1.0 - np.tanh(x) ** 2))
        x = 2.0 * x + 0.1 * np.tanh(x)
        if not np.any(x < lim):
            break
    return 2.0 * x * d


def numpy_cwob_jacobian(x):
    """y = sin(c) c with c = x - mean(x): J = diag(sin c + c cos c) (I - 1/n)."""
    c = x - x.mean()
    return np.diag(np.sin(c) + c * np.cos(c)) @ (np.eye(x.size) - 1.0 / x.size)


X5 = np.linspace(-1.0, 1.2, 5)
T5 = np.cos(np.arange(5.0))
XB = np.random.default_rng(1).normal(size=(4, 5))
TS = np.random.default_rng(2).normal(size=(4, 5))


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
    """The NumPy array printed on a line starting `label = `, with its printed shape."""
    m = re.search(rf"(?m)^{re.escape(label)} = ", text)
    assert m, f"nothing printed as {label!r}"
    start = text.index("[", m.end())
    depth = 0
    for k in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[k], 0)
        if depth == 0:
            break
    body = text[start:k + 1]
    body = re.sub(r"(?<=[0-9.\]])\s+(?=[-0-9.\[])", ",", body.strip())    # '[ 1.  2.]' -> '[ 1.,2.]'
    return np.array(ast.literal_eval(body), dtype=float)


def close(got, want, rtol=1e-7, atol=1e-7):
    want = np.asarray(want, dtype=float)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


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
    assert text.count("{ lambda") >= 14
    assert "while[cap=50 inplace=((1, 1),)]" in text                      # the unbatched capped loop
    assert "while[cap=50 masked=True" in text                             # the batched one
    assert "cond[masked=True]" in text and "switch[cases=(0,) masked=True]" in text
    assert "# l, branch 1:0" in text                                     # a fork's branch comment
    assert "f64[3,4]" in text and "u32[3,1]" in text                     # batched planes and cells
    assert "[('while', True)]" in text and "[('cond', False), ('switch', False)]" in text
    assert "same as a Python loop over instances: True" in text


def test_notebook_prints_derivative_programs(notebook_output):
    text = notebook_output
    for s in ("call[kernel=jvp(wobble)]", "call[kernel=jvp(grow)]", "call[kernel=jvp(total)]",
              "call[kernel=vjp(grow)]", "call[kernel=vjp(total)]", "call[kernel=vjp(vjp(wobble))]",
              "stack_push[cap=3]", "cell_inc", "cell_rev", "stack_read", "add_any"):
        assert s in text, s
    # grad(loss): the forward loop stacks 3 turns of a 5-sample plane; the backward loop reads them
    grad_prog = text[text.index("{ lambda a:u32[1] b:f64[5] c:u32[1] d:f64[1] ."):]
    grad_prog = grad_prog[:grad_prog.index("\n  in (")]
    assert grad_prog.count("while[counted=True]") == 2
    assert grad_prog.index("stack_push") < grad_prog.index("stack_read")
    assert grad_prog.count("= cond ") == 2                               # forward arm, then its vjp
    # vmap(grad) with per-instance flags and trip counts: both conds and both loops masked
    assert "[('cond', True), ('while', True), ('while', True), ('cond', True)]" in text
    assert "b:f64[6,4]" in text                                          # vmap(vmap): 2 * 3 instances
    assert "a:f64[4] b:f64[4,4]" in text                                 # jacobians: 4 basis vectors
    assert "(2, 3, 4)" in text and "jacobian shape = (1, 5)" in text


def test_notebook_checks_and_refusals(notebook_output):
    text = notebook_output
    assert text.count("matches finite differences: True") == 7
    assert "False" not in text.replace("masked=False", "").replace("('cond', False), ('switch', False)", "")
    assert text.count("Error:") >= 10                                    # the refusals, each printed
    assert "jacfwd(vmap(f, in_axes=1)) follows x itself, its axes moved back: True" in text
    for s in ("out_axes 1: results take the batch axis first",
              "host node", "a record=True graph cannot be transformed",
              "inside a transformed function", "grad needs one value"):
        assert s in text, s


def test_notebook_vmap_values(notebook_output):
    text = notebook_output
    xs = np.arange(12.0).reshape(3, 4)
    a = np.array([1.0, 10.0, 100.0])
    close(printed(text, "scaled"), a[:, None] * xs)
    close(printed(text, "ys"), (2 * xs + 1) + 4 * xs)
    cs, sels = [1, 0, 1], [0, 0, 7]
    close(printed(text, "masked"), np.stack([numpy_branchy(xs[b], cs[b], sels[b]) for b in range(3)]))
    lims = [10.0, 100.0, 1000.0]
    close(printed(text, "capped"), np.stack([numpy_capped(xs[b] + 1.0, lims[b]) for b in range(3)]))
    close(printed(text, "flags"), [0, 0, 0])
    close(printed(text, "counted"), np.ones((3, 2)) * np.array([[1.0], [2.0], [8.0]]))


def test_notebook_derivative_values(notebook_output):
    text = notebook_output
    g = numpy_grad(X5, 1, 3)
    close(printed(text, "loss"), [numpy_loss(X5, 1, 3)])
    close(printed(text, "jvp"), [g @ T5])
    close(printed(text, "vjp"), g)
    close(printed(text, "grad"), numpy_grad(X5, 0, 2))
    close(printed(text, "replay"), numpy_grad(X5 + 1.0, 0, 2))          # cells and x changed, replayed
    close(printed(text, "five turns"), numpy_grad(X5 + 1.0, 0, 5))      # more turns than at build
    close(printed(text, "reverse"), g)
    close(printed(text, "forward"), [g @ T5])
    close(printed(text, "capped loop grad"), numpy_grown_grad(np.linspace(0.1, 1.2, 5), 10.0))
    close(printed(text, "flag after grad"), [1])                         # derived graphs are functional
    xu = X5 + 2.0                                                        # dbl until no sample < 100
    k = next(k for k in range(64) if np.all(xu * 2.0**k >= 100.0))
    close(printed(text, "uncapped jvp"), [2.0 * np.sum(xu * 4.0**k)])
    close(printed(text, "uncapped grad"), 2.0 * xu * 4.0**k)


def test_notebook_composition_values(notebook_output):
    text = notebook_output
    close(printed(text, "per-instance grads"), np.stack([numpy_grad(XB[b], 1, 3) for b in range(4)]))
    flags, trips = [1, 0, 0, 1], [0, 3, 1, 2]
    close(printed(text, "own flags and trips"),
          np.stack([numpy_grad(XB[b], flags[b], trips[b]) for b in range(4)]))
    v = np.cos(np.arange(5.0) + 0.5)
    close(printed(text, "hvp"), fd_along(lambda x: numpy_grad(x, 1, 3), X5, v), rtol=1e-6)
    d2 = fd_along(lambda x: numpy_grad(x, 1, 1), np.array([0.3]), np.ones(1))
    close(printed(text, "second derivative"), d2, rtol=1e-6)
    xss = np.arange(24.0).reshape(2, 3, 4)
    close(printed(text, "nested"), (4.0 * xss).reshape(6, 4))
    xs = np.arange(12.0).reshape(3, 4)
    close(printed(text, "nested params"), (np.array([1.0, -2.0])[:, None, None] * xs).reshape(6, 4))
    close(printed(text, "batched losses"), [numpy_loss(XB[b], 1, 3) for b in range(4)])
    close(printed(text, "batched tangents"), [numpy_grad(XB[b], 1, 3) @ TS[b] for b in range(4)])
    J = numpy_cwob_jacobian(np.linspace(-1.0, 1.0, 4))
    assert not np.allclose(J, J.T)                                       # dense and not symmetric
    close(printed(text, "jacfwd"), J)
    close(printed(text, "jacrev"), J)


def test_docs_code_blocks_run(tmp_path):
    src = (ROOT / "docs" / "transforms.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", src, re.S)
    assert len(blocks) >= 20
    script = tmp_path / "transforms_page.py"
    script.write_text("\n".join(blocks))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cond[masked=True]" in run.stdout and "while[cap=50" in run.stdout
    for s in ("call[kernel=vjp(vjp(wobble))]", "stack_push[cap=3]", "cell_rev", "call[kernel=jvp(grow)]"):
        assert s in run.stdout, s
    assert "not refused" not in run.stdout
    # the page checks its own numbers against NumPy and finite differences (np.testing calls)
    assert sum(b.count("np.testing.assert_allclose") for b in blocks) >= 25
