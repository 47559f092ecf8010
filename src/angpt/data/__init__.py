"""Data pipeline: raw text -> tokenizer -> token shards (:func:`prepare_dataset`) -> batches (:class:`TokenLoader`).

Before training: :func:`check_trainable` (both splits usable at a sequence length, ids in range) and
:func:`data_identity` (tokenizer hash, vocabulary size and content fingerprint, for a resume to compare).

Importing this package is light: the names below load on first use (no torch until a loader is asked for), and
``datasets``, ``transformers`` and ``pyarrow`` are imported only by the functions that need them.
"""

from __future__ import annotations

from angpt.lazy import lazy_names

# name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(
        (
            "FORMAT_VERSION",
            "HEADER_SIZE",
            "MAGIC",
            "check_compatible",
            "check_token_ids",
            "data_identity",
            "load_meta",
            "open_shard",
            "read_shard_header",
            "write_shard",
        ),
        "angpt.data.format",
    ),
    **dict.fromkeys(("TokenLoader", "check_trainable", "eval_windows", "iter_eval_batches"), "angpt.data.loader"),
    **dict.fromkeys(("prepare_dataset", "split_value"), "angpt.data.prepare"),
    **dict.fromkeys(
        ("DEFAULT_DOC_SEPARATOR", "list_local_files", "list_stdlib_files", "open_source"), "angpt.data.sources"
    ),
    **dict.fromkeys(("Tokenizer", "load_tokenizer", "make_tokenizer", "train_bpe"), "angpt.data.tokenizer"),
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_names("angpt.data", _EXPORTS, globals())
