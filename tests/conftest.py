"""Shared helpers for the hawk_fx tests: seeded data, and checks for refused calls."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import types

import numpy as np
import pytest
from hypothesis import settings

# Property tests run a fixed set of examples by default, so a run is reproducible (CI included);
# HYPOTHESIS_PROFILE=explore draws new examples on every run, to look for new failures.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def _nvrtc_required() -> bool:
    # the extras' run of .ci/run installs the nvrtc extra and sets EAGLE_FX_REQUIRE_NVRTC=1: there
    # NVRTC must be usable; the README's plain `.[test]` install skips these tests
    return os.environ.get("EAGLE_FX_REQUIRE_NVRTC") == "1" and sys.platform in ("linux", "win32")


def pytest_collection_modifyitems(config, items):
    """Mark the tests that compile CUDA sources, so the extras' run can select them (-m nvrtc)."""
    for item in items:
        if "nvrtc" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.nvrtc)


def stand_in_module(monkeypatch, name: str, module):
    """Put `module` (or None: "not installed") in sys.modules as the dotted `name`, with empty
    stand-ins for parent packages that are not installed: the `cuda` namespace comes only with the
    nvrtc extra, and `import cuda.core` needs it."""
    parts = name.split(".")
    for k in range(1, len(parts)):
        parent = ".".join(parts[:k])
        try:
            importlib.import_module(parent)
        except ImportError:
            monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture(scope="session")
def nvrtc():
    """NVRTC's version, for the tests that compile CUDA sources (no GPU needed); they skip without
    NVRTC, except under CI, where it must load."""
    from hawk_fx.emit import cuda
    if not _nvrtc_required():
        pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC's Python bindings are not installed")
    try:
        return cuda.nvrtc_version()
    except (ImportError, RuntimeError, OSError) as exc:   # no bindings, or no libnvrtc for them
        if _nvrtc_required():
            pytest.fail(f"NVRTC is not usable under CI ({exc!r}); the 'nvrtc' extra should install it")
        pytest.skip(f"NVRTC cannot be loaded: {exc}")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def line_of(fn, fragment: str) -> int:
    """The file line number of the first line of `fn`'s source that contains `fragment`."""
    fn = getattr(fn, "__wrapped__", fn)
    lines, first = inspect.getsourcelines(fn)
    for k, text in enumerate(lines):
        if fragment in text:
            return first + k
    raise AssertionError(f"{fragment!r} is not in the source of {fn.__name__}")


def refused(exc_type, call, *fragments, untouched=()):
    """Assert `call()` raises exc_type with every fragment in its message, and leaves each array
    in `untouched` (the caller's Mutable planes) exactly as it was. Returns the message."""
    before = [a.copy() for a in untouched]
    with pytest.raises(exc_type) as info:
        call()
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in message: {msg}"
    for a, b in zip(untouched, before):
        np.testing.assert_array_equal(a, b)
    return msg


def file_and_line(fn, fragment: str) -> tuple[str, str]:
    """The two fragments a trace error shows for a user line: the file name and `line N`."""
    return os.path.basename(inspect.getsourcefile(getattr(fn, "__wrapped__", fn))), f"line {line_of(fn, fragment)}"


def _on_backend(request):
    from eagle_fx.backends.select import use_backend
    if request.param == "jax":
        if request.node.get_closest_marker("numpy_only"):
            pytest.skip("about the NumPy backend's own mechanics")
        jax = pytest.importorskip("jax")
        jax.config.update("jax_enable_x64", True)
    with use_backend(request.param):
        yield request.param


@pytest.fixture(params=["numpy", "jax"])
def backend(request):
    """Run the test on each final interpreter that evaluates on this machine: graphs built inside
    run on the NumPy backend, then on the jax backend (one XLA executable per graph). A test about
    one backend's own mechanics is marked `numpy_only`."""
    yield from _on_backend(request)


@pytest.fixture(params=["numpy", pytest.param("jax", marks=pytest.mark.slow)])
def backend_heavy(request):
    """`backend` for modules that build many graphs: their jax run (a compile per graph) is slow."""
    yield from _on_backend(request)
