"""hawk_fx.linalg: small dense linear algebra per sample (`hm.linalg.solve`, `cholesky`, `qr`, ...).

Each function is written out of the kernel's own operations (indexing, arithmetic, per-sample
selects), unrolled for the per-sample size k, so it runs on every backend as the rest of a body
does and its derivatives (forward and reverse) are those of the computation itself: for solve,
det, inv, cholesky, qr and lstsq they equal the analytic ones JAX uses; eigh iterates Jacobi
rotations to convergence, and its derivative converges with it.

Matrices are worked on as a list of row Vectors, so one arithmetic operation updates a whole row:
an unrolled k x k factorisation is O(k^2) operations, each on k components.

Conventions follow jax.numpy.linalg / jax.scipy.linalg. Where NumPy raises for one bad matrix
(a singular `solve`, a `cholesky` of a matrix that is not positive definite), a kernel cannot
stop for one sample: that sample gets inf/nan, as JAX gives, and the others are unaffected.
"""
from __future__ import annotations

from . import math as hm
from .prims import P

__all__ = ["solve", "lu_factor", "lu_solve", "lu", "det", "slogdet", "inv", "cholesky", "cho_solve", "qr",
           "lstsq", "eigh", "norm"]


# ---------------------------------------------------------------------------------------------
# shapes and constants

def _shape(x):
    return tuple(hm._shape(x))


def _square(a, api) -> int:
    s = _shape(a)
    if len(s) != 2 or s[0] != s[1]:
        raise ValueError(f"hawk.linalg.{api}: needs a square Matrix[k, k] per sample, got per-sample shape {s}; "
                         + ("use hm.linalg.lstsq for a rectangular system" if len(s) == 2 else
                            "pass a Matrix value (a Matrix[k, k] parameter or a stack of Vectors)"))
    return s[0]


def _rhs(b, k, api):
    """The rows of a right-hand side: scalars for a Vector[k], Vector[m] rows for a Matrix[k, m]."""
    s = _shape(b)
    if len(s) not in (1, 2) or s[0] != k:
        raise ValueError(f"hawk.linalg.{api}: the right-hand side must be a Vector[{k}] or a Matrix[{k}, m] per "
                         f"sample, got per-sample shape {s}")
    return _rows(b)


def _rows(x):
    return [x[i] for i in range(_shape(x)[0])]


def _like(x, a):
    """x in a's floating dtype: a value built from constants alone (a permutation) would be float64."""
    aval = getattr(a, "aval", None)
    if aval is None or aval.dtype.kind != "f" or getattr(x, "aval", None) is None or x.aval.dtype == aval.dtype:
        return x
    return P["convert"].bind(x, dtype=aval.dtype)


def _mask(k, pred):
    """A constant bool Vector[k]: True at the components c where pred(c) holds."""
    return hm.vec(*[bool(pred(c)) for c in range(k)])


def _unit(k, i):
    """The constant Vector[k] e_i (Python numbers: it takes the dtype of what it meets)."""
    return hm.vec(*[1.0 if c == i else 0.0 for c in range(k)])


# ---------------------------------------------------------------------------------------------
# LU with partial pivoting

def _lu_rows(a, api):
    """Row-pivoted LU as LAPACK's getrf: (rows of the packed L\\U, pivots). pivots[j] is the row
    swapped with row j at step j, a per-sample integer (a Python int where there was no choice).
    The pivot is the first largest |a_ij|; a zero pivot column is left as it is (no division)."""
    k = _square(a, api)
    rows = _rows(a)
    piv = []
    for j in range(k):
        best, p = hm.abs(rows[j][j]), j
        for i in range(j + 1, k):
            v = hm.abs(rows[i][j])
            take = v > best
            best, p = hm.where(take, v, best), hm.where(take, i, p)
        piv.append(p)
        _swap(rows, j, p)
        if j + 1 == k:
            break
        pivot = rows[j][j]
        pivot = hm.where(pivot == 0, 1.0, pivot)      # then every |a_ij| below is 0: the multipliers are 0
        upper = hm.where(_mask(k, lambda c: c > j), rows[j], 0.0)
        at_j = _mask(k, lambda c: c == j)
        for i in range(j + 1, k):
            m = rows[i][j] / pivot
            rows[i] = hm.where(at_j, m, rows[i] - m * upper)
    return rows, piv


def _swap(rows, j, p):
    """Swap rows[j] with rows[p] (p >= j, per sample) in place, by selects."""
    if isinstance(p, int):
        rows[j], rows[p] = rows[p], rows[j]
        return
    rj = rows[j]
    for i in range(j + 1, len(rows)):
        s = p == i
        rj, rows[i] = hm.where(s, rows[i], rj), hm.where(s, rows[j], rows[i])
    rows[j] = rj


def _lu_solve_rows(lu_rows, piv, b_rows):
    """x with A x = b from A's packed LU: the pivots' swaps, then L y = b and U x = y."""
    k = len(lu_rows)
    b_rows = list(b_rows)
    for j, p in enumerate(piv):
        _swap(b_rows, j, p)
    y = []
    for i in range(k):
        s = b_rows[i]
        for j in range(i):
            s = s - lu_rows[i][j] * y[j]
        y.append(s)
    x = [None] * k
    for i in reversed(range(k)):
        s = y[i]
        for j in range(i + 1, k):
            s = s - lu_rows[i][j] * x[j]
        x[i] = s / lu_rows[i][i]
    return x


def lu_factor(a):
    """Pivoted LU of a square Matrix, packed as jax.scipy.linalg.lu_factor: (lu, piv) with L's
    multipliers below the diagonal, U on and above, and piv (int32) the row swapped with row i."""
    rows, piv = _lu_rows(a, "lu_factor")
    return hm.vec(*rows), hm.int32(hm.vec(*piv))


def lu_solve(lu_and_piv, b):
    """x with A x = b from lu_factor(A) (jax.scipy.linalg.lu_solve with trans=0); b a Vector[k] or
    a Matrix[k, m]."""
    lu_, piv = lu_and_piv
    k = _square(lu_, "lu_solve")
    if _shape(piv) != (k,):
        raise ValueError(f"hawk.linalg.lu_solve: piv must be a Vector[{k}] of pivots (lu_factor's second result), "
                         f"got per-sample shape {_shape(piv)}")
    return hm.vec(*_lu_solve_rows(_rows(lu_), _rows(piv), _rhs(b, k, "lu_solve")))


def lu(a):
    """(p, l, u) with a = p @ l @ u, l unit lower triangular, u upper, p a permutation matrix, as
    jax.scipy.linalg.lu."""
    k = _square(a, "lu")
    rows, piv = _lu_rows(a, "lu")
    perm = [_unit(k, i) for i in range(k)]
    for j, p in enumerate(piv):
        _swap(perm, j, p)
    l_rows = [hm.where(_mask(k, lambda c: c < i), r, _unit(k, i)) for i, r in enumerate(rows)]
    u_rows = [hm.where(_mask(k, lambda c: c >= i), r, 0.0) for i, r in enumerate(rows)]
    return _like(hm.transpose(hm.vec(*perm)), a), hm.vec(*l_rows), hm.vec(*u_rows)


def solve(a, b):
    """x with a @ x = b per sample (jax.numpy.linalg.solve): LU with partial pivoting. b is a
    Vector[k] or a Matrix[k, m]. A singular system gives inf/nan in that sample (NumPy raises)."""
    k = _square(a, "solve")
    b_rows = _rhs(b, k, "solve")
    rows, piv = _lu_rows(a, "solve")
    return hm.vec(*_lu_solve_rows(rows, piv, b_rows))


def inv(a):
    """The inverse of a square Matrix (jax.numpy.linalg.inv): solve(a, I); inf/nan where singular."""
    k = _square(a, "inv")
    rows, piv = _lu_rows(a, "inv")
    return hm.vec(*_lu_solve_rows(rows, piv, [_unit(k, i) for i in range(k)]))


def _parity(piv):
    """(-1)^(number of row swaps), per sample."""
    sign = 1.0
    for j, p in enumerate(piv):
        if not isinstance(p, int):
            sign = hm.where(p != j, -sign, sign)
    return sign


def det(a):
    """The determinant (jax.numpy.linalg.det): the pivots' product, signed by the row swaps; 0 for
    an exactly singular matrix, as NumPy."""
    rows, piv = _lu_rows(a, "det")
    d = _parity(piv)
    for i, r in enumerate(rows):
        d = d * r[i]
    return d


def slogdet(a):
    """(sign, log|det|) (jax.numpy.linalg.slogdet): (0, -inf) for a singular matrix."""
    rows, piv = _lu_rows(a, "slogdet")
    sign, logabs = _parity(piv), 0.0
    for i, r in enumerate(rows):
        u = r[i]
        sign = sign * hm.sign(u)
        logabs = logabs + hm.log(hm.abs(u))
    return sign, logabs


# ---------------------------------------------------------------------------------------------
# Cholesky

def cholesky(a):
    """Lower-triangular L with a = L @ L^T (jax.numpy.linalg.cholesky), from (a + a^T) / 2 as JAX
    reads it (so its derivative is JAX's, symmetric). Not positive definite: nan (NumPy raises)."""
    k = _square(a, "cholesky")
    s = (a + hm.transpose(a)) * 0.5
    srows = _rows(s)
    L = [[None] * k for _ in range(k)]
    for j in range(k):
        d = srows[j][j]
        for m in range(j):
            d = d - L[j][m] * L[j][m]
        L[j][j] = hm.sqrt(d)
        for i in range(j + 1, k):
            t = srows[i][j]
            for m in range(j):
                t = t - L[i][m] * L[j][m]
            L[i][j] = t / L[j][j]
    return hm.vec(*[hm.vec(*[L[i][j] if j <= i else 0.0 for j in range(k)]) for i in range(k)])


def _tri_solve_rows(t_rows, b_rows, lower, transpose=False):
    """x with T x = b (or T^T x = b), T triangular given by its rows; reads only T's triangle."""
    k = len(t_rows)
    coef = (lambda i, j: t_rows[j][i]) if transpose else (lambda i, j: t_rows[i][j])
    forward = lower != transpose
    order = range(k) if forward else reversed(range(k))
    x = [None] * k
    for i in order:
        s = b_rows[i]
        for j in (range(i) if forward else range(i + 1, k)):
            s = s - coef(i, j) * x[j]
        x[i] = s / t_rows[i][i]
    return x


def cho_solve(c_and_lower, b):
    """x with A x = b from A's Cholesky factor (jax.scipy.linalg.cho_solve): c_and_lower is
    (c, lower), c lower (A = c c^T) or upper (A = c^T c); only that triangle of c is read."""
    c, lower = c_and_lower
    k = _square(c, "cho_solve")
    rows, b_rows = _rows(c), _rhs(b, k, "cho_solve")
    y = _tri_solve_rows(rows, b_rows, lower=bool(lower), transpose=not lower)
    return hm.vec(*_tri_solve_rows(rows, y, lower=bool(lower), transpose=bool(lower)))


# ---------------------------------------------------------------------------------------------
# Householder QR and least squares

def _householder(a):
    """LAPACK's geqrf on the columns of a (m x n): the columns of R (as Vector[m]) and the
    reflectors (v, tau), H = I - tau v v^T, with R's diagonal -sign(a_jj) |x| as LAPACK gives."""
    m, n = _shape(a)
    cols = _rows(hm.transpose(a))
    refl = []
    for j in range(min(m - 1, n)):              # a last row alone needs no reflector (LAPACK's tau = 0)
        x = cols[j]
        alpha = x[j]
        below = _mask(m, lambda c: c > j)
        tail = hm.where(below, x, 0.0)
        t2 = hm.dot(tail, tail)
        zero = t2 == 0                           # nothing below the diagonal: H = I (tau = 0)
        r = hm.sqrt(alpha * alpha + hm.where(zero, 1.0, t2))
        beta = hm.where(alpha < 0, r, -r)
        tau = hm.where(zero, 0.0, (beta - alpha) / beta)
        scale = 1.0 / hm.where(zero, 1.0, alpha - beta)
        v = hm.where(below, x * scale, _unit(m, j))
        refl.append((v, tau))
        for c in range(j + 1, n):
            cols[c] = cols[c] - (tau * hm.dot(v, cols[c])) * v
        cols[j] = hm.where(below, 0.0, hm.where(_mask(m, lambda c: c == j), hm.where(zero, alpha, beta), x))
    return cols, refl


def _reflect(refl, x, reverse=False):
    for v, tau in (reversed(refl) if reverse else refl):
        x = x - (tau * hm.dot(v, x)) * v
    return x


def qr(a, mode="reduced"):
    """(q, r) with a = q @ r (jax.numpy.linalg.qr) by Householder reflections, LAPACK's signs.
    mode "reduced" (q m x K, r K x n, K = min(m, n)), "complete" (q m x m, r m x n) or "r" (r alone)."""
    s = _shape(a)
    if len(s) != 2:
        raise ValueError(f"hawk.linalg.qr: needs a Matrix[m, n] per sample, got per-sample shape {s}")
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"hawk.linalg.qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    m, n = s
    K = min(m, n)
    cols, refl = _householder(a)
    r = hm.transpose(hm.vec(*cols))                        # m x n
    if mode != "complete" and m > K:
        r = hm.vec(*[r[i] for i in range(K)])
    if mode == "r":
        return r
    qcols = [_reflect(refl, _unit(m, c), reverse=True) for c in range(m if mode == "complete" else K)]
    return _like(hm.transpose(hm.vec(*qcols)), a), r


def lstsq(a, b):
    """The least-squares solution x of a @ x ~ b for a Matrix[m, n] of full column rank, m >= n,
    by Householder QR. Returns x alone (jax.numpy.linalg.lstsq's first result; its residuals, rank
    and singular values need an SVD). b is a Vector[m] or a Matrix[m, p]."""
    s = _shape(a)
    if len(s) != 2 or s[0] < s[1]:
        raise ValueError(f"hawk.linalg.lstsq: needs a Matrix[m, n] with m >= n per sample (full column rank), got "
                         f"per-sample shape {s}; an underdetermined system has no unique least-squares solution")
    m, n = s
    sb = _shape(b)
    if len(sb) not in (1, 2) or sb[0] != m:
        raise ValueError(f"hawk.linalg.lstsq: b must be a Vector[{m}] or a Matrix[{m}, p] per sample, got "
                         f"per-sample shape {sb}")
    cols, refl = _householder(a)
    rrows = [[cols[c][i] for c in range(n)] for i in range(n)]
    if len(sb) == 1:
        qb = _reflect(refl, b)
        rhs = [qb[i] for i in range(n)]
    else:
        qbc = [_reflect(refl, bc) for bc in _rows(hm.transpose(b))]      # columns of Q^T b
        rhs = [hm.vec(*[qc[i] for qc in qbc]) for i in range(n)]
    return hm.vec(*_tri_solve_rows(rrows, rhs, lower=False))


# ---------------------------------------------------------------------------------------------
# symmetric eigenproblem: one-sided (Hestenes) Jacobi

def _sweeps(k):
    return 4 if k <= 2 else (6 if k <= 4 else (8 if k <= 8 else 10))


def eigh(a, sweeps=None):
    """(w, v): eigenvalues ascending and unit eigenvectors as v's columns (jax.numpy.linalg.eigh),
    of (a + a^T) / 2. One-sided Jacobi: rotations of pairs of columns of B = a + |a|_F I (positive
    semidefinite, so its singular vectors are a's eigenvectors, eigenvalues of opposite signs kept
    apart) until they are orthogonal, a fixed number of sweeps (4 to 10 with k: the off-diagonal
    part falls quadratically, to float64 rounding for k <= 16 on the matrices we test); then
    w_i = v_i^T a v_i. Each eigenvector's sign is arbitrary, as LAPACK's. The derivative is that of
    the sweeps; for distinct eigenvalues it agrees with JAX's analytic rule to about their accuracy
    (1e-9 in float64 on our test matrices, eigenvalues 0.5 or more apart)."""
    k = _square(a, "eigh")
    sweeps = _sweeps(k) if sweeps is None else int(sweeps)
    s = (a + hm.transpose(a)) * 0.5
    shift = hm.sqrt(hm.einsum("ij,ij->", s, s))
    u = [r + shift * _unit(k, i) for i, r in enumerate(_rows(s))]     # columns of B (B is symmetric)
    vt = [_unit(k, i) for i in range(k)]                               # columns of v
    for _ in range(sweeps):
        for p in range(k - 1):
            for q in range(p + 1, k):
                # the rotation that makes u_p and u_q orthogonal: Jacobi's on [[alpha, gamma], [gamma, beta]],
                # t = 2 gamma sgn(d) / (|d| + hypot(d, 2 gamma)), with no division by gamma (0 once converged)
                alpha, beta, gamma = hm.dot(u[p], u[p]), hm.dot(u[q], u[q]), hm.dot(u[p], u[q])
                d = beta - alpha
                den = hm.abs(d) + hm.hypot(d, 2.0 * gamma)
                t = hm.where(d < 0, -2.0, 2.0) * gamma / hm.where(den == 0, 1.0, den)
                c = hm.rsqrt(t * t + 1.0)
                sn = t * c
                u[p], u[q] = c * u[p] - sn * u[q], sn * u[p] + c * u[q]
                vt[p], vt[q] = c * vt[p] - sn * vt[q], sn * vt[p] + c * vt[q]
    w = [hm.einsum("i,ij,j->", v, s, v) for v in vt]
    for rnd in range(k):                           # odd-even transposition sort, ascending
        for i in range(rnd % 2, k - 1, 2):
            swap = w[i] > w[i + 1]
            w[i], w[i + 1] = hm.where(swap, w[i + 1], w[i]), hm.where(swap, w[i], w[i + 1])
            vt[i], vt[i + 1] = hm.where(swap, vt[i + 1], vt[i]), hm.where(swap, vt[i], vt[i + 1])
    return hm.vec(*w), _like(hm.transpose(hm.vec(*vt)), a)


# ---------------------------------------------------------------------------------------------
# norms

_INF = float("inf")


def norm(x, ord=None):
    """jax.numpy.linalg.norm of a Vector (ord None/2, 1, inf, -inf, 0, or any p) or a Matrix
    (ord None/'fro', 1, -1, inf, -inf); the matrix 2-norm and 'nuc' need an SVD and are refused."""
    s = _shape(x)
    if len(s) == 1:
        comps = _rows(x)
        if ord is None or ord == 2:
            return hm.sqrt(hm.dot(x, x))
        if ord == _INF or ord == -_INF:
            out = hm.abs(comps[0])
            for c in comps[1:]:
                out = (hm.maximum if ord > 0 else hm.minimum)(out, hm.abs(c))
            return out
        if ord == 0:
            return _like(_sum([hm.where(c != 0, 1.0, 0.0) for c in comps]), x)
        if ord == 1:
            return _sum([hm.abs(c) for c in comps])
        if isinstance(ord, (int, float)):
            return hm.pow(_sum([hm.pow(hm.abs(c), float(ord)) for c in comps]), 1.0 / ord)
    elif len(s) == 2:
        if ord is None or ord == "fro":
            return hm.sqrt(hm.einsum("ij,ij->", x, x))
        if ord in (1, -1, _INF, -_INF):
            m = x if ord in (_INF, -_INF) else hm.transpose(x)          # row sums, or column sums
            sums = [_sum([hm.abs(c) for c in _rows(r)]) for r in _rows(m)]
            out = sums[0]
            for v in sums[1:]:
                out = (hm.maximum if ord > 0 else hm.minimum)(out, v)
            return out
        if ord in (2, -2, "nuc"):
            raise ValueError(f"hawk.linalg.norm: the matrix norm ord={ord!r} needs singular values, which "
                             "hawk.linalg does not compute; use ord='fro', 1 or inf, or hm.linalg.eigh of a^T a")
    else:
        raise ValueError(f"hawk.linalg.norm: needs a Vector or a Matrix per sample, got per-sample shape {s}")
    raise ValueError(f"hawk.linalg.norm: ord={ord!r} is not a norm of a {'Vector' if len(s) == 1 else 'Matrix'}")


def _sum(xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out
