"""Tokenizers: raw UTF-8 bytes, byte-level BPE trained on the corpus, or any Hugging Face ``tokenizer.json``.

Specs (the strings users write):

* ``"bytes"``: ids 0..255 are the UTF-8 bytes of the text and id 256 is EOS (``<|endoftext|>``), so
  ``vocab_size == 257``. It is also saved as an equivalent byte-level ``tokenizer.json`` so Hugging Face tools
  can load it.
* ``"bpe:N"``: byte-level BPE with exactly ``N`` ids (``N >= 257``; the 256 byte symbols, EOS
  ``<|endoftext|>`` at id 0, and ``N - 257`` merges), trained by :func:`train_bpe`. If the corpus is too small to
  learn every merge, the ids stay below ``N`` and ``vocab_size`` is still ``N``.
* ``"hf:NAME_OR_PATH"``: a ``tokenizer.json`` file, a folder containing one, or a Hub model name (downloaded
  with ``huggingface_hub``; fails fast with a DataError when the Hub cannot be reached and it is not cached).
  EOS is the first of ``<|endoftext|>``, ``<|end_of_text|>``, ``</s>``, ``<eos>``, ``<|eos|>`` in the vocabulary.

Text is always encoded without special tokens: a literal ``"<|endoftext|>"`` inside a document is encoded as
ordinary text, so only the separators the pipeline appends are EOS ids. ``decode`` renders EOS as its token
text, so ``decode(encode(s)) == s`` for byte-level tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from angpt.errors import DataError

EOS_TOKEN = "<|endoftext|>"
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
TOKENIZER_FILE = "tokenizer.json"
SPEC_FILE = "angpt_tokenizer.json"
BYTES_VOCAB = 257
BYTES_EOS = 256
_BYTES_HASH = hashlib.sha256(b"angpt-bytes-v1:257:eos=256").hexdigest()


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet), indexed by byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def parse_tokenizer_spec(spec: str) -> tuple[str, str | int | None]:
    """Split a spec into ``(kind, argument)``: ``("bytes", None)``, ``("bpe", N)`` or ``("hf", name)``."""
    if not isinstance(spec, str):
        raise DataError(f"tokenizer spec must be a string like 'bytes', 'bpe:4096' or 'hf:gpt2', got {spec!r}")
    if spec == "bytes":
        return "bytes", None
    if spec.startswith("bpe:"):
        try:
            n = int(spec[4:])
        except ValueError:
            n = -1
        if n < BYTES_VOCAB or n > 1 << 31:
            raise DataError(f"bad tokenizer spec {spec!r}: use bpe:N with an integer N >= 257, e.g. bpe:4096")
        return "bpe", n
    if spec.startswith("hf:") and len(spec) > 3:
        return "hf", spec[3:]
    raise DataError(f"unknown tokenizer {spec!r}: use 'bytes', 'bpe:N' (e.g. bpe:4096) or 'hf:NAME_OR_PATH'")


class Tokenizer:
    """A tokenizer with the few operations the pipeline needs, backed by a Hugging Face ``tokenizers`` object.

    Attributes: ``spec`` (the user's spec string), ``kind`` (``bytes``/``bpe``/``hf``), ``vocab_size``,
    ``eos_id``, ``eos_token`` and ``hash`` (sha256 hex of the exact ``tokenizer.json`` text, or a constant for
    ``bytes``), which identifies the tokenizer in shard headers and meta.
    """

    def __init__(self, spec: str, kind: str, hf_json: str, vocab_size: int, digest: str, eos_token: str | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        self.spec = spec
        self.kind = kind
        self.json = hf_json  # kept verbatim so save() reproduces the same bytes and hence the same hash
        self.hash = digest
        try:
            self.hf = HFTokenizer.from_str(hf_json)
        except Exception as e:  # the Rust side raises plain Exception for malformed files
            raise DataError(f"tokenizer {spec!r} is not a valid tokenizer.json ({e}); check the file") from e
        # Documents are text: never turn a literal "<|endoftext|>" inside them into a separator.
        self.hf.encode_special_tokens = True
        candidates = EOS_CANDIDATES if eos_token is None else (eos_token,)
        self.eos_token = next((t for t in candidates if self.hf.token_to_id(t) is not None), None)
        if self.eos_token is None:
            raise DataError(
                f"tokenizer {spec!r} has none of the EOS tokens {', '.join(candidates)}; "
                "use a tokenizer that defines one"
            )
        self.eos_id = int(self.hf.token_to_id(self.eos_token))
        self.vocab_size = max(int(vocab_size), self.hf.get_vocab_size(with_added_tokens=True))

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def byte_level(cls) -> Tokenizer:
        """The ``bytes`` tokenizer: ids 0..255 are UTF-8 bytes, 256 is EOS; vocab_size 257."""
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        vocab = {sym: b for b, sym in enumerate(_byte_symbols())}
        vocab[EOS_TOKEN] = BYTES_EOS
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
        return cls("bytes", "bytes", hf.to_str(), BYTES_VOCAB, _BYTES_HASH, EOS_TOKEN)

    @classmethod
    def from_json(cls, spec: str, kind: str, hf_json: str, vocab_size: int | None = None) -> Tokenizer:
        """Wrap a ``tokenizer.json`` text; its EOS is the first of :data:`EOS_CANDIDATES` it contains."""
        return cls(spec, kind, hf_json, vocab_size or 0, hashlib.sha256(hf_json.encode("utf-8")).hexdigest())

    # -- use ------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no EOS appended)."""
        if self.kind == "bytes":
            return list(text.encode("utf-8"))
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], *, parallel: bool = True) -> list[np.ndarray]:
        """Token ids of each text as int64 arrays (no EOS); ``parallel`` uses the Rust thread pool."""
        if self.kind == "bytes":
            # The byte tokenizer is the identity on UTF-8 bytes: no need to go through the Rust model.
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]
        if not parallel:
            return [np.asarray(self.hf.encode(t, add_special_tokens=False).ids, dtype=np.int64) for t in texts]
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)  # _fast skips offset tracking
        return [np.asarray(e.ids, dtype=np.int64) for e in encode(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; EOS and other special tokens appear as their token text."""
        ids = [int(i) for i in ids]
        if self.kind == "bytes":
            out, run = [], bytearray()
            for i in ids:
                if i < 256:
                    run.append(i)
                else:
                    out.append(run.decode("utf-8", errors="replace"))
                    out.append(EOS_TOKEN if i == BYTES_EOS else "")
                    run = bytearray()
            out.append(run.decode("utf-8", errors="replace"))
            return "".join(out)
        return self.hf.decode(ids, skip_special_tokens=False)

    def bytes_per_token(self, text: str) -> float:
        """UTF-8 bytes per token of ``text`` (to convert nats/token into bits/byte); 0.0 for empty text."""
        n = len(self.encode(text))
        return len(text.encode("utf-8")) / n if n else 0.0

    # -- persistence ----------------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` and ``angpt_tokenizer.json`` into ``directory``; returns the folder."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / TOKENIZER_FILE).write_text(self.json, encoding="utf-8")
        spec = {
            "spec": self.spec,
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "eos_token": self.eos_token,
            "hash": self.hash,
        }
        (directory / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        """Load a tokenizer saved by :meth:`save` (or a bare ``tokenizer.json`` file or folder)."""
        return load_tokenizer(directory)

    def __repr__(self) -> str:
        return f"Tokenizer({self.spec!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load the tokenizer of a prepared dataset folder (or any folder/file with a ``tokenizer.json``)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    spec_path = folder / SPEC_FILE
    if path.is_dir() and spec_path.is_file():
        try:
            spec = json.loads(spec_path.read_text(encoding="utf-8"))
            kind, vocab_size = spec["kind"], int(spec["vocab_size"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{spec_path} is corrupt ({e}); prepare the dataset again") from e
        if kind == "bytes":
            return Tokenizer.byte_level()
        hf_json = _read_json_text(folder / TOKENIZER_FILE)
        digest = hashlib.sha256(hf_json.encode("utf-8")).hexdigest()
        tok = Tokenizer(spec["spec"], kind, hf_json, vocab_size, digest, spec.get("eos_token"))
        if tok.hash != spec.get("hash"):
            raise DataError(
                f"{folder / TOKENIZER_FILE} does not match the hash in {SPEC_FILE}: it was modified; "
                "restore it or prepare the dataset again"
            )
        return tok
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"no {TOKENIZER_FILE} at {path}; pass a prepared dataset folder or a tokenizer.json")
    return Tokenizer.from_json(f"hf:{file}", "hf", _read_json_text(file))


def _read_json_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)
    except FileNotFoundError as e:
        raise DataError(f"missing {path}; prepare the dataset again") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path} is not a readable tokenizer.json ({e}); replace it") from e
    return text


def make_tokenizer(spec: str) -> Tokenizer:
    """Build a ready tokenizer from a ``bytes`` or ``hf:...`` spec (``bpe:N`` needs :func:`train_bpe`)."""
    kind, arg = parse_tokenizer_spec(spec)
    if kind == "bytes":
        return Tokenizer.byte_level()
    if kind == "bpe":
        raise DataError(f"{spec!r} must be trained on a corpus: use prepare_dataset or train_bpe")
    local = Path(os.path.expanduser(arg))
    if local.exists():
        tok = load_tokenizer(local)
        return Tokenizer(spec, "hf", tok.json, tok.vocab_size, tok.hash, tok.eos_token)
    return Tokenizer.from_json(spec, "hf", _download_tokenizer_json(arg))


def _download_tokenizer_json(name: str) -> str:
    """``tokenizer.json`` of a Hub model, from the cache when the Hub is unreachable; fails in seconds."""
    from angpt.data.sources import hub_offline, hub_reachable

    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:
        raise DataError(f"hf:{name} needs huggingface_hub; install it with pip install 'angpt[hf]'") from e
    # Without a reachable Hub only the local cache can answer; asking it online would retry for ~30 s.
    local_only = hub_offline() or not hub_reachable()
    try:
        file = hf_hub_download(name, TOKENIZER_FILE, local_files_only=local_only)
    except Exception as e:  # hub errors come in many classes (offline, 404, gated, network)
        where = "not in the local cache and the Hub is unreachable" if local_only else "not downloadable"
        raise DataError(
            f"tokenizer hf:{name}: {TOKENIZER_FILE} is {where} ({type(e).__name__}); "
            "pass a local tokenizer.json path or go online"
        ) from e
    return _read_json_text(Path(file))


def train_bpe(texts: Iterable[str], vocab_size: int, *, progress: bool = False) -> Tokenizer:
    """Train a byte-level BPE tokenizer with ``vocab_size`` ids on ``texts`` (EOS ``<|endoftext|>`` is id 0)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    spec = f"bpe:{vocab_size}"
    parse_tokenizer_spec(spec)  # validates the size
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable, no unknown tokens
        show_progress=progress,
    )
    hf.train_from_iterator(texts, trainer)
    hf_json = hf.to_str()
    return Tokenizer(spec, "bpe", hf_json, vocab_size, hashlib.sha256(hf_json.encode()).hexdigest(), EOS_TOKEN)
