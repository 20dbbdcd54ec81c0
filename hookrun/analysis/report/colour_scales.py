"""The colours of `plot` and `report`, decided once for both renderers (figure specs in figure_specs.py):
the scales, the colour of a cell with no value, and the range a picture's colours span.

    lo, hi = diverging_range(z) if is_signed(z) else finite_range(z)
    title += no_value_note(z)        # " (3 cells NaN or inf: grey, no value)" or ""

Ranges are of the finite values only: one inf (an fp16 overflow) or NaN never stretches or collapses a
scale; such a cell is drawn in NO_VALUE, and the picture's title or colour bar says how many there are.
"""

from __future__ import annotations

import numpy as np

# ColorBrewer's RdBu, from the most negative (blue) to the most positive (red): both renderers
# build their scale from these stops (matplotlib: a ListedColormap, plotly: a colorscale).
DIVERGING = ("#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f")
POSITIVE, NEGATIVE = DIVERGING[-1], DIVERGING[0]
SEQUENTIAL = "viridis"  # values of one sign (matplotlib's and plotly's viridis are the same stops)
NO_VALUE = "#bdbdbd"  # a cell without a value (NaN, inf): grey, apart from every colour of both scales


def finite_range(z: np.ndarray, none: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
    """(min, max) of the finite values (`none` where no value is finite)."""
    z = np.asarray(z, dtype=np.float64)
    finite = z[np.isfinite(z)]
    return (float(finite.min()), float(finite.max())) if finite.size else none


def diverging_range(z: np.ndarray, centre: float = 0.0) -> tuple[float, float]:
    """(lo, hi) symmetric about `centre`, reaching the finite value furthest from it (1 where none is finite)."""
    z = np.asarray(z, dtype=np.float64)
    finite = z[np.isfinite(z)]
    top = float(np.abs(finite - centre).max()) if finite.size else 1.0
    top = top if np.isfinite(top) and top > 0 else 1.0
    return centre - top, centre + top


def is_signed(z: np.ndarray) -> bool:
    """Values on both sides of zero: drawn with the diverging scale centred on 0."""
    z = np.asarray(z, dtype=np.float64)
    finite = z[np.isfinite(z)]
    return bool(finite.size) and float(finite.min()) < 0 < float(finite.max())


def no_value_note(z: np.ndarray) -> str:
    """What a picture's title adds about its cells with no value: "" where every cell is finite."""
    z = np.asarray(z, dtype=np.float64)
    bad = int(z.size - np.count_nonzero(np.isfinite(z)))
    if not bad:
        return ""
    if bad == z.size:
        return " (no finite value: every cell grey, no colour scale)"
    return f" ({bad} {'cell' if bad == 1 else 'cells'} NaN or inf: grey, no value)"


def without_mask_fill(z: np.ndarray, dtypes: tuple = ()) -> np.ndarray:
    """Attention scores as float64 with an attention mask's fill as -inf (no value, grey): -inf already
    (TransformerLens), at or below half the lowest value of `dtypes` (the tensor's and the file's:
    transformers' eager attention adds torch.finfo(dtype).min), or any other fill (-10000: BERT's additive
    mask, older GPT-2's masked_bias; -1e9; -65504): the values at or below half the lowest one, where that
    is -1000 or less and every other value lies within a tenth of it, at least 400 below them all, so
    each has weight 0 after the softmax (exp(-400) is 0 in float32). One such cell would stretch the
    colour scale to the fill, every real score one colour."""
    import torch

    z = np.array(z, dtype=np.float64)
    lows = [float(torch.finfo(getattr(torch, str(d), torch.float32)).min) for d in dtypes
            if isinstance(getattr(torch, str(d), None), torch.dtype) and getattr(torch, str(d)).is_floating_point]
    z[z <= max(lows, default=float(np.finfo(np.float32).min)) / 2] = -np.inf
    finite = z[np.isfinite(z)]
    low = float(finite.min()) if finite.size else 0.0
    if low <= -1000:
        rest = finite[finite > low / 2]
        if not rest.size or float(np.abs(rest).max()) <= -low / 10:
            z[z <= low / 2] = -np.inf
    return z


def pattern_scale(z: np.ndarray) -> tuple[tuple[float, float], float | None]:
    """An attention pattern's (or its scores') one colour range and centre, for all its heads: scores
    of both signs diverging about 0, probabilities 0 to 1, anything else its finite values' range."""
    if is_signed(z):
        return diverging_range(z), 0.0
    lo, hi = finite_range(z)
    return ((0.0, 1.0) if lo >= 0 and hi <= 1 else (lo, hi)), None


def sample_scale(heads: np.ndarray, label: str) -> tuple[tuple[float, float], float | None, str]:
    """Attention pictures' one rule, in `plot` and `report` alike: one colour scale per sample, shared by its
    heads (pattern_scale over them), so heads compare within a sample and a sample of large scores does not
    wash out another's; (range, centre, the colour bar's label saying so)."""
    scale, centre = pattern_scale(heads)
    return scale, centre, f"{label} (one scale per sample, shared by its heads)"


def to_rgb(m: np.ndarray, lo: float, hi: float, cmap: object) -> np.ndarray:
    """A map's (H, W, 3) colours in [0, 1] on `cmap` over lo..hi; a non-finite cell NO_VALUE."""
    from matplotlib.colors import to_rgb as rgb_of

    m = np.asarray(m, dtype=np.float64)
    finite = np.isfinite(m)
    rgb = cmap(np.clip((np.where(finite, m, lo) - lo) / max(hi - lo, 1e-300), 0, 1))[..., :3]
    rgb[~finite] = rgb_of(NO_VALUE)
    return rgb


def beyond_range(z: np.ndarray, fixed: tuple[float, float] | None) -> str:
    """The ends of a fixed colour range values lie beyond by more than rounding (a CKA of 1 + 2e-16 is 1;
    minibatch CKA below 0 is not): "min", "max", "both" or "neither", as matplotlib's `extend` takes them."""
    finite = z[np.isfinite(z)]
    if fixed is None or not finite.size:
        return "neither"
    tol = 1e-9 * (fixed[1] - fixed[0])
    below, above = bool(finite.min() < fixed[0] - tol), bool(finite.max() > fixed[1] + tol)
    return "both" if below and above else "min" if below else "max" if above else "neither"
