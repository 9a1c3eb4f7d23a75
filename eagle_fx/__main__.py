"""`python -m eagle_fx`: a short demo on the NumPy backend."""
import numpy as np

import hawk_fx as hawk
from hawk_fx import Param, Scalar


@hawk.kernel
def scale(x: Scalar, a: Param, b: Param) -> Scalar:
    return a * x + b


x = np.arange(4.0)
print("scale(x, 2.0, 1.0) =", scale(x, 2.0, 1.0))
print(scale.ir)
