"""Where documents come from: the Python standard library, local files, or Hugging Face ``datasets``.

Source strings:

* ``"stdlib"``: every ``.py`` file of the running interpreter's standard library (``site-packages`` excluded), in
  sorted path order, one document per file. No network needed.
* a local path: a file or a folder searched recursively in sorted order, reading text files (``.txt``, and
  ``.md``, ``.rst`` and ``.py`` read the same way; below, ".txt" stands for all four), ``.jsonl`` (one document
  per line, field ``text_field``) and ``.parquet`` (column ``text_field``) files.

  How ``.txt`` files become documents (``doc_separator``, recorded in ``meta.json`` as the rule applied):

  - default (``None``): a source that is a single ``.txt`` file is cut into blocks separated by one or more
    blank (empty or whitespace-only) lines, :data:`DEFAULT_DOC_SEPARATOR`; each ``.txt`` file found in a folder
    is one document;
  - a regular expression (Python ``re`` syntax; inline flags such as ``(?m)`` allowed): every ``.txt`` file of
    the source is cut at its matches, which are dropped, e.g. ``"<\\|endoftext\\|>"`` or ``"(?m)^-{3,}\\n"``;
  - ``""``: every ``.txt`` file is one document, whatever it holds.

  Blocks that are empty or whitespace only are skipped; the others are kept verbatim (with the default rule a
  block ends with the newline of its last line). A separator for a source without ``.txt`` files is refused.
* ``"hf:..."``: read through ``datasets`` (streaming where possible); a trailing ``@SPLIT`` picks the split
  (default ``train``):

  - ``hf:ORG/NAME`` or ``hf:ORG/NAME:CONFIG``: a Hub dataset, streamed;
  - ``hf:BUILDER:FILES`` with BUILDER one of ``parquet``, ``json``, ``csv``, ``text``, ``arrow`` and FILES a
    path or glob (several separated by commas), e.g. ``hf:parquet:/data/shards/*.parquet`` or
    ``hf:json:/data/docs.jsonl``: ``datasets.load_dataset(BUILDER, data_files=FILES, streaming=True)``;
  - ``hf:/local/folder``: a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, or a
    data folder that ``datasets.load_dataset`` understands (optionally ``hf:/local/folder:CONFIG``).

Files that are not UTF-8 (``.txt`` files, and the few stdlib test files written in Latin-1 on purpose) follow
``encoding_errors``: ``"skip"`` (default) leaves the file out and lists it in the source's ``skipped`` (prepare
warns and records them in ``meta.json``), so one stray file does not stop a long prepare; ``"replace"`` keeps it with
U+FFFD for each undecodable byte; ``"strict"`` stops with a one-line error naming the file.

When the Hub cannot be reached (offline mode, no network) a Hub source fails within seconds with a DataError.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from angpt.errors import DataError

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")  # plain text files, read as .txt files are
LOCAL_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".parquet")
ENCODING_ERRORS = ("skip", "replace", "strict")  # what a file that is not UTF-8 does: left out, U+FFFD, an error
# One or more blank lines (empty or only spaces/tabs, CRLF too) after a newline; the newline stays with the block.
DEFAULT_DOC_SEPARATOR = r"(?<=\n)(?:[ \t\r\f\v]*\n)+"
HF_BUILDERS = ("parquet", "json", "csv", "text", "arrow")
_TRUE = {"1", "true", "yes", "on"}
_HUB_NAME = re.compile(r"^[\w.\-]+(/[\w.\-]+)?$")
_SPLIT_SUFFIX = re.compile(r"@([\w\-]+)$")  # no dots, so "x@v2.jsonl" stays a file name


# -- Hub connectivity ---------------------------------------------------------------------------------------


def hub_offline() -> bool:
    """True when the user asked for offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``)."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub endpoint (or the HTTPS proxy) opens within ``timeout`` seconds.

    The Hub clients retry unreachable hosts for half a minute; this probe lets us fail in seconds instead.
    """
    target = (
        os.environ.get("HTTPS_PROXY")
        or os.environ.get("https_proxy")
        or os.environ.get("HF_ENDPOINT")
        or "https://huggingface.co"
    )
    url = urlparse(target if "://" in target else f"http://{target}")
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return False
    ok = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    # DNS lookups ignore socket timeouts, so bound the whole probe with a daemon thread.
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


# -- sources ------------------------------------------------------------------------------------------------


def list_stdlib_files() -> list[Path]:
    """All ``.py`` files of this interpreter's standard library, sorted, without ``site-packages``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def list_local_files(path: str | os.PathLike) -> list[Path]:
    """The readable files of a local source: the file itself, or a folder's text (:data:`TEXT_SUFFIXES`), ``.jsonl``
    and ``.parquet`` files."""
    path = Path(path)
    if path.is_file():
        if path.suffix not in LOCAL_SUFFIXES:
            raise DataError(
                f"{path} has an unsupported type; use text ({', '.join(TEXT_SUFFIXES)}), .jsonl or .parquet files"
            )
        return [path]
    if not path.is_dir():
        raise DataError(f"data source {str(path)!r} does not exist; pass 'stdlib', a local path or hf:NAME")
    files = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(LOCAL_SUFFIXES) and f[0] != ".")
    if not files:
        raise DataError(
            f"no text ({', '.join(TEXT_SUFFIXES)}), .jsonl or .parquet files under {path}; point to a folder of text"
        )
    return sorted(files, key=lambda p: p.relative_to(path).as_posix())


def compile_doc_separator(separator: str) -> re.Pattern:
    """Compile a ``doc_separator`` regex; DataError if it does not compile or matches the empty string."""
    if not isinstance(separator, str):
        raise DataError(f"doc_separator must be a regular expression string, got {type(separator).__name__}")
    try:
        pattern = re.compile(separator)
    except re.error as e:
        raise DataError(f"doc_separator {separator!r} is not a valid regular expression ({e})") from e
    if pattern.search("") is not None:
        raise DataError(
            f"doc_separator {separator!r} matches the empty string, so it would cut everywhere; "
            r"use one that consumes text, e.g. '\n\s*\n' for blank lines"
        )
    return pattern


def split_documents(text: str, separator: re.Pattern) -> Iterator[str]:
    """The documents of ``text`` cut at ``separator``'s matches (dropped), skipping blank ones."""
    pos = 0
    for m in separator.finditer(text):
        if m.end() == m.start():
            continue  # a zero-width match (a lookaround) separates nothing
        piece = text[pos : m.start()]
        if piece.strip():
            yield piece
        pos = m.end()
    piece = text[pos:]
    if piece.strip():
        yield piece


class Source:
    """A document source; iterating it yields the documents (``str``) afresh each time, in a fixed order."""

    def __init__(self, name: str, text_field: str = "text", encoding_errors: str = "skip"):
        self.name = name  # the normalised source string stored in meta.json
        self.text_field = text_field
        self.doc_separator: str | None = None  # the rule that cuts .txt files into documents; None: whole files
        self.encoding_errors = encoding_errors
        self.skipped: list[str] = []  # files left out as not UTF-8 by the latest pass, relative to the source

    def __iter__(self) -> Iterator[str]:
        raise NotImplementedError


class StdlibSource(Source):
    """The ``.py`` files of the running interpreter's standard library."""

    def __iter__(self) -> Iterator[str]:
        self.skipped = []
        root = Path(sysconfig.get_paths()["stdlib"])
        for f in list_stdlib_files():
            try:
                raw = f.read_bytes()
            except OSError:
                continue  # unreadable (permissions): not part of the corpus
            text = _decode(f, raw, self.encoding_errors)  # a few stdlib test files are Latin-1 on purpose
            if text is None:
                self.skipped.append(f.relative_to(root).as_posix())
            elif text:
                yield text


class LocalSource(Source):
    """A local text, ``.jsonl`` or ``.parquet`` file or folder."""

    def __init__(
        self, path: Path, text_field: str = "text", doc_separator: str | None = None, encoding_errors: str = "skip"
    ):
        super().__init__(str(path), text_field, encoding_errors)
        self.files = list_local_files(path)
        self._root = path if path.is_dir() else path.parent
        has_txt = any(f.suffix in TEXT_SUFFIXES for f in self.files)
        if doc_separator is None:
            doc_separator = DEFAULT_DOC_SEPARATOR if path.is_file() and has_txt else ""
        elif doc_separator and not has_txt:
            raise DataError(f"doc_separator cuts .txt files, and source {path} has none; leave it out")
        self.doc_separator = doc_separator or None
        self._pattern = compile_doc_separator(doc_separator) if doc_separator else None

    def __iter__(self) -> Iterator[str]:
        self.skipped = []
        for f in self.files:
            if f.suffix in TEXT_SUFFIXES:
                text = _decode(f, f.read_bytes(), self.encoding_errors)
                if text is None:
                    self.skipped.append(f.relative_to(self._root).as_posix())
                elif self._pattern is None:
                    if text:
                        yield text
                else:
                    yield from split_documents(text, self._pattern)
            elif f.suffix == ".jsonl":
                yield from _read_jsonl(f, self.text_field)
            else:
                yield from _read_parquet(f, self.text_field)


def _decode(path: Path, raw: bytes, errors: str) -> str | None:
    """A file's text as UTF-8 under the ``encoding_errors`` policy; None when it is not UTF-8 and is skipped."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if errors == "replace":
            return raw.decode("utf-8", errors="replace")
        if errors == "skip":
            return None
        raise DataError(
            f"{path} is not UTF-8 text (byte {e.start}); convert it to UTF-8, or pass --encoding-errors skip to "
            "leave it out or --encoding-errors replace to keep it with U+FFFD"
        ) from e


def _read_jsonl(path: Path, field: str) -> Iterator[str]:
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{path}:{lineno} is not valid JSON ({e}); fix or remove that line") from e
            if not isinstance(row, dict) or field not in row:
                keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                raise DataError(f"{path}:{lineno} has no field {field!r} (found {keys}); set text_field")
            text = row[field]
            if text is None:
                continue
            if not isinstance(text, str):
                raise DataError(f"{path}:{lineno} field {field!r} is {type(text).__name__}, not a string")
            if text:
                yield text


def _read_parquet(path: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataError(f"reading {path} needs pyarrow; install it with pip install 'angpt[hf]'") from e
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for non-parquet files
        raise DataError(f"{path} is not a readable parquet file ({e}); fix or remove it") from e
    names = pf.schema_arrow.names
    if field not in names:
        raise DataError(f"{path} has no column {field!r} (columns: {names}); set text_field")
    # Stream row groups in batches so multi-GB files never sit in memory whole.
    for batch in pf.iter_batches(columns=[field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            if text:
                if not isinstance(text, str):
                    raise DataError(f"{path} column {field!r} holds {type(text).__name__}, not strings")
                yield text


class HFSource(Source):
    """A source read through ``datasets`` (see the module docstring for the ``hf:`` syntax)."""

    def __init__(self, spec: str, text_field: str = "text"):
        rest = spec[3:]
        self.split = "train"
        m = _SPLIT_SUFFIX.search(rest)
        if m:
            self.split, rest = m.group(1), rest[: m.start()]
        self.builder = self.path = self.config = self.hub_name = None
        self.data_files: list[str] | None = None
        head, _, tail = rest.partition(":")
        if head in HF_BUILDERS and tail:
            self.builder = head
            self.data_files = [_abs_glob(p.strip()) for p in tail.split(",") if p.strip()]
            for pattern in self.data_files:
                if "://" not in pattern and not glob.glob(pattern, recursive=True):
                    raise DataError(f"no files match {pattern!r} in source {spec!r}; check the path")
            rest = f"{head}:{','.join(self.data_files)}"
        elif os.path.exists(os.path.expanduser(rest)):
            self.path = os.path.abspath(os.path.expanduser(rest))
            rest = self.path
        elif tail and os.path.exists(os.path.expanduser(head)):
            self.path, self.config = os.path.abspath(os.path.expanduser(head)), tail
            rest = f"{self.path}:{tail}"
        elif _HUB_NAME.match(head) and (not tail or _HUB_NAME.match(tail)):
            self.hub_name, self.config = head, tail or None
        else:
            raise DataError(
                f"bad source {spec!r}: use hf:ORG/NAME[:CONFIG][@SPLIT], hf:BUILDER:FILES or hf:/local/folder"
            )
        suffix = "" if self.split == "train" else f"@{self.split}"
        super().__init__(f"hf:{rest}{suffix}", text_field)

    def _open(self):
        try:
            import datasets
        except ImportError as e:
            raise DataError(f"source {self.name} needs datasets; install it with pip install 'angpt[hf]'") from e
        if self.builder:
            return self._call(datasets.load_dataset, self.builder, data_files=self.data_files)
        if self.path and os.path.isdir(self.path) and _is_saved_dataset(self.path):
            ds = self._call(datasets.load_from_disk, self.path)
            if isinstance(ds, datasets.DatasetDict):
                if self.split not in ds:
                    raise DataError(f"{self.path} has no split {self.split!r} (splits: {list(ds)}); add @SPLIT")
                ds = ds[self.split]
            return ds
        if self.path:
            return self._call(datasets.load_dataset, self.path, self.config)
        # datasets would retry an unreachable Hub for ~30 s; probe first unless it is in offline mode anyway
        # (offline mode set after datasets was imported is not seen by it, so we honour the variable here).
        seen_offline = getattr(
            datasets.config, "HF_HUB_OFFLINE", getattr(datasets.config, "HF_DATASETS_OFFLINE", False)
        )
        if not seen_offline and (hub_offline() or not hub_reachable()):  # (datasets < 2.19 names it HF_DATASETS_...)
            raise DataError(
                f"cannot reach the Hugging Face Hub for dataset {self.hub_name!r} (no network or offline mode); "
                "use a local path or hf:BUILDER:FILES, or set HF_HUB_OFFLINE=1 at start to use a cached copy"
            )
        return self._call(datasets.load_dataset, self.hub_name, self.config)

    def _call(self, fn, *args, **kwargs):
        if fn.__name__ == "load_dataset":
            kwargs.update(split=self.split, streaming=True)
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # datasets/hub raise many unrelated classes (ConnectionError, 404, ValueError)
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DataError(f"cannot load dataset {self.name}: {msg}; check the name, split and network") from e

    def __iter__(self) -> Iterator[str]:
        ds = self._open()
        field = self.text_field
        for batch in ds.iter(batch_size=1000):
            if field not in batch:
                raise DataError(f"dataset {self.name} has no column {field!r} (columns: {list(batch)}); set text_field")
            for text in batch[field]:
                if text:
                    if not isinstance(text, str):
                        raise DataError(f"dataset {self.name} column {field!r} holds {type(text).__name__}")
                    yield text


def _abs_glob(pattern: str) -> str:
    return pattern if "://" in pattern else os.path.abspath(os.path.expanduser(pattern))


def _is_saved_dataset(path: str) -> bool:
    """Whether ``path`` was written by ``save_to_disk`` (a Dataset or a DatasetDict)."""
    p = Path(path)
    return (p / "dataset_dict.json").is_file() or ((p / "state.json").is_file() and (p / "dataset_info.json").is_file())


def open_source(
    source: str | os.PathLike,
    text_field: str = "text",
    doc_separator: str | None = None,
    encoding_errors: str = "skip",
) -> Source:
    """Parse a source string (``stdlib``, a local path, or ``hf:...``) into a re-iterable :class:`Source`.

    ``doc_separator`` says how ``.txt`` files are cut into documents (see the module docstring); the rule
    applied is the source's ``doc_separator`` attribute (None when each file is one document).
    ``encoding_errors`` (skip | replace | strict) says what a file that is not UTF-8 does.
    """
    if not isinstance(source, str | os.PathLike):
        raise DataError(f"data source must be a string or path, got {type(source).__name__}")
    if encoding_errors not in ENCODING_ERRORS:
        raise DataError(f"encoding_errors must be one of {', '.join(ENCODING_ERRORS)}, got {encoding_errors!r}")
    s = os.fspath(source)
    if s == "stdlib" or s.startswith("hf:"):
        if doc_separator:
            raise DataError(f"doc_separator cuts local .txt files, and source {s!r} has none; leave it out")
        if s == "stdlib":
            return StdlibSource("stdlib", text_field, encoding_errors)
        return HFSource(s, text_field)  # datasets hands over decoded strings
    return LocalSource(Path(os.path.abspath(os.path.expanduser(s))), text_field, doc_separator, encoding_errors)
