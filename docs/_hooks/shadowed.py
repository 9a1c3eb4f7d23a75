"""MkDocs hook: `{{ shadowed_functions PACKAGE }}` in a page becomes one mkdocstrings directive per
public function of PACKAGE that shares its name with one of its modules (`hawk_fx.kernel`, the
decorator, lives in `hawk_fx/kernel.py`). The package directive documents such a name as the module,
which it leaves out, so these functions are documented from their modules, as `PACKAGE.name.name`."""
from __future__ import annotations

import importlib
import importlib.util
import pathlib
import re
import sys
import types

MARK = re.compile(r"\{\{ shadowed_functions ([\w.]+) \}\}")


def shadowed(package: str) -> list[str]:
    """The names in package.__all__ bound to a non-module that also name a submodule."""
    root = str(pathlib.Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    pkg = importlib.import_module(package)
    return [n for n in pkg.__all__ if not isinstance(getattr(pkg, n), types.ModuleType)
            and importlib.util.find_spec(f"{package}.{n}") is not None]


def _directives(match) -> str:
    package = match.group(1)
    return "\n\n".join(f'::: {package}.{n}.{n}\n    options:\n      heading: "{package}.{n}"'
                       for n in shadowed(package))


def on_page_markdown(markdown, page, config, files):
    return MARK.sub(_directives, markdown)
