"""MkDocs hook: `{{ hawk_math_table }}` in a page becomes the table of `hawk_fx.math`, generated from
the module itself (its `__all__`, signatures and docstrings), so the page cannot drift from the code.
`{{ hawk_math_table_anchored }}` is the same table with an anchor `hawk_fx.math.<name>` per row (the
API reference: the module makes most of its functions in a loop, which static analysis cannot read)."""
from __future__ import annotations

import inspect
import pathlib
import sys

MARK = "{{ hawk_math_table }}"
ANCHORED = "{{ hawk_math_table_anchored }}"


def math_table(anchors: bool = False) -> str:
    root = str(pathlib.Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    import hawk_fx.math as hm
    rows = ["| function | arguments | what it computes (per sample) |", "|---|---|---|"]
    for name in hm.__all__:
        fn = getattr(hm, name)
        args = ", ".join(inspect.signature(fn).parameters)
        doc = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ").replace("|", "\\|")
        anchor = f'<a id="hawk_fx.math.{name}"></a>' if anchors else ""
        rows.append(f"| {anchor}`{name}` | `{args}` | {doc} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    if ANCHORED in markdown:
        markdown = markdown.replace(ANCHORED, math_table(anchors=True))
    return markdown.replace(MARK, math_table()) if MARK in markdown else markdown
