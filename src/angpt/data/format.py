"""On-disk format of a prepared dataset: token shards and ``meta.json``.

A prepared dataset is a folder holding

* ``train_000000.bin``, ``train_000001.bin``, ... and ``val_000000.bin``, ...: token shards;
* ``tokenizer.json`` (a Hugging Face ``tokenizers`` file) and ``angpt_tokenizer.json`` (our spec: kind, EOS id,
  vocabulary size, hash) so later steps can decode with :func:`angpt.data.load_tokenizer`;
* ``meta.json``, written last: its presence marks a finished dataset. Main keys: ``format_version``,
  ``angpt_version``, ``created``, ``options`` (the prepare arguments), ``source``, ``tokenizer`` (spec, kind,
  hash, vocab_size, eos_id), ``vocab_size``, ``eos_id``, ``dtype``, ``documents``/``tokens``/``bytes`` and
  ``splits.{train,val}`` = ``{shards: [{file, tokens, sha256}], documents, tokens, bytes, bytes_per_token}``
  where ``tokens`` count the EOS separators, ``bytes`` the UTF-8 text and ``sha256`` hashes the whole shard
  file (header included; absent in datasets prepared before it was recorded). :func:`data_identity` turns
  them into the dataset's fingerprint.

Shard layout (little-endian): a 256-byte header followed by ``count`` tokens of ``itemsize`` bytes each
(uint16 when the vocabulary has at most 65536 ids, else uint32). Header fields, in order:

==========  =======  =====================================================
field       type     meaning
==========  =======  =====================================================
magic       8 bytes  ``b"ANGPTTOK"``
version     uint32   :data:`FORMAT_VERSION`
header      uint32   header size in bytes (256)
itemsize    uint32   2 (uint16 tokens) or 4 (uint32 tokens)
vocab_size  uint32   tokenizer vocabulary size
eos_id      uint32   document separator id (0xFFFFFFFF when none)
count       uint64   number of tokens in this shard
tok_hash    16 bytes first 16 bytes of the tokenizer's sha256
(reserved)  zeros    up to byte 256
==========  =======  =====================================================

Documents are concatenated, each followed by its EOS id; a document may continue into the next shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from angpt.errors import DataError

MAGIC = b"ANGPTTOK"
FORMAT_VERSION = 1
HEADER_SIZE = 256
META_NAME = "meta.json"
NO_EOS = 0xFFFFFFFF
SPLITS = ("train", "val", "test")  # val selects (learning rates, settings); test measures what is reported

_HEADER = struct.Struct("<8sIIIIIQ16s")
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The token dtype for a vocabulary: uint16 when every id fits (``vocab_size <= 65536``), else uint32."""
    return _DTYPES[2] if vocab_size <= 1 << 16 else _DTYPES[4]


def pack_header(count: int, itemsize: int, vocab_size: int, eos_id: int | None, tokenizer_hash: str) -> bytes:
    """The 256-byte shard header for ``count`` tokens (see the module docstring for the layout)."""
    eos = NO_EOS if eos_id is None else eos_id
    head = _HEADER.pack(
        MAGIC, FORMAT_VERSION, HEADER_SIZE, itemsize, vocab_size, eos, count, bytes.fromhex(tokenizer_hash[:32])
    )
    return head.ljust(HEADER_SIZE, b"\0")


def read_shard_header(path: str | os.PathLike) -> dict:
    """Read and validate a shard's header; DataError naming the file if it is not a complete angpt shard."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
        size = path.stat().st_size
    except OSError as e:
        raise DataError(f"cannot read token shard {path}: {e.strerror or e}; re-run prepare") from e
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise DataError(f"{path} is not an angpt token shard (bad magic); re-run prepare into a fresh folder")
    magic, version, header_size, itemsize, vocab_size, eos, count, tok_hash = _HEADER.unpack_from(raw)
    if version != FORMAT_VERSION or header_size != HEADER_SIZE:
        raise DataError(
            f"{path} has shard format version {version}, this angpt reads version {FORMAT_VERSION}; "
            "re-run prepare with this version"
        )
    if itemsize not in _DTYPES:
        raise DataError(f"{path} has an unknown token size {itemsize}; the file is corrupt, re-run prepare")
    expected = HEADER_SIZE + count * itemsize
    if size != expected:
        raise DataError(f"{path} is truncated or corrupt: {size} bytes on disk, header says {expected}; re-run prepare")
    return {
        "version": version,
        "dtype": _DTYPES[itemsize],
        "vocab_size": vocab_size,
        "eos_id": None if eos == NO_EOS else eos,
        "count": count,
        "tokenizer_hash": tok_hash.hex(),
    }


def open_shard(path: str | os.PathLike) -> np.ndarray:
    """Memory-map a shard's tokens (read-only) after validating its header.

    Returns a ``numpy.memmap`` (a plain empty array for a shard with no tokens, which mmap cannot map).
    """
    header = read_shard_header(path)
    if header["count"] == 0:
        return np.zeros(0, dtype=header["dtype"])
    return np.memmap(path, dtype=header["dtype"], mode="r", offset=HEADER_SIZE, shape=(header["count"],))


# Shards whose ids were already checked in this process: (path, dev, inode, size, mtime, ctime) -> largest id.
# A file changed in any way gets a new key (mtime/ctime move on every write), so it is scanned again.
_SCANNED: dict[tuple, int] = {}
_HASHED: dict[tuple, str] = {}  # the same keys -> sha256 of the whole file


def _file_key(path: Path) -> tuple:
    st = os.stat(path)
    return (str(Path(path).absolute()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _max_token_id(tokens: np.ndarray) -> int:
    """The largest id of a shard's tokens: one vectorised pass over the memory map."""
    return int(tokens.max()) if tokens.size else -1


def check_token_ids(path: str | os.PathLike, tokens: np.ndarray, vocab_size: int) -> None:
    """DataError naming the shard and the first id ``>= vocab_size`` in ``tokens`` (the shard's memory map).

    Out-of-range ids in a shard with a valid header (bit rot, a hand-edited or foreign file) would index past
    the embedding table. The check is a vectorised max over the memory map (about the time to read the file),
    done once per unchanged shard file per process; ids that cannot reach ``vocab_size`` are not scanned.
    """
    if tokens.size == 0 or vocab_size > np.iinfo(tokens.dtype).max:
        return
    key = _file_key(Path(path))
    top = _SCANNED.get(key)
    if top is None:
        top = _max_token_id(tokens)
    if top >= vocab_size:
        pos = int(np.argmax(tokens >= vocab_size))
        raise DataError(
            f"{path} holds token id {int(tokens[pos])} at token {pos}, outside the vocabulary (vocab_size "
            f"{vocab_size}): the shard is corrupt; prepare the dataset again"
        )
    _SCANNED[key] = top


def file_sha256(path: str | os.PathLike, *, cached: bool = True) -> str:
    """sha256 hex of a whole file (header included), read in 8 MiB blocks; remembered per unchanged file."""
    path = Path(path)
    h = hashlib.sha256()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    try:
        key = _file_key(path)
        if cached and key in _HASHED:
            return _HASHED[key]
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}; re-run prepare") from e
    _HASHED[key] = h.hexdigest()
    return _HASHED[key]


class ShardWriter:
    """Append token arrays for one split, cutting them into shards of ``shard_tokens`` tokens.

    Each shard is written under a temporary name and renamed when complete, so a shard with its final name is
    always whole.
    """

    def __init__(
        self,
        out_dir: Path,
        split: str,
        *,
        vocab_size: int,
        eos_id: int | None,
        tokenizer_hash: str,
        shard_tokens: int,
    ):
        self.out_dir = Path(out_dir)
        self.split = split
        self.dtype = dtype_for_vocab(vocab_size)
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.tokenizer_hash = tokenizer_hash
        self.shard_tokens = shard_tokens
        self.shards: list[dict] = []  # finished shards: {"file", "tokens"}
        self.tokens = 0  # tokens written so far across all shards
        self._file = None
        self._count = 0

    def _name(self, index: int) -> str:
        return f"{self.split}_{index:06d}.bin"

    def write(self, tokens: np.ndarray) -> None:
        """Append tokens (any integer array); starts new shards as needed."""
        tokens = np.asarray(tokens)
        if tokens.size and int(tokens.max()) >= self.vocab_size:
            # Would silently corrupt training (out-of-range embedding lookups), so refuse here.
            raise DataError(f"token id {int(tokens.max())} >= vocab size {self.vocab_size}; tokenizer is broken")
        tokens = tokens.astype(self.dtype, copy=False)
        while tokens.size:
            if self._file is None:
                self._open()
            room = self.shard_tokens - self._count
            part, tokens = tokens[:room], tokens[room:]
            self._file.write(part.tobytes())
            self._count += part.size
            self.tokens += part.size
            if self._count >= self.shard_tokens:
                self._finish()

    def _open(self) -> None:
        self._tmp = self.out_dir / f".{self._name(len(self.shards))}.tmp"
        self._file = open(self._tmp, "wb")
        self._file.write(b"\0" * HEADER_SIZE)  # placeholder; the count is known only at the end
        self._count = 0

    def _finish(self) -> None:
        f = self._file
        f.seek(0)
        f.write(pack_header(self._count, self.dtype.itemsize, self.vocab_size, self.eos_id, self.tokenizer_hash))
        f.flush()
        os.fsync(f.fileno())
        f.close()
        name = self._name(len(self.shards))
        os.replace(self._tmp, self.out_dir / name)
        self.shards.append({"file": name, "tokens": self._count})
        self._file = None

    def close(self) -> list[dict]:
        """Finish the open shard (if any) and return the shard list ``[{"file", "tokens"}, ...]``."""
        if self._file is not None:
            self._finish()
        return self.shards

    def abort(self) -> None:
        """Close without finishing (used on errors; the caller removes the folder)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def write_shard(
    path: str | os.PathLike, tokens: np.ndarray, *, vocab_size: int, eos_id: int | None, tokenizer_hash: str
) -> None:
    """Write one complete shard holding ``tokens`` to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    dtype = dtype_for_vocab(vocab_size)
    tokens = np.asarray(tokens).astype(dtype, copy=False)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(pack_header(tokens.size, dtype.itemsize, vocab_size, eos_id, tokenizer_hash))
        f.write(tokens.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_meta(out_dir: Path, meta: dict) -> None:
    """Write ``meta.json`` atomically (temp file + rename)."""
    tmp = Path(out_dir) / f".{META_NAME}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, Path(out_dir) / META_NAME)


def load_meta(data_dir: str | os.PathLike) -> dict:
    """Read a prepared dataset's ``meta.json``; DataError if it is missing, unreadable or from a newer format (a
    folder that does not exist is named as such: a mistyped path, not a dataset to prepare again)."""
    path = Path(data_dir) / META_NAME
    if not Path(data_dir).exists():
        raise DataError(
            f"dataset folder {data_dir} does not exist; check the path, or make the dataset with "
            f"`angpt prepare --source PATH --out {data_dir}`"
        )
    if not Path(data_dir).is_dir():
        raise DataError(f"{data_dir} is a file, not a dataset folder; pass the folder `angpt prepare --out` wrote")
    if not path.is_file():
        raise DataError(
            f"{data_dir} is not a prepared dataset (no {META_NAME}); make one with `angpt prepare --source PATH "
            "--out DIR` (a new or empty folder) and pass that folder"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path} is unreadable or corrupt ({e}); delete the folder and prepare it again") from e
    required = ("format_version", "vocab_size", "splits", "tokenizer")
    if not isinstance(meta, dict) or any(k not in meta for k in required):
        raise DataError(f"{path} is missing required fields; delete the folder and prepare it again")
    if meta["format_version"] != FORMAT_VERSION:
        raise DataError(
            f"{path} has format version {meta['format_version']}, this angpt reads version {FORMAT_VERSION}; "
            "prepare the dataset again with this version"
        )
    return meta


def split_files(data_dir: str | os.PathLike, meta: dict, split: str) -> list[tuple[Path, int]]:
    """The shard paths of ``split`` with their token counts from meta; DataError for an unknown split."""
    if split not in meta["splits"]:
        raise DataError(f"unknown split {split!r} in {data_dir}; use one of {sorted(meta['splits'])}")
    return [(Path(data_dir) / s["file"], int(s["tokens"])) for s in meta["splits"][split]["shards"]]


def check_compatible(meta: dict, vocab_size: int) -> None:
    """DataError unless every token id of the dataset fits a model with ``vocab_size`` embeddings."""
    need = int(meta["vocab_size"])
    if need > vocab_size:
        raise DataError(
            f"dataset vocabulary has {need} ids but the model has vocab_size={vocab_size}; "
            f"set model.vocab_size >= {need}"
        )


def _tokenizer_hash(data_dir: Path, meta: dict) -> str:
    """The tokenizer hash recorded in meta.json or angpt_tokenizer.json, else the sha256 of tokenizer.json."""
    found = tokenizer_hash(data_dir, meta)
    if found is None:
        raise DataError(f"{data_dir} records no tokenizer hash and has no tokenizer.json; prepare it again")
    return found


def tokenizer_hash(folder: str | os.PathLike, meta: dict | None = None) -> str | None:
    """The hash of the tokenizer a folder carries (a dataset, or a checkpoint with its tokenizer copied in):
    recorded in `meta` or angpt_tokenizer.json, else the sha256 of tokenizer.json; None when it has none."""
    folder = Path(folder)
    meta = meta or {}
    tok = meta.get("tokenizer")
    recorded = meta.get("tokenizer_hash") or (tok.get("hash") if isinstance(tok, dict) else None)
    if isinstance(recorded, str) and recorded:
        return recorded
    spec = folder / "angpt_tokenizer.json"
    if spec.is_file():
        try:
            recorded = json.loads(spec.read_text(encoding="utf-8")).get("hash")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise DataError(f"{spec} is corrupt ({e}); prepare the dataset again") from e
        if isinstance(recorded, str) and recorded:
            return recorded
    file = folder / "tokenizer.json"
    return file_sha256(file) if file.is_file() else None


def data_identity(data_dir: str | os.PathLike, *, verify: bool = False, meta: dict | None = None) -> dict:
    """What identifies a prepared dataset, for a resumed run to compare with what its checkpoint recorded.

    Returns a JSON-serialisable dict:

    * ``tokenizer_hash``: the tokenizer's hash as recorded at prepare time (``meta.json``, else
      ``angpt_tokenizer.json``), else the sha256 of ``tokenizer.json``. Two tokenizers with the same vocabulary
      size have different hashes.
    * ``vocab_size``: the tokenizer's vocabulary size.
    * ``data_fingerprint``: sha256 hex over, per split, each shard's file name, token count and sha256 (of the
      whole file, header included, which binds the token dtype, vocabulary size and tokenizer). It changes
      whenever the prepared token stream differs in any token: another source text, tokenizer, split seed,
      ``val_fraction``, ``max_tokens``, document rule or shard size. It does not depend on the folder's path,
      the preparation time or the angpt version, so the same prepare twice (or a copied folder) gives the same
      fingerprint.
    * ``tokens``: the token count of each split.

    Cost: the shard hashes recorded in ``meta.json`` at prepare time are used, so by default only ``meta.json``
    and each shard's 256-byte header are read (the header is checked against ``meta.json``); a change to a shard
    file after it was prepared (bit rot, same-size replacement) is then NOT seen. ``verify=True`` re-reads every
    shard (a full read of the dataset) and raises a DataError naming any shard whose content differs from its
    recorded hash. Datasets prepared before hashes were recorded are hashed on the fly (a full read, remembered
    per unchanged file for the process), giving the same fingerprint as if recorded. `meta`: the dataset's meta.json,
    where the caller has read it already.
    """
    data_dir = Path(data_dir)
    meta = meta if meta is not None else load_meta(data_dir)
    splits: dict[str, list] = {}
    tokens: dict[str, int] = {}
    for name in sorted(meta["splits"]):
        entries = []
        for path, count in split_files(data_dir, meta, name):
            header = read_shard_header(path)
            if header["count"] != count:
                raise DataError(f"{path} holds {header['count']} tokens, meta.json says {count}; prepare it again")
            shard = next(s for s in meta["splits"][name]["shards"] if s["file"] == path.name)
            recorded = shard.get("sha256")
            if recorded is None or verify:
                actual = file_sha256(path, cached=not verify)
                if recorded is not None and actual != recorded:
                    raise DataError(
                        f"{path} changed since it was prepared (its sha256 differs from meta.json): the file is "
                        "corrupt or was replaced; prepare the dataset again"
                    )
                recorded = actual
            entries.append([path.name, count, recorded])
        splits[name] = entries
        tokens[name] = sum(e[1] for e in entries)
    blob = json.dumps({"version": 1, "splits": splits}, sort_keys=True, separators=(",", ":")).encode()
    return {
        "tokenizer_hash": _tokenizer_hash(data_dir, meta),
        "vocab_size": int(meta["vocab_size"]),
        "data_fingerprint": hashlib.sha256(blob).hexdigest(),
        "tokens": tokens,
    }
