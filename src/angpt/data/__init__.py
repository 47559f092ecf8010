"""Data pipeline: raw text -> tokenizer -> token shards (:func:`prepare_dataset`) -> batches (:class:`TokenLoader`).

Before training: :func:`check_trainable` (both splits usable at a sequence length, ids in range) and
:func:`data_identity` (tokenizer hash, vocabulary size and content fingerprint, for a resume to compare).

Importing this package is light: ``datasets``, ``transformers`` and ``pyarrow`` are imported only by the
functions that need them.
"""

from angpt.data.format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    check_compatible,
    check_token_ids,
    data_identity,
    load_meta,
    open_shard,
    read_shard_header,
    write_shard,
)
from angpt.data.loader import TokenLoader, check_trainable, eval_windows, iter_eval_batches
from angpt.data.prepare import prepare_dataset, split_value
from angpt.data.sources import DEFAULT_DOC_SEPARATOR, list_local_files, list_stdlib_files, open_source
from angpt.data.tokenizer import Tokenizer, load_tokenizer, make_tokenizer, train_bpe

__all__ = [
    "DEFAULT_DOC_SEPARATOR",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "Tokenizer",
    "TokenLoader",
    "check_compatible",
    "check_token_ids",
    "check_trainable",
    "data_identity",
    "eval_windows",
    "iter_eval_batches",
    "list_local_files",
    "list_stdlib_files",
    "load_meta",
    "load_tokenizer",
    "make_tokenizer",
    "open_shard",
    "open_source",
    "prepare_dataset",
    "read_shard_header",
    "split_value",
    "train_bpe",
    "write_shard",
]
