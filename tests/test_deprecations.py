"""Renamed public names (docs/architecture.md, "Glossary"): every old name still works for one
release, warns DeprecationWarning naming the new one at the caller's line, and gives the same
result as the new name, which does not warn. Then the mechanism itself (attngeom._deprecation)."""
import copy
import dataclasses
import functools
import subprocess
import tempfile
import sys
import types
import warnings

import numpy as np
import pytest

import attngeom as ag
from attngeom import _deprecation, circuits
from attngeom.laplace_radon import ridge_attention
from attngeom.models import BertOutput, Forward, HeadReport, HeadView, RouterStatistics, WeightSpectra, load_model

RNG = np.random.default_rng(5)
Q, K, V = RNG.standard_normal((3, 2, 6, 4))
P = RNG.random((5, 5))
P /= P.sum(-1, keepdims=True)
W, X = RNG.standard_normal((4, 4)), RNG.standard_normal((5, 4))
W1, W2 = RNG.standard_normal((4, 7)), RNG.standard_normal((7, 4))
U, TAU = ag.tilt_radius(Q)
G = RNG.standard_normal((2, 5, 4))  # router logits
R = ag.topk_router(G[0], 2)
STATS = RouterStatistics(G, ag.topk_router(G, 2), np.ones((2, 4), int), np.ones((2, 4)) / 4,
                         [ag.router_gram(r) for r in ag.topk_router(G, 2)], np.ones((2, 4)), 0.5, np.ones(2),
                         np.ones(2), 2)
BERT = BertOutput(RNG.standard_normal((3, 5, 4)), np.stack([P, P.T]))
FORWARD = Forward(None, scale=np.ones(2), positions=np.arange(5), attention_mask=np.ones(5, bool),
                  resid_pre=RNG.standard_normal((2, 5, 4)), ln_final=RNG.standard_normal((5, 4)),
                  attn_in=RNG.standard_normal((2, 5, 4)), pattern=np.stack([np.stack([P, P.T])] * 2))
SPECTRA = WeightSpectra(np.ones((1, 2, 3)), np.ones((1, 2, 3)), np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2, 3)),
                        np.ones((1, 2, 3)), routing=np.stack([np.stack([P, P.T])]))
REPORT = HeadReport({}, None, [(0, 1)], routing={(0, 1): P.T}, text_routing=[np.stack([np.stack([P, P.T])])])
VIEW = HeadView([str(i) for i in range(5)], 0, 5, np.stack([np.stack([P, P.T])]).astype(np.float32),
                np.zeros((1, 2, 5), np.float32), {}, {}, False, "five tokens")


@functools.lru_cache(maxsize=None)
def _model():
    """A random two-layer Llama-layout checkpoint, loaded (for the renamed keep names)."""
    from checkpoints import random_checkpoint

    return load_model(random_checkpoint("llama", tempfile.mkdtemp()))


def _keep(*names):
    return _model().forward(np.arange(6), keep=names)

# (old call, new call, the new name the warning must give)
RENAMED = {
    "softmax_attention(return_weights=)": (lambda: ag.softmax_attention(Q, K, V, return_weights=True),
                                           lambda: ag.softmax_attention(Q, K, V, return_routing=True),
                                           "return_routing"),
    "kernel_attention(return_weights=)": (lambda: ag.kernel_attention(Q, K, V, kernel="cauchy", return_weights=True),
                                          lambda: ag.kernel_attention(Q, K, V, kernel="cauchy", return_routing=True),
                                          "return_routing"),
    "laplace_radon_attention(return_weights=)": (
        lambda: ag.laplace_radon_attention(U, TAU, K, V, return_weights=True, return_log_partition=True),
        lambda: ag.laplace_radon_attention(U, TAU, K, V, return_routing=True, return_log_partition=True),
        "return_routing"),
    "ridge_attention(return_weights=)": (
        lambda: ridge_attention(U, TAU, K, V, kernel="exp", params={}, return_weights=True),
        lambda: ridge_attention(U, TAU, K, V, kernel="exp", params={}, return_routing=True),
        "return_routing"),
    "projection_attention(return_weights=)": (lambda: ag.projection_attention(Q, K, V, return_weights=True),
                                              lambda: ag.projection_attention(Q, K, V, return_routing=True),
                                              "return_routing"),
    "whitened_attention(return_weights=)": (
        lambda: ag.whitened_attention(X[None], W, W, np.eye(4), 0.5 * np.eye(4), return_weights=True),
        lambda: ag.whitened_attention(X[None], W, W, np.eye(4), 0.5 * np.eye(4), return_routing=True),
        "return_routing"),
    "AttentionStats.from_weights": (lambda: ag.AttentionStats.from_weights(P, causal=True),
                                    lambda: ag.AttentionStats.from_routing(P, causal=True), "from_routing"),
    "mlp_key_value(activation='gelu')": (lambda: ag.mlp_key_value(X, W1, W2, activation="gelu"),
                                         lambda: ag.mlp_key_value(X, W1, W2, activation="gelu_tanh"), "gelu_tanh"),
    "mlp_key_value(..., 'gelu')": (lambda: ag.mlp_key_value(X, W1, W2, "gelu"), lambda: ag.mlp_key_value(X, W1, W2),
                                   "gelu_tanh"),
    "head_operator(P=)": (lambda: ag.head_operator(P=P, W_OV=W, X=X), lambda: ag.head_operator(routing=P, W_OV=W, X=X),
                          "routing"),
    "virtual_head(P1=, P2=)": (lambda: ag.virtual_head(P1=P, W_OV1=W, P2=P.T, W_OV2=W),
                               lambda: ag.virtual_head(routing1=P, W_OV1=W, routing2=P.T, W_OV2=W), "routing[12]"),
    "routing_nulls(P=)": (lambda: ag.routing_nulls(P=P), lambda: ag.routing_nulls(routing=P), "routing"),
    "topk_routing": (lambda: ag.topk_routing(G, 2), lambda: ag.topk_router(G, 2), "topk_router"),
    "circuits.topk_routing": (lambda: circuits.topk_routing(G, 2), lambda: circuits.topk_router(G, 2), "topk_router"),
    "topk_router(gate_logits=)": (lambda: ag.topk_router(gate_logits=G, k=2),
                                  lambda: ag.topk_router(router_logits=G, k=2), "router_logits"),
    "routing_gram": (lambda: ag.routing_gram(R), lambda: ag.router_gram(R), "router_gram"),
    "circuits.routing_gram": (lambda: circuits.routing_gram(R), lambda: circuits.router_gram(R), "router_gram"),
    "RoutingGram": (lambda: ag.RoutingGram(P, P[0], P[1], 0.5, 0.1), lambda: ag.RouterGram(P, P[0], P[1], 0.5, 0.1),
                    "RouterGram"),
    "RouterStatistics.routing": (lambda: STATS.routing, lambda: STATS.router_matrix, "router_matrix"),
    "BertOutput.attention": (lambda: BERT.attention, lambda: BERT.routing, "routing"),
    "Forward.attentions": (lambda: FORWARD.attentions, lambda: FORWARD.pattern, "pattern"),
    "WeightSpectra.attentions": (lambda: SPECTRA.attentions, lambda: SPECTRA.routing, "routing"),
    "HeadReport.attention": (lambda: REPORT.attention, lambda: REPORT.text_routing, "text_routing"),
    "HeadView.weights": (lambda: VIEW.weights, lambda: VIEW.routing, "routing"),
    "Forward.attention_inputs": (lambda: FORWARD.attention_inputs, lambda: FORWARD.attn_in, "attn_in"),
    "Forward.hidden_states": (lambda: FORWARD.hidden_states,
                              lambda: np.concatenate([FORWARD.resid_pre, FORWARD.ln_final[None]]),
                              r"resid_pre \(and ln_final for the output\)"),
    "Model.forward(keep='attentions')": (lambda: _keep("attentions").pattern, lambda: _keep("pattern").pattern,
                                         "pattern"),
    "Model.forward(keep='attention_inputs')": (lambda: _keep("attention_inputs").attn_in,
                                               lambda: _keep("attn_in").attn_in, "attn_in"),
    "Model.forward(keep='hidden_states')": (lambda: (_keep("hidden_states").resid_pre, _keep("hidden_states").ln_final),
                                            lambda: (_keep("resid_pre").resid_pre, _keep("ln_final").ln_final),
                                            "resid_pre and ln_final"),
}


def leaves(result):
    """The arrays of a result (arrays, tuples, dataclasses), in order."""
    if isinstance(result, (tuple, list)):
        return [x for r in result for x in leaves(r)]
    if dataclasses.is_dataclass(result):
        return [x for f in dataclasses.fields(result) for x in leaves(getattr(result, f.name))]
    if isinstance(result, ag.Subspace):
        return [result.basis()]
    return [np.asarray(result)]


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_old_name_warns_naming_the_new_one_and_gives_the_same_result(name):
    old_call, new_call, new_name = RENAMED[name]
    with pytest.warns(DeprecationWarning, match=rf"is deprecated, use '{new_name}'") as record:
        old = old_call()
    assert all(w.filename == __file__ for w in record if issubclass(w.category, DeprecationWarning))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name does not warn, nor does anything it calls
        new = new_call()
    old_leaves, new_leaves = leaves(old), leaves(new)
    assert len(old_leaves) == len(new_leaves)
    for a, b in zip(old_leaves, new_leaves):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("result, old, new", [(SPECTRA, "attentions", "routing"), (REPORT, "attention", "text_routing"),
                                              (VIEW, "weights", "routing")])
def test_renamed_field_of_an_analysis_result_is_the_new_one(result, old, new):
    """The old field of WeightSpectra, HeadReport (dataclasses) and HeadView (a plain class) is
    the new field's object, read and written; the constructor and dataclasses.fields know the
    new name only."""
    result = copy.copy(result)
    name = type(result).__name__
    with pytest.warns(DeprecationWarning, match=f"{name}: the field '{old}' is deprecated, use '{new}'"):
        assert getattr(result, old) is getattr(result, new)
    replacement = np.zeros((1, 2, 5, 5))
    with pytest.warns(DeprecationWarning, match=f"use '{new}'"):
        setattr(result, old, replacement)
    assert getattr(result, new) is replacement
    assert old not in vars(result)
    if dataclasses.is_dataclass(result):
        fields = {f.name: f for f in dataclasses.fields(result)}
        assert old not in fields and not fields[new].repr
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of the result reads its old name
        assert old not in repr(result)


def test_attention_heatmap_old_keyword():
    pytest.importorskip("matplotlib")
    with pytest.warns(DeprecationWarning, match="use 'routing'"):
        old = ag.plotting.attention_heatmap(P=P)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = ag.plotting.attention_heatmap(routing=P)
    np.testing.assert_array_equal(old.axes[0].images[0].get_array(), new.axes[0].images[0].get_array())


def test_deprecated_method_names_the_argument_as_passed():
    """Errors of an old name name its own argument (the caller's spelling)."""
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="weights must have shape"):
        ag.AttentionStats.from_weights(np.ones(3))
    with pytest.raises(ValueError, match="routing must have shape"):
        ag.AttentionStats.from_routing(np.ones(3))


def test_internal_calls_use_the_new_names():
    """The top-level functions that compute a routing matrix on the way do not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ag.head_diagnostics(RNG.standard_normal((2, 4, 3)), RNG.standard_normal((2, 4, 3)),
                            x=RNG.standard_normal((6, 4)))
        ag.kernel_attention(Q, K, V, kernel="gaussian", return_routing=True, return_stats=True)
        ag.laplace_radon_attention(U, TAU, K, V, return_routing=True, return_stats=True)


def test_renamed_names_import_from_where_they_were():
    with pytest.warns(DeprecationWarning, match="attngeom: the name 'topk_routing' is deprecated, use 'topk_router'"):
        from attngeom import topk_routing
    assert topk_routing is ag.topk_router
    with pytest.warns(DeprecationWarning, match="attngeom.circuits: the name 'RoutingGram' is deprecated, use 'Router"):
        from attngeom.circuits import RoutingGram
    assert RoutingGram is ag.RouterGram
    assert not {"topk_routing", "routing_gram", "RoutingGram"} & set(ag.__all__)


def test_importing_the_package_is_silent():
    """The package's own code uses only the new names."""
    code = ("import warnings; warnings.filterwarnings('error', '.*is deprecated, use', DeprecationWarning); "
            "import attngeom, attngeom.models, attngeom.experiments")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the mechanism ----------------------------------------------------------------------------


def test_renamed_arguments_refuses_both_names():
    @_deprecation.renamed_arguments(old="new")
    def f(*, new=0):
        return new

    with pytest.warns(DeprecationWarning, match=r"f\(\): the argument 'old' is deprecated, use 'new'"):
        assert f(old=2) == 2
    with pytest.raises(TypeError, match="both 'old'"):
        f(old=1, new=2)


def test_renamed_values_by_position_and_keyword():
    @_deprecation.renamed_values(kind={"old": "new"})
    def f(x, kind="new"):
        return x, kind

    with pytest.warns(DeprecationWarning, match=r"f\(\): kind 'old' is deprecated, use 'new'"):
        assert f(1, "old") == (1, "new")
    with pytest.warns(DeprecationWarning, match="use 'new'"):
        assert f(1, kind="old") == (1, "new")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1) == (1, "new")
        assert f(1, "other")[1] == "other"
        assert f(1, np.array(1.0))[0] == 1  # a non-string value is left to the function's checks


def test_renamed_attributes_of_a_module(monkeypatch):
    module = types.ModuleType("attngeom_renamed_example")
    module.New = object()
    module.__getattr__ = _deprecation.renamed_attributes(module.__name__, Old="New")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.warns(DeprecationWarning, match="attngeom_renamed_example: the name 'Old' is deprecated, use 'New'"):
        assert module.Old is module.New
    with pytest.warns(DeprecationWarning, match="use 'New'"):
        from attngeom_renamed_example import Old  # noqa: F401
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        module.Missing


def test_renamed_field_of_a_result():
    @dataclasses.dataclass
    class Result:
        routing: int
        attentions = _deprecation.renamed_field("routing")

    r = Result(3)
    assert [f.name for f in dataclasses.fields(r)] == ["routing"]
    with pytest.warns(DeprecationWarning, match="Result: the field 'attentions' is deprecated, use 'routing'"):
        assert r.attentions == 3
    with pytest.warns(DeprecationWarning, match="use 'routing'"):
        r.attentions = 4
    assert r.routing == 4
    assert isinstance(Result.attentions, _deprecation.renamed_field)
