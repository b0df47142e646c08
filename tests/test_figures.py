"""Figures a reader can read: the ablation and patching maps have integer layer and head
ticks, labelled axes and a title inside the figure; the per-position profile draws one line
per layer (mean with the heads' range) when there are many heads; the spectra figures say
what E_k is."""
import numpy as np
import pytest

pytest.importorskip("matplotlib")

import attngeom as ag  # noqa: E402
from attngeom.models import HeadEffects  # noqa: E402
from attngeom.models.analysis.effects import PatchingResult  # noqa: E402


def _inside(fig, artist):
    """Whether the artist lies within the figure as drawn (by Agg, as savefig draws it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box, frame = artist.get_window_extent(canvas.get_renderer()), fig.bbox
    return box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1 and box.y0 >= frame.y0 - 1 and box.y1 <= frame.y1 + 1


@pytest.mark.parametrize("shape", [(2, 4), (1, 1), (12, 16)])
def test_ablation_map_ticks_labels_and_title(shape):
    import matplotlib.pyplot as plt

    effects = np.random.default_rng(0).standard_normal(shape)
    fig = HeadEffects(effects, baseline=5.966, metric="loss", mode="mean").plot()
    ax = fig.axes[0]
    for ticks, n in ((ax.get_yticks(), shape[0]), (ax.get_xticks(), shape[1])):
        assert np.all(ticks == np.round(ticks)) and ticks.min() >= 0 and ticks.max() <= n - 1
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == [str(int(t)) for t in ax.get_yticks()[:2]]
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert fig.axes[1].get_ylabel() == "change in loss"
    assert ax.get_title().startswith("mean-ablation effect on loss") and _inside(fig, ax.title)
    for label in (ax.xaxis.label, ax.yaxis.label):
        assert _inside(fig, label)
    plt.close(fig)


def test_patching_map_has_integer_layer_ticks():
    import matplotlib.pyplot as plt

    r = PatchingResult(site="resid_pre", metric="logit_diff", clean=2.0, corrupt=-1.0,
                       restored=np.linspace(-1, 1, 2 * 9).reshape(2, 9))
    fig = r.plot()
    ax = fig.axes[0]
    assert ax.get_yticks().tolist() == [0, 1] and _inside(fig, ax.title)
    plt.close(fig)


def test_profiles_draw_a_line_per_layer_for_many_heads():
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    many = np.log(np.arange(1, 101))[None, None] * rng.uniform(0.3, 1.0, (6, 12, 1))  # MiniLM: 72 heads
    fig = ag.plotting.attention_profiles(many, np.exp(-many))
    left, right = fig.axes[:2]
    assert len(right.lines) == 6 and len(right.collections) == 6  # a mean line and a band per layer
    assert len(left.lines) == 7  # and the uniform-row reference
    np.testing.assert_allclose(right.lines[2].get_ydata()[0], np.exp(-many)[2, :, 0].mean())
    assert any("band" in t.get_text() for t in right.texts)
    few = ag.plotting.attention_profiles(many[:2, :3], np.exp(-many[:2, :3]))  # 6 heads: one line each
    assert len(few.axes[1].lines) == 6 and not few.axes[1].collections
    forced = ag.plotting.attention_profiles(many[:2, :3], np.exp(-many[:2, :3]), per_head=False)
    assert len(forced.axes[1].lines) == 2
    plt.close("all")


def test_spectra_figures_explain_e_k():
    import matplotlib.pyplot as plt

    for fig in (ag.plotting.head_spectrum_pair([3.0, 1.0, 0.5], [2.0, 0.5], "L0H0"),
                ag.plotting.spectrum_with_energy([4.0, 1.0, 0.0])):
        labels = [ax.get_ylabel() for ax in fig.axes]
        energy = [l for l in labels if "E_k" in l]
        assert energy and all("share of" in l and "sigma_i^2" in l and "k largest" in l for l in energy)
        plt.close(fig)
