"""Text to token ids with the tokenizer files shipped next to the weights.

``tokenizer.json`` is read by the ``tokenizers`` package when it is installed (any
tokenizer it supports). Without it, BERT's WordPiece tokenizer is done here from
``vocab.txt`` (lower-casing and accent stripping as tokenizer_config.json's do_lower_case
says, splitting on whitespace and punctuation, CJK characters as single tokens, greedy
longest-match-first sub-words with the "##" continuation prefix), wrapped in [CLS] ... [SEP].
"""
from __future__ import annotations

import os
import unicodedata
from typing import List, Optional, Tuple

from ..._operands import choice
from .jsonfile import read_json_object


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class WordPiece:
    """BERT's tokenizer from a vocabulary (one token a line, id = line number).

    vocab : list of tokens; lowercase : lower-case and strip accents first.

    Example: ``WordPiece.from_file("vocab.txt").encode("Hello world")  # ([101, ...], ['[CLS]', ...])``
    """

    def __init__(self, vocab: List[str], *, lowercase: bool = True, max_chars: int = 100):
        self.vocab = {tok: i for i, tok in enumerate(vocab)}
        self.tokens = list(vocab)
        self.lowercase = lowercase
        self.max_chars = max_chars
        for special in ("[CLS]", "[SEP]", "[UNK]"):
            if special not in self.vocab:
                raise ValueError(f"vocab must contain {special}")

    @classmethod
    def from_file(cls, path, *, lowercase: bool = True) -> "WordPiece":
        """Read vocab.txt (UTF-8, one token a line)."""
        with open(path, encoding="utf-8") as f:
            vocab = [line.rstrip("\n").rstrip("\r") for line in f]
        while vocab and vocab[-1] == "":
            vocab.pop()
        return cls(vocab, lowercase=lowercase)

    def _words(self, text: str) -> List[str]:
        text = "".join(" " if unicodedata.category(c) == "Zs" or c in "\t\n\r" else c for c in text
                       if not (ord(c) in (0, 0xFFFD) or (unicodedata.category(c).startswith("C") and c not in "\t\n\r")))
        text = "".join(f" {c} " if _is_cjk(ord(c)) else c for c in text)
        words = []
        for word in text.split():
            if self.lowercase:
                word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
            current = ""
            for c in word:
                if _is_punctuation(c):
                    if current:
                        words.append(current)
                    words.append(c)
                    current = ""
                else:
                    current += c
            if current:
                words.append(current)
        return words

    def _pieces(self, word: str) -> List[str]:
        if len(word) > self.max_chars:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def encode(self, text: str, *, max_length: Optional[int] = None) -> Tuple[List[int], List[str]]:
        """text -> (ids, tokens) with [CLS] first and [SEP] last, truncated to max_length."""
        tokens = ["[CLS]"] + [p for w in self._words(text) for p in self._pieces(w)] + ["[SEP]"]
        if max_length is not None and len(tokens) > max_length:
            tokens = tokens[: max_length - 1] + ["[SEP]"]
        return [self.vocab[t] for t in tokens], tokens


def tokenize(folder, text: str, *, max_length: Optional[int] = None, backend: str = "auto") -> Tuple[List[int], List[str]]:
    """Token ids and token strings of ``text`` for the model in ``folder``.

    Raises ValueError when the folder has neither tokenizer.json nor vocab.txt.

    Parameters
    ----------
    folder : str or path-like
        The model folder.
    text : str
        The input text.
    max_length : int, optional
        Truncate to this many tokens (keeping [SEP]).
    backend : {"auto", "tokenizers", "wordpiece"}, default "auto"
        "auto" uses ``tokenizers`` on tokenizer.json when both exist, else WordPiece on
        vocab.txt.

    Returns
    -------
    ids : list of int
        Token ids.
    tokens : list of str
        Token strings.

    Examples
    --------
    >>> from attngeom.models import packaged_model_path, tokenize
    >>> tokenize(packaged_model_path(), "The cat sat.", backend="wordpiece")  # needs the models extra
    ([101, 1996, 4937, 2938, 1012, 102], ['[CLS]', 'the', 'cat', 'sat', '.', '[SEP]'])
    """
    choice("backend", backend, ("auto", "tokenizers", "wordpiece"), "'auto', 'tokenizers' or 'wordpiece'")
    folder = os.fspath(folder)
    tj, vocab = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "vocab.txt")
    if backend in ("auto", "tokenizers") and os.path.isfile(tj):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            if backend == "tokenizers":
                raise ImportError("backend='tokenizers' needs the tokenizers package: pip install tokenizers") from None
        else:
            tok = Tokenizer.from_file(tj)
            tok.no_truncation()
            tok.no_padding()
            enc = tok.encode(text)
            ids, tokens = list(enc.ids), list(enc.tokens)
            if max_length is not None and len(ids) > max_length:
                ids, tokens = ids[: max_length - 1] + ids[-1:], tokens[: max_length - 1] + tokens[-1:]
            return ids, tokens
    if backend == "tokenizers":
        raise ValueError(f"folder {folder!r} has no tokenizer.json")
    if not os.path.isfile(vocab):
        raise ValueError(f"folder {folder!r} has neither tokenizer.json (with the tokenizers package) nor vocab.txt")
    lowercase = True
    cfg = os.path.join(folder, "tokenizer_config.json")
    if os.path.exists(cfg):
        lowercase = read_json_object(cfg).get("do_lower_case", True)
        if not isinstance(lowercase, bool):
            raise ValueError(f"{cfg!r}: field 'do_lower_case' must be true or false, got {lowercase!r}")
    return WordPiece.from_file(vocab, lowercase=lowercase).encode(text, max_length=max_length)
