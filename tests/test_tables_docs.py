"""docs/tables.md: its code runs, prints what it says, and its spline fit is checked against
oracles that share no code with it: the least-squares solution of the B-spline basis (NumPy) and
jax.value_and_grad of the same model written with jnp.take."""
from __future__ import annotations

import contextlib
import io
import pathlib
import re
import runpy

import numpy as np
import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "tables.md"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    script = tmp_path_factory.mktemp("tables_page") / "tables_page.py"
    script.write_text("\n".join(re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns = runpy.run_path(str(script))          # a file: kernels need their source
    return ns, out.getvalue()


def test_the_lookup_prints_what_the_page_says(page):
    ns, printed = page
    lines = printed.splitlines()
    for got, want in zip(lines[:4], ["[ 0. 40.  0. 40. 40. 40.]", "[nan 40.  0. 40. nan nan]",
                                     "[ 0.  0.  0. 40. 40. 40.]", "[30. 40.  0. 40.  0. 40.]"]):
        assert got.strip() == want


def test_the_histogram_and_segment_sums(page):
    ns, _ = page
    x = np.random.default_rng(0).normal(size=10_000)        # the page's sample, drawn again
    np.testing.assert_array_equal(ns["h"][:, 0], np.histogram(x, bins=8, range=(-4, 4))[0])
    xs = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(ns["s"][:, :, 0], np.stack([xs.sum(1), (xs ** 2).sum(1), [4, 4, 4]], 1))


def _basis(x, k_coeffs):
    k = np.floor(x).astype(int)
    u = x - k
    B = np.zeros((x.size, k_coeffs))
    for m, b in enumerate([(1 - u) ** 3 / 6, (3 * u ** 3 - 6 * u ** 2 + 4) / 6,
                           (-3 * u ** 3 + 3 * u ** 2 + 3 * u + 1) / 6, u ** 3 / 6]):
        B[np.arange(x.size), k + m] = b
    return B


def test_the_spline_fit_reaches_the_least_squares_loss_and_its_gradient_is_jaxs(page):
    ns, _ = page
    x, y, c = ns["x"], ns["y"], ns["c"]
    B = _basis(x, c.shape[0])
    best = np.linalg.lstsq(B, y, rcond=None)[0]
    best_loss = np.mean((B @ best - y) ** 2)
    assert best_loss <= float(ns["loss"][0]) < best_loss * 1.01
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy

    def loss(c):
        k = jnp.floor(x).astype(jnp.int32)
        u = x - jnp.floor(x)
        w = [(1 - u) ** 3 / 6, (3 * u ** 3 - 6 * u ** 2 + 4) / 6, (-3 * u ** 3 + 3 * u ** 2 + 3 * u + 1) / 6, u ** 3 / 6]
        f = sum(wm * jnp.take(c[:, 0], k + m) for m, wm in enumerate(w))
        return jnp.mean((f - y) ** 2)

    got_loss, got_grad = ns["step"](c, x, y)
    want_loss, want_grad = jax.value_and_grad(loss)(jnp.asarray(c))
    np.testing.assert_allclose(got_loss[0], float(want_loss), rtol=1e-12)
    np.testing.assert_allclose(got_grad, np.asarray(want_grad), rtol=1e-9, atol=1e-14)
