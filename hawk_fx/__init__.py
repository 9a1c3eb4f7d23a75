"""hawk_fx: per-sample kernels. Write a function for ONE sample, annotate its parameters with
roles, and `@hawk_fx.kernel` runs it over whole arrays (the sample axis last)."""
from . import math
from .core import LeakedTracerError, Program
from .custom import custom_jvp
from .kernel import Kernel, kernel
from .reductions import max, mean, min, sum
from .roles import Int32, Matrix, Mutable, Param, Scalar, Terminated, UInt32, Vector
from .roles import Key, Table
from .trace import TraceError
from .done import all_done

__version__ = "0.1.0"

__all__ = ["kernel", "Kernel", "Program", "sum", "max", "min", "mean", "Scalar", "Param", "Mutable",
           "UInt32", "Int32", "Vector", "Matrix", "Terminated", "TraceError",
           "LeakedTracerError", "Table", "all_done", "custom_jvp"]
__all__ += ["Key", "random"]
from .loops import UnrolledLoopWarning
__all__ += ["UnrolledLoopWarning"]
