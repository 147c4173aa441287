"""DDSketch: a mergeable quantile sketch with a relative-error guarantee.

Values ``x > 0`` are mapped to logarithmic buckets: with
``gamma = (1 + alpha) / (1 - alpha)`` the value ``x`` lands in bucket
``i = ceil(log_gamma(x))``, i.e. ``gamma**(i-1) < x <= gamma**i``, and every
value of that bucket is represented by ``2 * gamma**i / (gamma + 1)``.
Values below ``min_value`` go to a separate zero bucket represented by 0.

Guarantee
---------
Let ``true = np.quantile(data, q, method="lower")`` (the element of rank
``floor(q * (n - 1))``).  Then ``sketch.quantile(q)`` satisfies

    ``|est - true| <= alpha * true``        when ``true >= min_value``
    ``|est - true| <  min_value``           otherwise (the zero bucket)

up to floating-point rounding of ``log`` at bucket boundaries.  Estimates
are additionally clamped to ``[min, max]`` of the data, which can only move
them closer to the true value.

Counts live in a dense ``int64`` numpy array with an ``offset`` (the bucket
index of element 0) that grows on either side as needed, so ``add_many`` is
one ``np.bincount``.  Merging adds count arrays, so a merged sketch has
exactly the bucket counts of a sketch built from the concatenated data.

Examples
--------
>>> import numpy as np
>>> s = DDSketch(alpha=0.01)
>>> s.add_many(np.array([1.0, 2.0, 3.0, 4.0, 100.0]))
>>> round(s.quantile(0.5), 1)
3.0
>>> s.count, s.max
(5, 100.0)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from controllers.errors import ParameterError

__all__ = ["DDSketch"]

FloatArray = npt.NDArray[np.float64]


@functools.lru_cache(maxsize=16)
def _gamma(alpha: float) -> tuple[float, float]:
    gamma = (1.0 + alpha) / (1.0 - alpha)
    return gamma, math.log(gamma)


# One shared empty bucket array until a sketch's first value: a window holds six sketches, most of them
# empty (stages not measured), and a worker holds a window per (model, zone, node).
_NO_BUCKETS = np.zeros(0, dtype=np.int64)
_NO_BUCKETS.flags.writeable = False


class DDSketch:
    """Mergeable quantile sketch with relative accuracy ``alpha``.

    Parameters
    ----------
    alpha : float
        Relative-error bound, in (0, 1).  Default 0.01 (1 %).
    min_value : float
        Values in ``[0, min_value)`` are counted in the zero bucket
        (estimate 0).  Must be > 0.

    Raises
    ------
    ParameterError
        If ``alpha`` or ``min_value`` is out of range.

    Examples
    --------
    >>> a, b = DDSketch(), DDSketch()
    >>> a.add(10.0); b.add(20.0); b.add(0.0)
    >>> a.merge(b)
    >>> a.count, a.quantile(0.0), abs(a.quantile(1.0) - 20.0) <= 0.01 * 20.0
    (3, 0.0, True)
    """

    __slots__ = (
        "alpha",
        "min_value",
        "gamma",
        "_ln_gamma",
        "_counts",
        "_offset",
        "_zero_count",
        "_count",
        "_sum",
        "_min",
        "_max",
    )

    def __init__(self, alpha: float = 0.01, min_value: float = 1e-6) -> None:
        if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
            raise ParameterError(f"alpha={alpha!r}: relative error must lie in (0, 1)")
        if not (isinstance(min_value, (int, float)) and 0.0 < min_value < math.inf):
            raise ParameterError(f"min_value={min_value!r}: must be finite and > 0")
        self.alpha = float(alpha)
        self.min_value = float(min_value)
        self.gamma, self._ln_gamma = _gamma(self.alpha)  # the same two floats for every sketch of an alpha
        self._counts: npt.NDArray[np.int64] = _NO_BUCKETS  # replaced, never written, by the first _grow
        self._offset = 0
        self._zero_count = 0
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    # ------------------------------------------------------------------ add
    def _keys(self, values: FloatArray) -> npt.NDArray[np.int64]:
        return np.ceil(np.log(values) / self._ln_gamma).astype(np.int64)

    def _grow(self, lo: int, hi: int) -> None:
        """Make buckets ``lo..hi`` (inclusive) addressable."""
        if self._counts.size == 0:
            self._counts = np.zeros(hi - lo + 1, dtype=np.int64)
            self._offset = lo
            return
        cur_hi = self._offset + self._counts.size - 1
        new_lo, new_hi = min(lo, self._offset), max(hi, cur_hi)
        if new_lo == self._offset and new_hi == cur_hi:
            return
        grown = np.zeros(new_hi - new_lo + 1, dtype=np.int64)
        start = self._offset - new_lo
        grown[start : start + self._counts.size] = self._counts
        self._counts, self._offset = grown, new_lo

    def add_many(self, values: npt.ArrayLike) -> None:
        """Add an array of non-negative finite values (vectorised).

        Parameters
        ----------
        values : array_like of float
            Values to add; the whole batch is rejected if any is bad.

        Raises
        ------
        ValueError
            If any value is negative, NaN or infinite (nothing is added).

        Examples
        --------
        >>> s = DDSketch()
        >>> s.add_many(np.array([0.0, 1.0, 2.0]))
        >>> s.count, s.sum
        (3, 3.0)
        """
        arr = np.asarray(values, dtype=np.float64).ravel()
        if arr.size == 0:
            return
        if not np.all(np.isfinite(arr)):
            raise ValueError("DDSketch accepts only finite values (got NaN or inf)")
        if np.any(arr < 0.0):
            raise ValueError(f"DDSketch accepts only values >= 0 (got {float(arr.min())})")
        positive = arr[arr >= self.min_value]
        self._zero_count += int(arr.size - positive.size)
        if positive.size:
            keys = self._keys(positive)
            lo, hi = int(keys.min()), int(keys.max())
            self._grow(lo, hi)
            binned = np.bincount(keys - lo, minlength=hi - lo + 1)
            start = lo - self._offset
            self._counts[start : start + binned.size] += binned
        self._count += int(arr.size)
        self._sum += float(arr.sum())
        self._min = min(self._min, float(arr.min()))
        self._max = max(self._max, float(arr.max()))

    def add(self, value: float) -> None:
        """Add one value (same bucketing path as :meth:`add_many`).

        Examples
        --------
        >>> s = DDSketch(); s.add(5.0); s.count
        1
        """
        self.add_many(np.array([value], dtype=np.float64))

    def merge(self, other: DDSketch) -> None:
        """Merge ``other`` into this sketch in place.

        Raises
        ------
        ParameterError
            If the sketches differ in ``alpha`` or ``min_value``.

        Examples
        --------
        >>> a, b = DDSketch(), DDSketch(); b.add(3.0); a.merge(b); a.count
        1
        """
        if other.alpha != self.alpha or other.min_value != self.min_value:
            raise ParameterError(
                f"alpha/min_value mismatch: cannot merge sketch with alpha={other.alpha}, "
                f"min_value={other.min_value} into alpha={self.alpha}, "
                f"min_value={self.min_value}"
            )
        if other._count == 0:
            return
        if other._counts.size:
            lo = other._offset
            hi = lo + other._counts.size - 1
            self._grow(lo, hi)
            start = lo - self._offset
            self._counts[start : start + other._counts.size] += other._counts
        self._zero_count += other._zero_count
        self._count += other._count
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    # ------------------------------------------------------------- queries
    @property
    def count(self) -> int:
        """Number of values added."""
        return self._count

    @property
    def sum(self) -> float:
        """Sum of values added."""
        return self._sum

    @property
    def min(self) -> float | None:
        """Smallest value added (exact), None when empty."""
        return self._min if self._count else None

    @property
    def max(self) -> float | None:
        """Largest value added (exact), None when empty."""
        return self._max if self._count else None

    @property
    def mean(self) -> float | None:
        """Exact mean, None when empty."""
        return self._sum / self._count if self._count else None

    @property
    def zero_count(self) -> int:
        """Values counted in the zero bucket (below ``min_value``)."""
        return self._zero_count

    def bucket_counts(self) -> dict[int, int]:
        """Non-empty buckets as ``{bucket_index: count}`` (zero bucket excluded).

        Examples
        --------
        >>> s = DDSketch(); s.add(1.0); s.bucket_counts()
        {0: 1}
        """
        nz = np.flatnonzero(self._counts)
        return {int(i) + self._offset: int(self._counts[i]) for i in nz}

    def quantile(self, q: float) -> float | None:
        """Estimate the value of rank ``floor(q * (n - 1))``; None when empty.

        Matches ``np.quantile(data, q, method="lower")`` within the relative
        error ``alpha`` (see the module docstring).

        Raises
        ------
        ValueError
            If ``q`` is not in [0, 1].

        Examples
        --------
        >>> s = DDSketch(); s.add_many(np.arange(1.0, 101.0))
        >>> abs(s.quantile(0.9) - 90.0) <= 0.01 * 90.0
        True
        >>> DDSketch().quantile(0.5) is None
        True
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q={q!r}: quantile must lie in [0, 1]")
        if self._count == 0:
            return None
        rank = math.floor(q * (self._count - 1))
        if rank < self._zero_count:
            est = 0.0
        else:
            cum = np.cumsum(self._counts)
            idx = int(np.searchsorted(cum, rank - self._zero_count, side="right"))
            key = idx + self._offset
            est = 2.0 * self.gamma**key / (self.gamma + 1.0)
        return float(min(max(est, self._min), self._max))

    def quantiles(self, qs: Iterable[float]) -> list[float | None]:
        """Several quantiles at once (see :meth:`quantile`).

        Examples
        --------
        >>> s = DDSketch(); s.add_many(np.array([1.0, 2.0]))
        >>> [round(v, 2) for v in s.quantiles([0.0, 1.0])]
        [1.0, 1.99]
        """
        return [self.quantile(q) for q in qs]

    # ------------------------------------------------------- serialisation
    def copy(self) -> DDSketch:
        """Independent deep copy.

        Examples
        --------
        >>> s = DDSketch(); s.add(1.0); c = s.copy(); c.add(2.0); s.count
        1
        """
        out = DDSketch(self.alpha, self.min_value)
        out._counts = self._counts.copy()
        out._offset = self._offset
        out._zero_count = self._zero_count
        out._count = self._count
        out._sum = self._sum
        out._min = self._min
        out._max = self._max
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, canonical state (bucket array trimmed of empty ends).

        Examples
        --------
        >>> s = DDSketch(); s.add(1.0)
        >>> DDSketch.from_dict(s.to_dict()).to_dict() == s.to_dict()
        True
        """
        nz = np.flatnonzero(self._counts)
        if nz.size:
            lo, hi = int(nz[0]), int(nz[-1])
            counts = [int(c) for c in self._counts[lo : hi + 1]]
            offset = self._offset + lo
        else:
            counts, offset = [], 0
        return {
            "alpha": self.alpha,
            "min_value": self.min_value,
            "offset": offset,
            "counts": counts,
            "zero_count": self._zero_count,
            "count": self._count,
            "sum": self._sum,
            "min": self.min,
            "max": self.max,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DDSketch:
        """Rebuild a sketch from :meth:`to_dict` output.

        Raises
        ------
        ValueError
            If the counts are inconsistent.
        """
        out = cls(float(data["alpha"]), float(data["min_value"]))
        counts = np.asarray(data["counts"], dtype=np.int64)
        if np.any(counts < 0):
            raise ValueError("counts: bucket counts must be >= 0")
        out._counts = counts
        out._offset = int(data["offset"])
        out._zero_count = int(data["zero_count"])
        out._count = int(data["count"])
        if out._count != int(counts.sum()) + out._zero_count:
            raise ValueError("count: does not equal the sum of bucket and zero counts")
        out._sum = float(data["sum"])
        out._min = math.inf if data["min"] is None else float(data["min"])
        out._max = -math.inf if data["max"] is None else float(data["max"])
        return out

    def __getstate__(self) -> dict[str, Any]:
        return self.to_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        restored = DDSketch.from_dict(state)
        for name in DDSketch.__slots__:
            object.__setattr__(self, name, getattr(restored, name))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DDSketch):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DDSketch(alpha={self.alpha}, count={self._count})"
