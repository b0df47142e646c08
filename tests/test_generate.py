"""Model.generate with a key/value cache and Model.to_str_tokens.

NumPy only: on random checkpoints (tests/checkpoints.py) greedy generation equals a loop of
full forward passes taking the argmax of the last logits, and the cached step's logits equal
the full pass's last logits (measured: <= 1.5e-6 relative in float32, <= 2e-15 in float64;
asserted at 1e-5 and 1e-13), Mistral's sliding window (4) included with sequences longer than
it. Against transformers: greedy generate equals ``model.generate(do_sample=False)`` token for
token on a random GPT-2, a grouped-query Llama, Mistral (sliding window), Mixtral and DeepSeek-V2
(multi-head latent attention). Bad arguments are one-line ValueErrors naming the argument.
"""
import numpy as np
import pytest

from attngeom.models import head_view, load_model
from attngeom.models.nn.generate import KVCache, next_tokens
from checkpoints import random_checkpoint, with_tokenizer

LAYOUTS = ["gpt2", "llama", "mistral", "qwen2", "qwen3"]
PROMPT = np.array([3, 14, 15, 92, 65, 35])
N_NEW = 8  # 14 tokens in all: within GPT-2's 16 positions, beyond Mistral's window of 4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {layout: load_model(random_checkpoint(layout, tmp_path_factory.mktemp(layout))) for layout in LAYOUTS}


def _greedy_by_full_passes(model, prompt, n_new, dtype):
    seq = list(prompt)
    last = []
    for _ in range(n_new):
        logits = model.forward(np.array(seq), dtype=dtype, keep=("logits",)).logits[-1]
        last.append(logits)
        seq.append(int(np.argmax(logits)))
    return np.array(seq), last


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-13)])
def test_greedy_equals_full_passes(models, layout, dtype, rtol):
    model = models[layout]
    want, full = _greedy_by_full_passes(model, PROMPT, N_NEW, dtype)
    got = model.generate(PROMPT, N_NEW, dtype=dtype)
    assert got.shape == (PROMPT.size + N_NEW,) and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    # the cached step's logits against the full pass's last logits, token by token
    cache = KVCache(model.n_layers, PROMPT.size + N_NEW)
    logits = model.decoder.step(PROMPT[None], cache, dtype)
    for t in range(N_NEW):
        assert logits.dtype == dtype
        assert np.abs(logits[0] - full[t]).max() <= rtol * np.abs(full[t]).max()
        logits = model.decoder.step(want[None, PROMPT.size + t:PROMPT.size + t + 1], cache, dtype)
    assert cache.length == PROMPT.size + N_NEW


def test_batch_equals_each_sequence(models):
    model = models["mistral"]
    prompts = np.array([PROMPT, PROMPT[::-1]])
    got = model.generate(prompts, 5)
    assert got.shape == (2, PROMPT.size + 5)
    for row, prompt in zip(got, prompts):
        np.testing.assert_array_equal(row, model.generate(prompt, 5))
    np.testing.assert_array_equal(model.generate(prompts, 5, attention_mask=np.ones(prompts.shape)), got)


def test_sampling_is_seeded(models):
    model = models["llama"]
    a = model.generate(PROMPT, 12, temperature=1.5, seed=1)
    np.testing.assert_array_equal(a, model.generate(PROMPT, 12, temperature=1.5, seed=1))
    assert not np.array_equal(a, model.generate(PROMPT, 12, temperature=1.5, seed=2))
    np.testing.assert_array_equal(a[:PROMPT.size], PROMPT)


def test_next_tokens():
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [2.0, 0.0, 0.0, 2.0]])
    np.testing.assert_array_equal(next_tokens(logits, 0.0, None), [1, 0])  # ties to the lowest id
    # a low temperature is (almost surely) the argmax; frequencies follow softmax(logits / T)
    rng = np.random.default_rng(0)
    draws = np.array([next_tokens(np.array([[0.0, np.log(3.0)]]), 1.0, rng)[0] for _ in range(4000)])
    assert abs(draws.mean() - 0.75) < 0.03
    np.testing.assert_array_equal(next_tokens(np.array([[0.0, 1.0, 0.5]]), 1e-3, rng), [1])


@pytest.mark.parametrize("call, match", [
    (lambda m: m.generate(PROMPT, 0), r"^n_new must be an integer >= 1, got 0$"),
    (lambda m: m.generate(PROMPT, 2.0), r"^n_new must be an integer >= 1, got 2\.0$"),
    (lambda m: m.generate(PROMPT, True), r"^n_new must be"),
    (lambda m: m.generate(PROMPT, 11), r"^n_new: 6 prompt tokens \+ 11 new ones exceed the model's context of 16 "
                                       r"positions \(config\.json n_positions\)$"),
    (lambda m: m.generate(PROMPT, 2, temperature=-0.5), r"^temperature must be a finite number >= 0"),
    (lambda m: m.generate(PROMPT, 2, temperature=float("nan")), r"^temperature must be"),
    (lambda m: m.generate([1, 97], 2), r"^token_ids must lie in 0\.\.96"),
    (lambda m: m.generate([[1, 2]], 2, attention_mask=[[0, 1]]), r"^attention_mask: generate does not support padding"),
    (lambda m: m.generate([[1, 2, 3]], 2, attention_mask=[1, 1, 1]),
     r"^attention_mask must have token_ids. shape \(1, 3\), got \(3,\)$"),
    (lambda m: m.generate(PROMPT, 2, dtype=np.float16), r"^dtype must be float32, float64 or .bfloat16."),
    (lambda m: m.to_str_tokens([1, 2]), r"^text_or_ids: folder .* has no tokenizer files"),
    (lambda m: m.to_str_tokens([1, 200]), r"^text_or_ids must lie in 0\.\.96"),
])
def test_bad_arguments(models, call, match):
    with pytest.raises(ValueError, match=match) as info:
        call(models["gpt2"])
    assert "\n" not in str(info.value)


def test_rotary_context_limit(models):
    model = models["qwen3"]  # max_position_embeddings 32768
    with pytest.raises(ValueError, match=r"^n_new: 6 prompt tokens \+ 32763 new ones exceed the model's context of "
                                         r"32768 positions \(config\.json max_position_embeddings\)$"):
        model.generate(PROMPT, 32763)


def test_bert_refuses(tmp_path):
    model = load_model(random_checkpoint("bert", tmp_path))
    with pytest.raises(ValueError, match=r"^generate: a bert checkpoint is not a causal decoder with logits") as info:
        model.generate([1, 2, 3], 2)
    assert "\n" not in str(info.value)


def test_to_str_tokens(tmp_path):
    folder = random_checkpoint("llama", tmp_path)
    with_tokenizer(tmp_path)
    model = load_model(folder)
    assert model.to_str_tokens("the cat sat on the mat") == ["the", "cat", "sat", "on", "the", "mat"]
    assert model.to_str_tokens([1, 2, 10, 0]) == ["the", "cat", "a", "<unk>"]
    assert model.to_str_tokens(np.array([[1, 2], [4, 5]])) == [["the", "cat"], ["on", "mat"]]
    ids, tokens = model.tokenize("the dog ran .")
    assert model.to_str_tokens(ids) == tokens == model.to_str_tokens("the dog ran .")
    with pytest.raises(ValueError, match=r"^text_or_ids: id 50 is not in the tokenizer's vocabulary \(11 tokens\)$"):
        model.to_str_tokens([1, 50])
    with pytest.raises(ValueError, match=r"^text_or_ids must be a str or a \(n,\) or \(batch, n\) integer array"):
        model.to_str_tokens([0.5])


def test_to_str_tokens_byte_level(tmp_path):
    """A byte-level BPE token decodes with its space, as TransformerLens' to_str_tokens gives."""
    tokenizers = pytest.importorskip("tokenizers")
    folder = random_checkpoint("gpt2", tmp_path)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=30)  # the ten characters seen and merges: ids < 97
    tok.train_from_iterator(["the cat sat on the mat"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    model = load_model(folder)
    ids, raw = model.tokenize("the cat sat")
    assert raw[-1] == "Ġsat" and max(ids) < 97
    strings = model.to_str_tokens("the cat sat")
    assert strings == model.to_str_tokens(ids)
    assert strings[-1] == " sat" and "".join(strings) == "the cat sat"
    view = head_view(model, "the cat sat")  # the view and report.html show the decoded strings
    assert view.tokens == strings and view.data()["tokens"] == strings


# -- against transformers' greedy generate ----------------------------------------------------------

def _hf_greedy(hf, prompt, n_new):
    import torch

    with torch.no_grad():
        out = hf.generate(torch.tensor(prompt[None]), attention_mask=torch.ones((1, prompt.size), dtype=torch.long),
                          max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return out[0].numpy()


@pytest.mark.parametrize("layout", ["gpt2", "llama", "mistral"])
def test_greedy_equals_transformers(tmp_path_factory, layout):
    """GPT-2 (its 16 positions), a grouped-query Llama, Mistral with a window of 4 positions."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from builders import model_pairs

    model, hf = model_pairs(tmp_path_factory, [layout])[layout]
    n_new = 16 - PROMPT.size if layout == "gpt2" else 20
    np.testing.assert_array_equal(model.generate(PROMPT, n_new), _hf_greedy(hf, PROMPT, n_new))


@pytest.mark.parametrize("family", ["mixtral", "deepseek"])
def test_greedy_equals_transformers_moe_mla(tmp_path, family):
    """Mixtral (top-2 of 4 experts) and DeepSeek-V2 (multi-head latent attention, routed and
    shared experts): the cache holds the expanded keys and values."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import builders

    hf = getattr(builders, family)(tmp_path)
    np.testing.assert_array_equal(load_model(tmp_path).generate(PROMPT, 12), _hf_greedy(hf, PROMPT, 12))
