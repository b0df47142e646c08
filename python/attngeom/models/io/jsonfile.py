"""Reading the small JSON files that come with a checkpoint (config.json, tokenizer_config.json,
sentence_bert_config.json) as a dict, with one ValueError naming the file for every way
such a file can be wrong: not a file, too large, not UTF-8, not JSON, nested beyond
Python's recursion limit, or a JSON value that is not an object.
"""
from __future__ import annotations

import json
import os

# Model configurations are a few kB; those with a label table for tens of thousands of
# classes reach a few MB. Anything larger is not a configuration and is not read into memory.
MAX_JSON_BYTES = 16 * 1024 * 1024


def read_json_object(path) -> dict:
    """The JSON object stored in a small file, as a dict.

    For the configuration files next to a checkpoint. A UTF-8 byte-order mark is allowed.

    Parameters
    ----------
    path : str or path-like
        The file, at most ``MAX_JSON_BYTES`` (16 MiB).

    Returns
    -------
    dict
        The parsed object.

    Raises
    ------
    ValueError
        Naming the file, when it is not a regular file, is larger than the limit, cannot be
        read, is not UTF-8 JSON, is nested too deeply to parse, or holds a JSON value other
        than an object (a list, a number, ...).

    Examples
    --------
    >>> import json
    >>> from attngeom.models.io.jsonfile import read_json_object
    >>> _ = open("config.json", "w").write(json.dumps({"num_attention_heads": 12}))
    >>> read_json_object("config.json")
    {'num_attention_heads': 12}
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path!r} must be a regular file holding a JSON object")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path!r} could not be read: {exc}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise ValueError(f"{path!r} is larger than the {MAX_JSON_BYTES} bytes a configuration file may have")
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path!r} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path!r} is not a configuration file: its JSON is nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path!r} must hold a JSON object, got a JSON {_json_kind(value)}")
    return value


def _json_kind(value) -> str:
    """The JSON name of a parsed value's type."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"
