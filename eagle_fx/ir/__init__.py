"""The IR: what a staged graph is made of, and what reads it without running it.

    primitives.py   the graph primitives and their abstract evaluation and printing rules
    closed.py       a closed Program: what transforms hand each other and backends lower
    analysis.py     analyses over Programs (branch hazards, stage counts)
    dot.py          a Program drawn as Graphviz DOT / SVG

`from eagle_fx import ir` then `ir.while_p`: the primitives are read from the package itself.
"""
from .primitives import *  # noqa: F401,F403
from .host import host_p  # noqa: F401,E402
from .custom import custom_p  # noqa: F401,E402
