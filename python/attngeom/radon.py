"""The 2D Radon transform of images and its inverses (Laplace-Radon s.9: the inverse Radon step).

Conventions are scikit-image's, so a user can switch and compare directly:

- an image is (M, N), rows = y; ``circle=True`` (the default) assumes it is zero outside
  the inscribed circle and keeps its size, ``circle=False`` pads it to its diagonal;
- a sinogram has shape (detectors, angles), one column per angle, the rotation axis at
  detector ``detectors // 2``;
- theta is in degrees, default ``np.arange(180)`` for `radon` and ``n_angles`` angles evenly
  spaced on [0, 180) for the inverses.

`radon` equals ``skimage.transform.radon`` to rounding (the projector rotates the image by
bilinear interpolation and sums the rows); `iradon` is filtered backprojection with the
same filters, zero padding to a power of two and final scaling as ``skimage.transform.iradon``;
`iradon_sart` is SART (Andersen-Kak) on the same bilinear projector. The projector, its
exact adjoint, the backprojection and SART run in C++ with OpenMP (over angles for the
projector; over image rows for backprojection; over rays for the SART updates).

Example: ``rec = ag.iradon(ag.radon(ag.shepp_logan_phantom(160)), filter="ramp")``
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import numpy as np

from . import _core
from ._operands import check_finite, check_size, choice, count, flag, operand, real_array, scalar, sequence
from .errors import ResultOverflow

#: The most pixel updates iradon_sart runs: iterations * n_angles * (detectors^2 + 128).
MAX_SART_UPDATES = 2 ** 35

FILTERS = ("ramp", "shepp-logan", "cosine", "hamming", "hann", None)

# The modified Shepp-Logan phantom (Toft): intensity, semi-axes a, b, centre x0, y0 on
# [-1, 1]^2 (y up) and rotation in degrees.
_SHEPP_LOGAN = (
    (1.0, 0.69, 0.92, 0.0, 0.0, 0.0),
    (-0.8, 0.6624, 0.8740, 0.0, -0.0184, 0.0),
    (-0.2, 0.1100, 0.3100, 0.22, 0.0, -18.0),
    (-0.2, 0.1600, 0.4100, -0.22, 0.0, 18.0),
    (0.1, 0.2100, 0.2500, 0.0, 0.35, 0.0),
    (0.1, 0.0460, 0.0460, 0.0, 0.1, 0.0),
    (0.1, 0.0460, 0.0460, 0.0, -0.1, 0.0),
    (0.1, 0.0460, 0.0230, -0.08, -0.605, 0.0),
    (0.1, 0.0230, 0.0230, 0.0, -0.606, 0.0),
    (0.1, 0.0230, 0.0460, 0.06, -0.605, 0.0),
)


def shepp_logan_phantom(size: int = 160, *, render: int = 400) -> np.ndarray:
    """The modified Shepp-Logan phantom (Toft's intensities) from its ellipse table.

    The test image of the tomography picture of Laplace-Radon s.9 and s.6.2. The ellipses are
    point-sampled on a ``render x render`` grid spanning [-1, 1]^2 (at 400 this is the
    standard test image, the one scikit-image ships as a PNG, without its 8-bit rounding); a
    smaller `size` is obtained as scikit-image's ``rescale`` does it: a Gaussian anti-aliasing
    filter (sigma = (render / size - 1) / 2 pixels, truncated at 4 sigma) followed by bilinear
    interpolation at the centre-aligned positions. Values lie in [0, 1]: 0 outside, 1 on the
    skull, 0.2 brain, 0 ventricles, 0.3-0.4 spots.

    Parameters
    ----------
    size : int, default 160
        Side of the returned image in pixels.
    render : int, default 400
        Side of the grid the ellipses are sampled on.

    Returns
    -------
    ndarray, shape (size, size)
        float64, zero outside the inscribed circle.

    Examples
    --------
    >>> img = ag.shepp_logan_phantom(64)
    >>> img.shape, float(img.max()) <= 1.0
    ((64, 64), True)
    """
    size, render = count("size", size, 2), count("render", render, 2)
    check_size("render", render * render)
    check_size("size", size * size)
    c = np.linspace(-1.0, 1.0, render)
    x, y = np.meshgrid(c, -c)  # x to the right, y up (row 0 at the top)
    img = np.zeros((render, render))
    for value, a, b, x0, y0, phi in _SHEPP_LOGAN:
        t = math.radians(phi)
        xr = (x - x0) * math.cos(t) + (y - y0) * math.sin(t)
        yr = -(x - x0) * math.sin(t) + (y - y0) * math.cos(t)
        img[(xr / a) ** 2 + (yr / b) ** 2 <= 1] += value
    img = np.round(img, 12) + 0.0  # 1 - 0.8 - 0.2 is 0, not -5.6e-17
    if size == render:
        return img
    scale = render / size
    sigma = max(0.0, (scale - 1) / 2)
    if sigma > 0:
        radius = int(4.0 * sigma + 0.5)
        g = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
        g /= g.sum()
        # "same"-size convolution centred on the kernel, also when the kernel (2 radius + 1 taps)
        # is longer than the image (size < render / 8), where np.convolve's "same" is not.
        same = lambda a: np.convolve(a, g, mode="full")[radius:radius + a.size]  # noqa: E731
        img = np.apply_along_axis(same, 0, img)
        img = np.apply_along_axis(same, 1, img)
    # bilinear resampling at the centre-aligned source positions, as one matrix per axis
    pos = np.clip((np.arange(size) + 0.5) * scale - 0.5, 0, render - 1)
    lo = np.minimum(np.floor(pos).astype(int), render - 2)
    w = pos - lo
    W = np.zeros((size, render))
    W[np.arange(size), lo] = 1 - w
    W[np.arange(size), lo + 1] += w
    out = np.clip(W @ img @ W.T, img.min(), img.max())  # as rescale's clip: no rounding below 0
    out[~circle_mask(size)] = 0.0
    return out


def _theta(theta, n_angles: Optional[int], default_full: bool) -> np.ndarray:
    if theta is None:
        if default_full:
            return np.arange(180, dtype=np.float64)
        return np.linspace(0.0, 180.0, n_angles, endpoint=False)
    t = operand("theta", theta, "(n_angles,)", min_ndim=0, dtype=np.float64).ravel()
    if n_angles is not None and t.size != n_angles:
        raise ValueError(f"theta must have one angle per sinogram column ({n_angles}), got {t.size}")
    return t


def circle_mask(size: int) -> np.ndarray:
    """The reconstruction circle of `radon` / `iradon` with ``circle=True``.

    Laplace-Radon s.9 (the tomography conventions of scikit-image).

    Parameters
    ----------
    size : int
        Image side.

    Returns
    -------
    ndarray of bool, shape (size, size)
        Pixels within radius size // 2 of the centre (size // 2, size // 2).

    Examples
    --------
    >>> ag.circle_mask(3).astype(int)
    array([[0, 1, 0],
           [1, 1, 1],
           [0, 1, 0]])
    """
    size = count("size", size)
    check_size("size", size * size, itemsize=1)
    r = size // 2
    i = np.arange(size) - r
    return i[:, None] ** 2 + i[None, :] ** 2 <= r * r


def _linear(func):
    """For a map linear in its first argument: an argument whose largest entry lies beyond
    2^(+-256) (2^(+-32) in float32 and float16: a quarter of the dtype's exponent range) is
    scaled by a power of two first (exact, in the argument's own float dtype) and the result
    scaled back, so the filtering and the sums neither overflow nor lose digits to
    subnormals; a result beyond the float range raises ResultOverflow naming the argument."""

    @functools.wraps(func)
    def inner(x, *args, **kwargs):
        try:
            a = np.asarray(x) if isinstance(x, np.ndarray) or np.ndim(x) else None
        except ValueError:  # a ragged list: the function's own checks name it
            a = None
        if a is None or a.dtype.kind not in "fiu" or a.size == 0 or not np.all(np.isfinite(a)):
            return func(x, *args, **kwargs)  # the function's own checks speak
        if a.dtype.kind != "f":
            a = a.astype(np.float64)
        e = int(np.frexp(np.max(np.abs(a)))[1]) if np.any(a) else 0
        if abs(e) <= np.finfo(a.dtype).maxexp // 4:
            return func(x, *args, **kwargs)
        out = func(np.ldexp(a, -e).astype(a.dtype), *args, **kwargs)
        with np.errstate(over="ignore", under="ignore"):
            out = np.ldexp(out, e)
        if not np.all(np.isfinite(out)):
            raise ResultOverflow(f"{func.__name__}: the result is beyond the float range for these inputs: "
                                 f"{func.__code__.co_varnames[0]} has entries up to {np.max(np.abs(a)):.3g}; "
                                 "rescale it")
        return out

    return inner


@_linear
def radon(image, theta=None, *, circle: bool = True) -> np.ndarray:
    """Radon transform (sinogram) of a 2D image, in scikit-image's geometry.

    The image-space counterpart of Laplace-Radon eq. 6 (line integrals along each angle).

    Parameters
    ----------
    image : array_like, shape (M, N)
        The image.
    theta : array_like, shape (n_angles,), optional
        Projection angles in degrees; default ``np.arange(180)``.
    circle : bool, default True
        True: the image is zero outside its inscribed circle (checked: ValueError otherwise);
        a non-square image is cropped to its central square. False: the image is padded to
        its diagonal so every ray through it is kept.

    Returns
    -------
    sinogram : ndarray, shape (detectors, n_angles)
        float32 for float32 input, else float64; detectors = min(M, N) with circle, the
        padded diagonal (as scikit-image) otherwise.

    Examples
    --------
    >>> img = ag.shepp_logan_phantom(64)
    >>> sino = ag.radon(img, np.linspace(0, 180, 90, endpoint=False))
    >>> sino.shape
    (64, 90)
    """
    img = operand("image", image, "(M, N)", ndim=2, contiguous=True)
    th = _theta(theta, None, True)
    circle = flag("circle", circle)
    if circle:
        m = min(img.shape)
        starts = [int(math.ceil((s - m) / 2)) for s in img.shape]
        img = np.ascontiguousarray(img[starts[0]:starts[0] + m, starts[1]:starts[1] + m])
        outside = ~circle_mask(m)
        if np.any(img[outside] != 0):
            raise ValueError("image must be zero outside the reconstruction circle when circle=True "
                             "(use circle=False, or multiply by ag.circle_mask(size))")
    else:
        diagonal = math.sqrt(2) * max(img.shape)
        pad = [int(math.ceil(diagonal - s)) for s in img.shape]
        before = [(s + p) // 2 - s // 2 for s, p in zip(img.shape, pad)]
        img = np.ascontiguousarray(np.pad(img, [(b, p - b) for b, p in zip(before, pad)]))
    return _core.radon_forward(img, np.deg2rad(th))


@_linear
def radon_adjoint(sinogram, theta=None) -> np.ndarray:
    """The exact transpose of `radon` (circle=True) for a square image of side `detectors`.

    Unfiltered backprojection by bilinear splatting (Laplace-Radon s.9):
    ``sum(radon(x) * s) == sum(x * radon_adjoint(s))``.

    Parameters
    ----------
    sinogram : array_like, shape (detectors, n_angles)
        The sinogram.
    theta : array_like, shape (n_angles,), optional
        Angles in degrees; default ``np.arange(180)``.

    Returns
    -------
    ndarray, shape (detectors, detectors)
        The backprojected image.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.random((32, 32)) * ag.circle_mask(32)
    >>> s = rng.random((32, 180))
    >>> bool(np.isclose(np.sum(ag.radon(x) * s), np.sum(x * ag.radon_adjoint(s))))
    True
    """
    s = operand("sinogram", sinogram, "(detectors, angles)", ndim=2, contiguous=True)
    th = _theta(theta, s.shape[1], False)
    return _core.radon_adjoint(s, np.deg2rad(th))


def fourier_filter(size: int, filter: Optional[str] = "ramp") -> np.ndarray:
    """The FBP frequency response of scikit-image's iradon.

    The ramp built from the Fourier transform of its spatial form (Kak-Slaney ch. 3 eq. 61),
    optionally windowed; used by :func:`iradon` (Laplace-Radon s.9, the inverse Radon step).

    Parameters
    ----------
    size : int
        Number of frequencies (the padded detector count).
    filter : {"ramp", "shepp-logan", "cosine", "hamming", "hann"} or None, default "ramp"
        Window; None gives no filter (all ones).

    Returns
    -------
    ndarray, shape (size,)
        The frequency response.

    Examples
    --------
    >>> f = ag.fourier_filter(8)
    >>> f.shape, bool(f[0] < f[4])  # the ramp rises from zero frequency
    ((8,), True)
    """
    choice("filter", filter, FILTERS)
    size = count("size", size, 2)
    if size % 2:
        raise ValueError(f"size must be even (the padded projection length), got {size}")
    check_size("size", size * 4)  # four arrays of its length
    n = np.concatenate((np.arange(1, size / 2 + 1, 2, dtype=int), np.arange(size / 2 - 1, 0, -2, dtype=int)))
    f = np.zeros(size)
    f[0] = 0.25
    f[1::2] = -1 / (np.pi * n) ** 2
    response = 2 * np.real(np.fft.fft(f))
    if filter == "shepp-logan":
        omega = np.pi * np.fft.fftfreq(size)[1:]
        response[1:] *= np.sin(omega) / omega
    elif filter == "cosine":
        response *= np.fft.fftshift(np.sin(np.linspace(0, np.pi, size, endpoint=False)))
    elif filter == "hamming":
        response *= np.fft.fftshift(np.hamming(size))
    elif filter == "hann":
        response *= np.fft.fftshift(np.hanning(size))
    elif filter is None:
        response[:] = 1
    return response


def _circle_to_square(s: np.ndarray) -> np.ndarray:
    diagonal = int(math.ceil(math.sqrt(2) * s.shape[0]))
    pad = diagonal - s.shape[0]
    before = diagonal // 2 - s.shape[0] // 2
    return np.pad(s, ((before, pad - before), (0, 0)))


@_linear
def iradon(sinogram, theta=None, *, output_size: Optional[int] = None, filter: Optional[str] = "ramp",
           circle: bool = True) -> np.ndarray:
    """Filtered backprojection, as ``skimage.transform.iradon`` (linear interpolation).

    The inverse Radon transform of Laplace-Radon s.9.

    Parameters
    ----------
    sinogram : array_like, shape (detectors, n_angles)
        The sinogram.
    theta : array_like, shape (n_angles,), optional
        Angles in degrees; default n_angles angles evenly spaced on [0, 180).
    output_size : int, optional
        Image side; default detectors (circle) or floor(detectors / sqrt(2)).
    filter : {"ramp", "shepp-logan", "cosine", "hamming", "hann"} or None, default "ramp"
        Frequency window of :func:`fourier_filter`.
    circle : bool, default True
        Zero the reconstruction outside the inscribed circle.

    Returns
    -------
    ndarray, shape (output_size, output_size)
        The reconstruction, in the sinogram's float dtype.

    Examples
    --------
    >>> img = ag.shepp_logan_phantom(64)
    >>> theta = np.linspace(0, 180, 128, endpoint=False)
    >>> rec = ag.iradon(ag.radon(img, theta), theta)
    >>> bool(ag.rms_error(rec, img) < 0.1)
    True
    """
    s = operand("sinogram", sinogram, "(detectors, angles)", ndim=2, contiguous=True)
    th = _theta(theta, s.shape[1], False)
    choice("filter", filter, FILTERS)
    circle = flag("circle", circle)
    detectors = s.shape[0]
    if detectors < 2:
        raise ValueError(f"sinogram must have at least 2 detectors, got shape {s.shape}")
    if output_size is None:
        output_size = detectors if circle else int(math.floor(math.sqrt(detectors ** 2 / 2.0)))
    output_size = count("output_size", output_size)
    check_size("output_size", output_size * output_size)
    work = _circle_to_square(s) if circle else s
    size = max(64, int(2 ** math.ceil(math.log2(2 * work.shape[0]))))
    padded = np.zeros((size, work.shape[1]))
    padded[: work.shape[0]] = work
    filtered = np.real(np.fft.ifft(np.fft.fft(padded, axis=0) * fourier_filter(size, filter)[:, None], axis=0))
    filtered = np.ascontiguousarray(filtered[: work.shape[0]], dtype=s.dtype)
    rec = _core.backproject(filtered, np.deg2rad(th), output_size, bool(circle))
    return rec * np.asarray(np.pi / (2 * th.size), dtype=s.dtype)


def golden_ratio_order(theta) -> np.ndarray:
    """Indices into theta (degrees) visiting the angles in Kohler's golden-ratio order, so
    consecutive SART updates use nearly uncorrelated projections. The scheme of scikit-image's
    iradon_sart (the same order for evenly spaced angles; distances here are taken on the
    circle of angles mod 180, so irregular angle sets may be visited in a different order)."""
    th = real_array("theta", theta).astype(np.float64)
    check_finite("theta", th)
    remaining = list(np.argsort(th))
    angle = th[remaining[0]]
    order = [remaining.pop(0)]
    step = 180.0 / ((1 + math.sqrt(5)) / 2) ** 2
    while remaining:
        rem = th[remaining]
        angle = (angle + step) % 180.0
        above = int(np.searchsorted(rem, angle))
        below = above - 1
        above %= len(remaining)

        def dist(a):  # distance on the circle of angles mod 180
            d = abs(angle - a) % 180.0
            return min(d, 180.0 - d)

        if dist(rem[below]) < dist(rem[above]):
            order.append(remaining.pop(below))
        else:
            order.append(remaining.pop(above))
    return np.asarray(order, dtype=np.int64)


def iradon_sart(sinogram, theta=None, *, iterations: int = 1, image=None, relaxation: float = 1.0,
                clip: Optional[Sequence[float]] = None) -> np.ndarray:
    """Simultaneous algebraic reconstruction (SART, Andersen-Kak) on the `radon` projector.

    For each angle a in golden-ratio order, with A_a the projector of that angle restricted
    to the reconstruction circle, ``x <- x + relaxation * A_a^T ((b_a - A_a x) / A_a 1) / (A_a^T 1)``;
    `iterations` sweeps over all angles (Laplace-Radon s.9, limited-angle reconstructions).

    Parameters
    ----------
    sinogram : array_like, shape (detectors, n_angles)
        The sinogram; the image is (detectors, detectors).
    theta : array_like, shape (n_angles,), optional
        Angles in degrees; default evenly spaced on [0, 180).
    iterations : int, default 1
        Sweeps over all angles. A run of more than MAX_SART_UPDATES (2^35) pixel updates,
        counted as iterations * n_angles * (detectors^2 + 128) (the 128 stands for each
        angle's fixed cost), is refused before it starts (ValueError naming iterations).
    image : array_like, shape (detectors, detectors), optional
        Initial estimate (default zeros).
    relaxation : float in (0, 2), default 1.0
        Step size (1 is plain SART). Smaller values converge more slowly but damp noise
        (scikit-image's update is scaled differently: its 0.15 is not comparable).
    clip : tuple of float (lo, hi), optional
        Clamps the whole estimate after each angle (as scikit-image).

    Returns
    -------
    ndarray, shape (detectors, detectors)
        The reconstruction, in the sinogram's float dtype; zero outside the circle.

    Examples
    --------
    >>> img = ag.shepp_logan_phantom(32)
    >>> theta = np.linspace(0, 180, 60, endpoint=False)
    >>> rec = ag.iradon_sart(ag.radon(img, theta), theta, iterations=2)
    >>> bool(ag.rms_error(rec, img) < 0.1)
    True
    """
    s = operand("sinogram", sinogram, "(detectors, angles)", ndim=2, contiguous=True)
    th = _theta(theta, s.shape[1], False)
    n = s.shape[0]
    iterations = count("iterations", iterations)
    relaxation = scalar("relaxation", relaxation, positive=True)
    if relaxation >= 2:
        raise ValueError(f"relaxation must lie in (0, 2), got {relaxation}")
    if image is None:
        x = np.zeros((n, n), dtype=s.dtype)
    else:
        x = real_array("image", image)
        if x.shape != (n, n):
            raise ValueError(f"image must have shape ({n}, {n}) to match the sinogram, got {x.shape}")
        check_finite("image", x)
        with np.errstate(over="ignore"):
            x = np.array(x, dtype=s.dtype, order="C")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"image has entries beyond the range of the sinogram's dtype {s.dtype} (the "
                             "reconstruction's): rescale it or pass a float64 sinogram")
    updates = iterations * th.size * (n * n + 128)
    if updates > MAX_SART_UPDATES:
        raise ValueError(f"iterations = {iterations} over {th.size} angles of a {n} x {n} image ask for {updates:.3g} "
                         f"pixel updates, beyond the limit of MAX_SART_UPDATES = 2^35: lower iterations")
    lo, hi, use_clip = 0.0, 0.0, clip is not None
    if use_clip:
        pair = sequence("clip", list(clip) if isinstance(clip, np.ndarray) and clip.ndim == 1 else clip, length=2)
        if any(isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, float, np.integer, np.floating))
               for c in pair):
            raise TypeError(f"clip must be a pair of real numbers (lo, hi), got {clip!r}")
        lo, hi = float(pair[0]), float(pair[1])
        if not lo <= hi:  # NaN fails too; infinite bounds are allowed (one-sided clipping)
            raise ValueError(f"clip must be a pair (lo, hi) with lo <= hi, got {clip!r}")
    mask = circle_mask(n).astype(s.dtype)
    x *= mask
    # SART is homogeneous of degree 1 in (sinogram, image, clip): entries beyond a quarter of
    # the exponent range are scaled by a power of two (exact) so the residuals neither
    # overflow nor fall to subnormals, and the result is scaled back.
    big = max([float(np.max(np.abs(s))), float(np.max(np.abs(x)))] + [abs(c) for c in (lo, hi) if math.isfinite(c)])
    e = int(np.frexp(big)[1]) if big > 0 else 0
    if abs(e) <= np.finfo(s.dtype).maxexp // 4:
        e = 0
    s, x = np.ldexp(s, -e).astype(s.dtype), np.ldexp(x, -e).astype(s.dtype)
    lo, hi = math.ldexp(lo, -e), math.ldexp(hi, -e)
    out = _core.sart(s, np.deg2rad(th), golden_ratio_order(th), mask, x, iterations, relaxation, use_clip, lo, hi)
    if e:
        with np.errstate(over="ignore", under="ignore"):
            out = np.ldexp(out, e).astype(s.dtype)
        if not np.all(np.isfinite(out)):
            raise ResultOverflow(f"iradon_sart: the reconstruction is beyond the float range for these inputs: "
                                 f"sinogram has entries up to {big:.3g}; rescale it")
    return out


def rms_error(reconstruction, image) -> float:
    """Root-mean-square difference sqrt(mean((reconstruction - image)^2)) over all pixels.

    The error measure of the tomography tests (Laplace-Radon s.9 reconstructions).

    Parameters
    ----------
    reconstruction : array_like
        Estimate.
    image : array_like
        Reference, same shape.

    Returns
    -------
    float
        The RMS error.

    Examples
    --------
    >>> ag.rms_error(np.ones((2, 2)), np.zeros((2, 2)))
    1.0
    """
    r, i = (real_array(name, a).astype(np.float64) for name, a in (("reconstruction", reconstruction), ("image", image)))
    check_finite("reconstruction", r)
    check_finite("image", i)
    if r.shape != i.shape:
        raise ValueError(f"reconstruction {r.shape} and image {i.shape} must have the same shape")
    with np.errstate(over="ignore", invalid="ignore"):
        d = r - i
    big = float(np.max(np.abs(d))) if d.size else 0.0
    if not math.isfinite(big):
        raise ValueError(f"reconstruction - image overflows float64 (entries up to "
                         f"{max(np.max(np.abs(r)), np.max(np.abs(i))):.3g}): rescale them")
    return big * float(np.sqrt(np.mean((d / big) ** 2))) if big > 0 else 0.0  # scaled: no square overflows


def limited_angle(theta, wedge: float, *, center: float = 90.0) -> np.ndarray:
    """Mask of the angles outside a missing wedge: limited-angle tomography.

    The image-space analogue of the tilt null span(U)^perp (Laplace-Radon s.6.2).

    Parameters
    ----------
    theta : array_like, shape (n_angles,)
        Angles in degrees (taken mod 180).
    wedge : float
        Width of the missing wedge in degrees.
    center : float, default 90.0
        Centre of the wedge in degrees.

    Returns
    -------
    ndarray of bool, shape (n_angles,)
        True for the angles that are kept.

    Examples
    --------
    >>> ag.limited_angle(np.array([0.0, 45.0, 90.0, 135.0]), 60)
    array([ True,  True, False,  True])
    """
    th = real_array("theta", theta).astype(np.float64)
    check_finite("theta", th)
    wedge = scalar("wedge", wedge)
    if not 0 <= wedge < 180:
        raise ValueError(f"wedge must lie in [0, 180) degrees, got {wedge}")
    center = scalar("center", center)
    d = np.abs((th - center + 90.0) % 180.0 - 90.0)
    return d >= wedge / 2
