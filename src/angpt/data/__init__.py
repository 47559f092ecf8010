"""Data pipeline: raw text -> tokenizer -> token shards (:func:`prepare_dataset`) -> batches (:class:`TokenLoader`).

Importing this package is light: ``datasets``, ``transformers`` and ``pyarrow`` are imported only by the
functions that need them.
"""

from angpt.data.format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    check_compatible,
    load_meta,
    open_shard,
    read_shard_header,
    write_shard,
)
from angpt.data.loader import TokenLoader, iter_eval_batches
from angpt.data.prepare import prepare_dataset, split_value
from angpt.data.sources import list_local_files, list_stdlib_files, open_source
from angpt.data.tokenizer import Tokenizer, load_tokenizer, make_tokenizer, train_bpe

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "Tokenizer",
    "TokenLoader",
    "check_compatible",
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
