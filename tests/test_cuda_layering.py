"""The layering the CUDA split keeps: hawk_fx (kernels, and their CUDA runtime) never imports
eagle_fx (graphs); the CUDA backend's modules do one job each; the fake CUDA stack is a testing
module that the package proper loads only when the 'fake-cuda' backend is asked for."""
import ast
import os
import pathlib
import subprocess
import sys


import hawk_fx

ROOT = pathlib.Path(hawk_fx.__file__).resolve().parent.parent


def _imports(path: pathlib.Path):
    """(line, absolute module name) of every import statement in `path`, at any depth (lazy
    imports included), relative imports resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            yield node.lineno, ".".join(base + ([node.module] if node.module else []))


def test_no_hawk_fx_source_imports_eagle_fx():
    found = [f"{p.relative_to(ROOT)}:{line} imports {name}"
             for p in sorted((ROOT / "hawk_fx").rglob("*.py"))
             for line, name in _imports(p) if name.split(".")[0] == "eagle_fx"]
    assert not found, found


def test_importing_every_hawk_fx_module_loads_no_eagle_fx_module():
    code = ("import importlib, pkgutil, sys, hawk_fx\n"
            "for m in pkgutil.walk_packages(hawk_fx.__path__, 'hawk_fx.'):\n"
            "    importlib.import_module(m.name)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'eagle_fx')\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


DBL = """
import sys
import numpy as np
import hawk_fx as hawk
from hawk_fx import Scalar

@hawk.kernel
def dbl(x: Scalar) -> Scalar:
    return 2.0 * x
"""


def _run(tmp_path, code):
    """Run `code` (after DBL) as a script in a fresh interpreter."""
    script = tmp_path / "script.py"
    script.write_text(DBL + code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(script)], check=True, cwd=tmp_path, env=env)


def test_a_kernel_on_a_device_array_runs_through_hawk_alone(tmp_path):
    """A kernel called on a CuPy-like array reaches hawk_fx.cuda_runtime (and its refusal: CuPy is
    hidden) without loading eagle_fx."""
    _run(tmp_path, """
class Dev:
    __module__ = "cupy"
    shape, dtype = (4,), np.dtype(np.float64)
    __cuda_array_interface__ = {}

sys.modules["cupy"] = None                    # no CuPy, whatever is installed
try:
    dbl(Dev())
except RuntimeError as exc:
    assert type(exc).__module__ == "hawk_fx.cuda_runtime", type(exc)
    assert "argument 'x' is a cupy.Dev" in str(exc), exc
else:
    raise AssertionError("no refusal")
bad = sorted(m for m in sys.modules if m.split(".")[0] == "eagle_fx")
assert not bad, bad
""")


def test_the_package_proper_loads_no_testing_module_to_build_and_run(tmp_path):
    _run(tmp_path, """
import eagle_fx as eagle
import eagle_fx.backends.cuda

@eagle.Graph.builder
def twice(x):
    g = eagle.Graph()
    g.result = dbl(dbl(x))
    return g

assert np.array_equal(twice(np.arange(3.0))(), [0.0, 4.0, 8.0])
bad = sorted(m for m in sys.modules if m.startswith("eagle_fx.testing"))
assert not bad, bad
""")


def test_the_package_proper_names_the_fake_only_to_offer_the_fake_cuda_backend():
    """eagle_fx.testing is imported by select.py when `backend="fake-cuda"` is asked for, by nothing
    else of the package (lazily: the import above checks nothing loads it to build and run)."""
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "eagle_fx").rglob("*.py"))
             if "testing" not in p.relative_to(ROOT).parts
             for line, name in _imports(p) if name.startswith("eagle_fx.testing")]
    assert [f.split(":")[0] for f in found] == ["eagle_fx/backends/select.py"], found


def test_only_the_cuda_modules_import_the_gpu_packages():
    """cupy and cuda.core are named by the runtimes (hawk_fx.cuda_runtime, backends/cuda_graph.py)
    and NVRTC by the emitter; the lowering speaks the builder protocol only."""
    allowed = {"hawk_fx/cuda_runtime.py", "hawk_fx/emit/cuda.py", "eagle_fx/backends/cuda_graph.py"}
    found = [f"{p.relative_to(ROOT)}:{line} imports {name}"
             for pkg in ("hawk_fx", "eagle_fx") for p in sorted((ROOT / pkg).rglob("*.py"))
             if str(p.relative_to(ROOT)) not in allowed and "testing" not in p.parts
             for line, name in _imports(p) if name.split(".")[0] in ("cupy", "cuda")]
    assert not found, found


def test_the_backend_module_gathers_the_parts():
    from eagle_fx.backends import cuda, cuda_graph, cuda_lower
    from hawk_fx import cuda_runtime
    assert cuda.lower is cuda_lower.lower and cuda.CudaExecutable is cuda_graph.CudaExecutable
    assert cuda.call_kernel is cuda_runtime.call_kernel and cuda.require_gpu is cuda_runtime.require_gpu
    assert issubclass(cuda.CoreRuntime, cuda_runtime.KernelRuntime)
    assert cuda.CoreRuntime._instances is not cuda_runtime.KernelRuntime._instances     # one runtime of each kind
