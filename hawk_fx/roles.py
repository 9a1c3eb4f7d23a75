"""Parameter roles: what a kernel parameter is for one sample, and what array it takes for many.

The sample axis is last: a `Vector[3]` plane of n samples has shape (3, n), a `Scalar` plane (n,).
A one-cell array (`(1,)`, or `(3, 1)` for a Vector) is one value for all samples.
"""
from __future__ import annotations

import numpy as np


class Role:
    """What a kernel parameter is for one sample: its per-sample shape, dtype, and whether the
    kernel writes it (`Mutable`) or it is one value for all samples (`Param`)."""

    __slots__ = ("name", "shape", "dtype", "mutable", "uniform", "reserved")
    table = False                  # a Table: its shape is the argument's, it has no sample axis

    def __init__(self, name, shape=(), dtype=None, mutable=False, uniform=False, reserved=None):
        self.name = name
        self.shape = tuple(shape)      # per-sample shape
        self.dtype = dtype             # None: any real dtype; else the exact dtype a written plane needs
        self.mutable = mutable
        self.uniform = uniform         # Param: one value for all samples
        self.reserved = reserved       # a role named now for a feature still to come: kernels refuse it

    def __repr__(self):
        return f"Mutable[{self.name}]" if self.mutable else self.name

    def accepts_dtype(self, dt: np.dtype) -> bool:
        if self.dtype is None:
            return dt.kind in ("f", "i", "u", "b") if not self.mutable else dt.kind == "f"
        want = np.dtype(self.dtype)
        if self.mutable:
            return dt == want
        return dt.kind in ("i", "u", "b") if want.kind in "iu" else dt == want

    def describe_dtype(self) -> str:
        if self.dtype is None:
            return "a floating dtype" if self.mutable else "a real (bool, integer or floating) dtype"
        want = np.dtype(self.dtype)
        if self.mutable or want.kind not in "iu":
            return f"dtype {want.name}"
        return "an integer dtype"

    def plane_shape(self) -> str:
        return str(self.shape + ("n",)).replace("'", "")     # (n,), (3, n)


class _RoleFactory:
    """`Vector[3]`, `Matrix[2, 3]`: a role with a per-sample shape given by subscript."""

    def __init__(self, name, rank):
        self.name, self.rank = name, rank

    def __getitem__(self, dims):
        dims = dims if isinstance(dims, tuple) else (dims,)
        if len(dims) != self.rank or not all(isinstance(d, int) and d > 0 for d in dims):
            raise TypeError(f"hawk.{self.name}[...] takes {self.rank} positive int(s), got {dims!r}")
        return Role(f"{self.name}[{', '.join(map(str, dims))}]", dims)

    def __repr__(self):
        return f"hawk.{self.name}"


class _MutableFactory:
    """`Mutable[role]`: the role of a parameter the kernel writes in place."""

    def __getitem__(self, role):
        if isinstance(role, TerminatedRole):       # already written by its kernel: Mutable adds nothing
            return Role("Terminated", dtype=np.bool_, mutable=True, reserved=(
                "nothing: a `Terminated` parameter (the run-until-done mark) is already written by its kernel "
                "(`done = cond`); annotate it `done: Terminated`"))
        if not isinstance(role, Role) or role.uniform or role.mutable:
            raise TypeError(f"hawk.Mutable[...] takes a per-sample role (Scalar, UInt32, Vector[k], ...), got {role!r}")
        return type(role)(role.name, role.shape, role.dtype, mutable=True, reserved=role.reserved)

    def __repr__(self):
        return "hawk.Mutable"


Scalar = Role("Scalar")
"""One number per sample: a plane of shape (n,), of any real dtype."""
Param = Role("Param", uniform=True)
"""One number for all samples: a Python number, or a one-cell array (1,) read at every call."""
UInt32 = Role("UInt32", dtype=np.uint32)
"""One uint32 per sample, (n,); as `Mutable[UInt32]` on a one-cell array, a graph's guard cell."""
Int32 = Role("Int32", dtype=np.int32)
"""One int32 per sample: a plane of shape (n,) of an integer dtype."""


class TerminatedRole(Role):
    """The role of a kernel's done mark (see `Terminated`); written by its kernel, never Mutable[...]."""

    __slots__ = ()

    def __repr__(self):
        return "Terminated"


Terminated = TerminatedRole("Terminated", dtype=np.bool_, mutable=True)
"""One bool per sample, (n,), the done mark: a kernel leaves a sample whose mark is set untouched
(its Mutables keep their values, its results read 0), and `done = cond` in the body sets it."""

Vector = _RoleFactory("Vector", 1)
"""`Vector[k]`: k components per sample, a plane of shape (k, n) (the sample axis last)."""
Matrix = _RoleFactory("Matrix", 2)
"""`Matrix[r, c]`: an r x c matrix per sample, a plane of shape (r, c, n)."""
Mutable = _MutableFactory()
"""`Mutable[role]`: a parameter the kernel writes; assigning to it writes the caller's array in place."""


class TableRole(Role):
    """A Table: one array for all samples, of any shape, indexed per sample along its first axis."""

    __slots__ = ()
    table = True

    def plane_shape(self) -> str:
        return "(K, ..., 1)"


Table = TableRole("Table")
"""One array shared by all samples (spline coefficients, a lookup grid), any shape, passed as a
one-cell array: `(K, 1)` for K entries, `(K, 4, 1)` for K rows of 4 (the last axis, of length 1, is
the one-cell axis of a value shared by all samples). Read it with `table[i]` or `hm.take(table, i)`
for a per-sample integer i; `Mutable[Table]` is written with `hm.scatter_add`. Its float entries
are differentiable like any other argument."""


class _KeyRole(Role):
    """A random key: two uint32 words per sample. Exactly uint32, since a key's words are bits
    (an int64 plane of them would be some other number)."""

    __slots__ = ()

    def accepts_dtype(self, dt: np.dtype) -> bool:
        return dt == np.uint32

    def describe_dtype(self) -> str:
        return ("dtype uint32: a key's two words, as hawk_fx.random.key(seed) makes them "
                "(np.asarray(jax.random.key_data(k), np.uint32)[:, None] for a JAX key)")


Key = _KeyRole("Key", (2,), np.uint32)
"""A random key (hawk_fx.random): a (2, n) uint32 plane of per-sample keys, or a one-cell (2, 1) key
for all samples; `hawk_fx.random.key(seed)` makes one."""
