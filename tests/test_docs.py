"""The documentation site: it builds strictly, its reference names every public name, its code
runs, and the pages that show the tour or a printed Program say what the code does today."""

import inspect
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import eagle_fx
import eagle_fx.diff
import hawk_fx
import hawk_fx.math

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def public_names():
    """Every public name of both packages, as the reference's anchors spell them."""
    names = [f"eagle_fx.{n}" for n in eagle_fx.__all__]
    names += [f"eagle_fx.diff.{n}" for n in ("Record", "reverse", "forward")]
    names += [f"hawk_fx.{n}" for n in hawk_fx.__all__]
    names += [f"hawk_fx.math.{n}" for n in hawk_fx.math.__all__]
    return names


def _obj(dotted):
    mod, _, name = dotted.rpartition(".")
    return getattr(sys.modules[mod], name)


@pytest.mark.parametrize("dotted", public_names())
def test_every_public_name_has_a_docstring(dotted):
    doc = inspect.getdoc(_obj(dotted))
    assert doc and doc.strip(), f"{dotted} has no docstring"


def python_blocks(page):
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


@pytest.mark.parametrize("page", ["index.md", "getting-started.md", "kernels.md", "graphs.md", "sharp-bits.md",
                                  "backends.md", "jax-backend.md"])
def test_the_code_on_a_page_runs(page, tmp_path):
    # one script per page, in order (later blocks use earlier ones); a file, since kernels need source
    script = tmp_path / (page.replace("-", "_").replace(".md", "") + "_page.py")
    script.write_text("\n".join(python_blocks(page)))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]


def test_getting_started_prints_what_it_says():
    src = "\n".join(python_blocks("getting-started.md"))
    assert "assert np.allclose(dx, 2 * 128.0**2 * x)" in src      # the gradient is checked by hand
    assert "assert np.allclose(y, 2.0 * np.arange(4.0) + 1.0)" in src


def test_the_graphs_page_follows_the_tour_sections():
    run = subprocess.run([sys.executable, "-m", "eagle_fx"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    tour = [line[3:] for line in run.stdout.splitlines() if line.startswith("## ") and line[3].isdigit()]
    page = [m.group(2) for m in re.finditer(r"^(##|###) (\d.*)$", (DOCS / "graphs.md").read_text(), re.M)]
    assert page == tour


def test_the_printed_programs_on_under_the_hood_are_current():
    import numpy as np
    import hawk_fx as hawk
    from hawk_fx import Mutable, Param, Scalar, UInt32
    from hawk_fx import math as hm

    @hawk.kernel
    def dbl(x: Scalar) -> Scalar:
        return 2.0 * x

    @hawk.kernel
    def below(s: Scalar, lim: Param, flag: Mutable[UInt32]):
        flag = hm.uint32(hawk.sum(s < lim))

    @hawk.kernel
    def sumsq(x: Scalar) -> Scalar:
        return hawk.sum(x * x)

    @eagle_fx.Graph.builder
    def loss(x, flag):
        g = eagle_fx.Graph()
        for _ in range(50):
            if not flag: break
            x = dbl(x)
            below(x, 100.0, flag)
        g.result = sumsq(x)
        return g

    x, on = np.ones(4), np.array([1], dtype=np.uint32)
    shown = [b for b in re.findall(r"```text\n(.*?)```", (DOCS / "under-the-hood.md").read_text(), re.S)
             if b.startswith("{ lambda")]
    assert shown[0].strip() == str(eagle_fx.make_program(loss)(x, on)).strip()
    assert shown[1].strip() == str(eagle_fx.make_program(eagle_fx.grad(loss))(x, on)).strip()


def test_the_site_builds_strictly_and_its_reference_names_everything(tmp_path):
    if shutil.which("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs extra)")
    site = tmp_path / "site"
    run = subprocess.run(["mkdocs", "build", "--strict", "-q", "-d", str(site)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    html = (site / "api" / "eagle_fx" / "index.html").read_text() + (site / "api" / "hawk_fx" / "index.html").read_text()
    anchors = set(re.findall(r'id="([\w.]+)"', html))
    # a function that shares its name with its module (the decorator hawk_fx.kernel, in hawk_fx/kernel.py)
    # is documented from that module: its anchor is hawk_fx.kernel.kernel
    missing = [n for n in public_names() if n not in anchors and f"{n}.{n.rpartition('.')[2]}" not in anchors]
    assert not missing, f"not in the API reference: {missing}"
    kernels = (site / "kernels" / "index.html").read_text()
    table = set(re.findall(r"<td><code>(\w+)</code></td>", kernels))
    assert set(hawk_fx.math.__all__) <= table, set(hawk_fx.math.__all__) - table
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert (site / "notebooks" / nb.stem / "index.html").exists(), nb.name
