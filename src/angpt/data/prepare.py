"""Turn a text source into a prepared dataset folder of token shards (see :mod:`angpt.data.format`)."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from angpt.data.format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    META_NAME,
    SPLITS,
    ShardWriter,
    dtype_for_vocab,
    file_sha256,
    load_meta,
    open_shard,
    save_meta,
    write_shard,
)
from angpt.data.sources import DEFAULT_DOC_SEPARATOR, TEXT_SUFFIXES, Source, StdlibSource, open_source
from angpt.data.splits import AUTO, auto_fractions, larger_fractions, split_value, split_warnings
from angpt.data.tokenizer import Tokenizer, make_tokenizer, parse_tokenizer_spec, train_bpe
from angpt.errors import DataError

DEFAULT_SHARD_TOKENS = 100_000_000
DEFAULT_TOKENIZER_TRAIN_BYTES = 50_000_000
_CHUNK_BYTES = 4 << 20  # text per encode_batch call: large enough to keep all cores busy, small in memory
_CHUNK_DOCS = 4096


def prepare_dataset(
    source: str | os.PathLike,
    tokenizer: str | Tokenizer,
    out_dir: str | os.PathLike,
    *,
    val_fraction: float | str = AUTO,
    test_fraction: float | None = None,
    max_tokens: int | None = None,
    text_field: str = "text",
    workers: int | None = None,
    progress: bool = True,
    seed: int = 0,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    tokenizer_train_bytes: int = DEFAULT_TOKENIZER_TRAIN_BYTES,
    doc_separator: str | None = None,
    encoding_errors: str = "skip",
    overwrite: bool = False,
) -> dict:
    """Tokenize ``source`` into train/val token shards in ``out_dir`` and return the dataset's meta dict.

    Args:
        source: ``"stdlib"``, a local file/folder, or ``"hf:..."`` (see :mod:`angpt.data.sources`).
        tokenizer: ``"bytes"``, ``"bpe:N"``, ``"hf:NAME_OR_PATH"`` (see :mod:`angpt.data.tokenizer`) or a
            :class:`Tokenizer`. ``bpe:N`` is trained on the first ``tokenizer_train_bytes`` of train-split text.
        out_dir: the dataset folder: new, empty, or already holding this same dataset.
        val_fraction: share of documents (by hash of their text) put in the val split; if none lands there and
            there are at least two documents, the train document with the smallest hash is moved to val.
            ``"auto"`` (default): 0.5% of the documents, but at least 20 documents and 50,000 byte-tokens, at most
            10% (:func:`angpt.data.splits.auto_fractions`: the rule, why, and the pass over the source it takes).
            The fraction used is recorded (``val_fraction``), with ``options.val_fraction_rule`` auto or given.
        test_fraction: share put in the test split, next in hash order (None: as many documents as val; exactly
            as many under auto). Validation is for
            selection (learning rates, settings), test for the numbers reported (docs/protocol.md); 0: no test split.
        max_tokens: stop after this many tokens in total (the last document is cut to fit).
        text_field: the field/column holding the text in ``.jsonl``, ``.parquet`` and ``hf:`` sources.
        workers: ``None`` (default) tokenizes through the ``tokenizers`` thread pool (sized by ``RAYON_NUM_THREADS``,
            all cores by default); ``1`` serially; ``N >= 2`` in N worker processes, a few chunks of documents ahead
            (on many cores the faster: the thread pool waits for each chunk's largest document). The dataset is
            the same whichever.
        progress: show a tqdm bar.
        seed: keys the split hash, so a different seed draws a different val set.
        shard_tokens: tokens per shard file.
        tokenizer_train_bytes: cap on the text used to fit ``bpe:N`` (also capped at ``8 * max_tokens``).
        doc_separator: how ``.txt`` files are cut into documents. ``None`` (default): a source that is one
            ``.txt`` file is cut at blank lines (one or more empty or whitespace-only lines), while each ``.txt``
            file of a folder is one document; a regex: every ``.txt`` file is cut at its matches; ``""``: every
            ``.txt`` file is one document. See :mod:`angpt.data.sources`; the rule applied is recorded as
            ``options.doc_separator`` (None for whole files).
        encoding_errors: what a file that is not UTF-8 does (see :mod:`angpt.data.sources`): ``"skip"`` leaves it
            out with a warning naming it (listed in ``meta.json`` as ``skipped_files``), so one stray Latin-1 file
            does not stop a long prepare; ``"replace"`` keeps it with U+FFFD for each bad byte; ``"strict"`` stops
            with a one-line error naming the file.
        overwrite: replace the prepared dataset in ``out_dir`` (a folder with ``meta.json`` holding only the files
            prepare writes) by a fresh one, even one prepared with the same arguments. The new dataset is built
            beside it and swapped in only when complete, so a failed or interrupted re-prepare leaves the old one
            as it was. Any other non-empty folder is still refused.

    Refused with a one-line DataError, writing nothing: a train split that would be empty, and a validation
    split that would be empty although ``val_fraction > 0`` (one document, say a single ``.txt`` file without
    blank lines). ``val_fraction=0`` asks for a train-only dataset, which training refuses
    (:func:`check_trainable`).

    Returns the meta (also saved as ``meta.json``): options, tokenizer spec/hash/vocab_size/eos_id, dtype and
    per split the shard list with token counts, documents, UTF-8 ``bytes`` and ``tokens`` (EOS included), so
    ``bits_per_byte = loss_nats_per_token / ln(2) / bytes_per_token``.

    Re-running with the same arguments on a finished folder returns its meta without building anything (auto
    reads the source first, to fix its fraction); other arguments are refused unless ``overwrite``. A folder
    prepared before auto existed is reused as it is by ``val_fraction="auto"``, at the fraction it was prepared
    at. The dataset is built in a hidden temporary folder beside ``out_dir`` and renamed into place when complete,
    so ``out_dir`` is never left half-written.
    """
    spec = tokenizer.spec if isinstance(tokenizer, Tokenizer) else tokenizer
    parse_tokenizer_spec(spec)
    given_test, auto = test_fraction is not None, isinstance(val_fraction, str) and val_fraction == AUTO
    _check_options(val_fraction, max_tokens, shard_tokens, tokenizer_train_bytes, workers)
    if not auto and test_fraction is None:  # as many documents as validation, while training keeps the larger share
        test_fraction = val_fraction if 2 * val_fraction < 1 else 0.0
    if given_test or not auto:
        _check_test_fraction(0.0 if auto else val_fraction, test_fraction)
    src = open_source(source, text_field, doc_separator, encoding_errors)
    out_dir = Path(out_dir).expanduser().absolute()
    replacing = overwrite and (out_dir / META_NAME).is_file()
    if replacing:
        _check_replaceable(out_dir)
    elif not (out_dir / META_NAME).is_file():
        _check_free(out_dir)
    if auto:  # from the documents, before any is assigned
        val_fraction, test_fraction = auto_fractions(src, seed, max_tokens, test_fraction)
        _check_test_fraction(val_fraction, test_fraction)
    options = dict(
        source=src.name, tokenizer=spec, val_fraction=float(val_fraction), test_fraction=float(test_fraction),
        max_tokens=max_tokens, text_field=text_field, seed=int(seed), shard_tokens=int(shard_tokens),
        tokenizer_train_bytes=int(tokenizer_train_bytes), doc_separator=src.doc_separator,
        encoding_errors=encoding_errors, val_fraction_rule=AUTO if auto else "given",
    )  # fmt: skip
    existing = None if replacing else _existing_dataset(out_dir, options, given_test)
    if existing is not None:
        return existing

    meta = _build_into(out_dir, replacing, workers, lambda tmp: _build(
        src, tokenizer, tmp, options, progress=progress, parallel=workers != 1,
        processes=workers if workers is not None and workers >= 2 else 0,
    ))  # fmt: skip
    for line in skip_warnings(meta) + split_warnings(meta) + reprepare_hint(meta, out_dir):
        print(f"warning: {line}", file=sys.stderr)
    return meta


def _build_into(out_dir: Path, replacing: bool, workers: int | None, build) -> dict:
    """`build(folder)`'s dataset in a hidden temporary folder beside `out_dir`, renamed into place when complete
    (swapped in for the one `out_dir` holds, `replacing`); on any failure it and the parents this call made are
    removed, so a refused prepare leaves nothing behind."""
    made = [p for p in reversed(out_dir.parents) if not p.exists()]  # parents this call creates
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        with _parallelism(workers):
            meta = build(tmp)
        save_meta(tmp, meta)  # meta.json last: its presence marks a complete dataset
        if replacing:
            _swap_in(tmp, out_dir)
        else:
            if out_dir.exists():
                out_dir.rmdir()  # checked empty above; rename cannot replace it portably
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for parent in reversed(made):  # a refused prepare leaves nothing behind, not even empty parents
            try:
                parent.rmdir()
            except OSError:
                break
        raise
    return meta


def skip_warnings(meta: dict) -> list[str]:
    """The files a dataset left out because they are not UTF-8, named, with the options that keep them."""
    skipped = meta.get("skipped_files", [])
    if not skipped:
        return []
    names = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more (all in meta.json)" if len(skipped) > 5 else "")
    files = "file that is" if len(skipped) == 1 else "files that are"
    return [
        f"left out {len(skipped)} {files} not UTF-8 text: {names}; --encoding-errors replace keeps them with "
        "U+FFFD for the bad bytes, or convert them to UTF-8"
    ]


def _check_options(val_fraction, max_tokens, shard_tokens, train_bytes, workers) -> None:
    if val_fraction != AUTO and (not isinstance(val_fraction, int | float) or not 0.0 <= val_fraction < 1.0):
        raise DataError(f"val_fraction must be 'auto' or in [0, 1), got {val_fraction!r}; e.g. 0.02")
    for name, value, low in (("max_tokens", max_tokens, 1), ("workers", workers, 1)):
        if value is not None and (not isinstance(value, int) or value < low):
            raise DataError(f"{name} must be a positive integer or None, got {value!r}")
    for name, value in (("shard_tokens", shard_tokens), ("tokenizer_train_bytes", train_bytes)):
        if not isinstance(value, int) or value < 1:
            raise DataError(f"{name} must be a positive integer, got {value!r}")


def _check_test_fraction(val_fraction: float, test_fraction) -> None:
    if not isinstance(test_fraction, int | float) or not 0.0 <= test_fraction < 1.0 - val_fraction:
        raise DataError(f"test_fraction must be in [0, 1 - val_fraction), got {test_fraction!r}; e.g. 0.02")


def _not_compared(old: dict, new: dict, given_test: bool) -> set[str]:
    """The options an existing dataset's (`old`) are not compared on: the fraction rule (the fractions it gave
    are), and options it predates where the call's value is what happened then: no test split unless one is asked
    for, a file that is not UTF-8 left out (stdlib) or stopping prepare (other sources), and under auto the
    fractions it was prepared at (it is reused as it is)."""
    skip = {"val_fraction_rule"}
    if "test_fraction" not in old and not given_test:
        skip.add("test_fraction")
    if "encoding_errors" not in old and new["encoding_errors"] == "skip":
        skip.add("encoding_errors")
    if "val_fraction_rule" not in old and new["val_fraction_rule"] == AUTO:
        skip.update(("val_fraction",) if given_test else ("val_fraction", "test_fraction"))
    return skip


def _existing_dataset(out_dir: Path, options: dict, given_test: bool) -> dict | None:
    """The meta of a finished identical dataset in ``out_dir`` (see :func:`_not_compared`), None without
    ``meta.json``, else DataError."""
    if (out_dir / META_NAME).is_file():
        meta = load_meta(out_dir)
        old = meta.get("options", {})
        skip = _not_compared(old, options, given_test)
        diff = [k for k in options if old.get(k) != options[k] and k not in skip]
        if diff:
            what = ", ".join(f"{k}={old.get(k)!r} (now {options[k]!r})" for k in diff)
            raise DataError(
                f"{out_dir} already holds a dataset prepared with {what}; use another --out, or --overwrite to "
                "replace it"
            )
        itemsize = dtype_for_vocab(meta["vocab_size"]).itemsize
        for split in meta["splits"].values():
            for shard in split["shards"]:
                path = out_dir / shard["file"]
                if not path.is_file() or path.stat().st_size != HEADER_SIZE + shard["tokens"] * itemsize:
                    raise DataError(f"{path} is missing or has the wrong size; prepare again with --overwrite")
        return meta
    return None


def _check_free(out_dir: Path) -> None:
    """DataError unless ``out_dir`` is new or an empty folder."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DataError(
            f"{out_dir} exists and is not a prepared dataset; pass an empty or new folder (--overwrite replaces "
            "only a prepared dataset)"
        )


# What prepare writes into a dataset folder: meta.json, the tokenizer, the shards, and its hidden temporary files.
_DATASET_FILE = re.compile(r"meta\.json|tokenizer\.json|angpt_tokenizer\.json|(train|val|test)_\d{6}\.bin|\..+\.tmp")


def _check_replaceable(out_dir: Path) -> None:
    """DataError unless ``out_dir`` holds only what prepare writes, so --overwrite deletes nothing of the user's."""
    others = sorted(p.name for p in out_dir.iterdir() if not (p.is_file() and _DATASET_FILE.fullmatch(p.name)))
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        raise DataError(
            f"{out_dir} holds a prepared dataset and also {', '.join(others[:3])}{more}, which --overwrite would "
            "delete; move them out or use another --out"
        )


def _swap_in(new: Path, out_dir: Path) -> None:
    """Put the complete dataset ``new`` where the dataset ``out_dir`` is; the old one is deleted only once the new
    one stands in its place, and a failed rename puts it back."""
    old = new.with_name(new.name.replace(".tmp-", ".old-"))
    os.replace(out_dir, old)
    try:
        os.replace(new, out_dir)
    except BaseException:
        os.replace(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _parallelism(workers: int | None):
    """With ``workers == 1`` switch off the tokenizers thread pool for the duration (restoring the env)."""
    if workers != 1:
        yield
        return
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def _chunks(docs: Iterable[str]) -> Iterator[list[str]]:
    batch, size = [], 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= _CHUNK_BYTES or len(batch) >= _CHUNK_DOCS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encoded(
    chunks: Iterable[list[str]], tok: Tokenizer, seed: int, *, processes: int, parallel: bool
) -> Iterator[list[tuple[np.ndarray, float, int]]]:
    """Each chunk of documents as (token ids, split value, UTF-8 bytes) per document, in order: in this process
    (through the tokenizers thread pool when `parallel`), or with `processes` >= 2 in as many worker processes, a
    few chunks ahead (the tokenizer holds the interpreter while it encodes without its pool: threads would queue)."""
    if processes < 2:
        for chunk in chunks:
            ids = tok.encode_batch(chunk, parallel=parallel)
            yield [(i, *_split_of(text, seed)) for i, text in zip(ids, chunk)]
        return
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    # fork where there is one: the workers then need nothing re-imported (a spawned worker imports the package)
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    state = (tok.spec, tok.kind, tok.json, tok.vocab_size, tok.eos_token, seed)
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_worker_init, initargs=state) as pool:
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.submit(_worker_encode, chunk))
            if len(pending) >= 2 * processes:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _split_of(text: str, seed: int) -> tuple[float, int]:
    raw = text.encode("utf-8")
    return split_value(raw, seed), len(raw)


_WORKER: dict = {}


def _worker_init(spec: str, kind: str, hf_json: str, vocab_size: int, eos_token: str | None, seed: int) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process, one core
    _WORKER["tok"] = Tokenizer(spec, kind, hf_json, vocab_size, "", eos_token)
    _WORKER["seed"] = seed


def _worker_encode(chunk: list[str]) -> list[tuple[np.ndarray, float, int]]:
    tok, seed = _WORKER["tok"], _WORKER["seed"]
    ids = tok.encode_batch(chunk, parallel=True)  # the fast batch path, its thread pool off (above)
    return [(i.astype(dtype_for_vocab(tok.vocab_size)), *_split_of(text, seed)) for i, text in zip(ids, chunk)]


def _train_texts(src: Source, options: dict) -> Iterator[list[str]]:
    """Batches of train-split documents for fitting BPE, up to the byte cap, in source order."""
    cap = options["tokenizer_train_bytes"]
    if options["max_tokens"]:
        cap = min(cap, 8 * options["max_tokens"])  # no tokenizer packs more than ~8 bytes/token on average
    used = 0
    for chunk in _chunks(src):
        batch = []
        for doc in chunk:
            raw = doc.encode("utf-8")
            if split_value(raw, options["seed"]) >= options["val_fraction"] + options["test_fraction"]:
                batch.append(doc)
                used += len(raw)
                if used >= cap:
                    break
        yield batch
        if used >= cap:
            return


def _build(
    src: Source, tokenizer, out: Path, options: dict, *, progress: bool, parallel: bool, processes: int = 0
) -> dict:
    from tqdm.auto import tqdm

    start = time.time()
    kind, arg = parse_tokenizer_spec(options["tokenizer"])
    if isinstance(tokenizer, Tokenizer):
        tok = tokenizer
    elif kind == "bpe":
        tok = train_bpe(_train_texts(src, options), arg, progress=progress)
    else:
        tok = make_tokenizer(options["tokenizer"])
    tok.save(out)

    kw = {"vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "tokenizer_hash": tok.hash}
    splits = SPLITS if options["test_fraction"] > 0 else tuple(s for s in SPLITS if s != "test")
    writers = {s: ShardWriter(out, s, shard_tokens=options["shard_tokens"], **kw) for s in splits}
    stats = {s: {"documents": 0, "bytes": 0} for s in splits}
    eos = np.array([tok.eos_id], dtype=np.int64)
    max_tokens, val_fraction, seed = options["max_tokens"], options["val_fraction"], options["seed"]
    held_out = val_fraction + options["test_fraction"]  # [0, vf): val; [vf, vf + tf): test; the rest: train
    total = 0
    best = None  # (hash value, start, length, bytes) of the train doc nearest to val, for the fallback below
    bar = tqdm(total=max_tokens, unit="tok", unit_scale=True, desc="tokenizing", disable=not progress)
    try:
        for chunk in _encoded(_chunks(src), tok, seed, processes=processes, parallel=parallel):
            parts = {s: [] for s in splits}
            offset = writers["train"].tokens
            for ids, u, nbytes in chunk:
                split = "val" if u < val_fraction else ("test" if u < held_out else "train")
                ids = np.concatenate([ids, eos])
                if max_tokens is not None and total + ids.size > max_tokens:
                    ids = ids[: max_tokens - total]  # cut the last document so the cap holds exactly
                    nbytes = ids.size if tok.kind == "bytes" else len(tok.decode(ids).encode("utf-8"))
                if split == "train":
                    if best is None or u < best[0]:
                        best = (u, offset, ids.size, nbytes)
                    offset += ids.size
                parts[split].append(ids)
                stats[split]["documents"] += 1
                stats[split]["bytes"] += nbytes
                total += ids.size
                if max_tokens is not None and total >= max_tokens:
                    break
            for s in splits:
                if parts[s]:
                    writers[s].write(np.concatenate(parts[s]))
            bar.update(sum(p.size for s in splits for p in parts[s]))
            if max_tokens is not None and total >= max_tokens:
                break
        writers["train"].close()
        if val_fraction > 0 and stats["val"]["documents"] == 0 and stats["train"]["documents"] >= 2:
            _move_to_val(out, writers, best, kw)
            for key, value in (("documents", 1), ("bytes", best[3])):
                stats["train"][key] -= value
                stats["val"][key] += value
        writers["val"].close()
        if "test" in writers:
            writers["test"].close()
        for s in splits:
            for shard in writers[s].shards:  # the whole file, after any rewrite by _move_to_val
                shard["sha256"] = file_sha256(out / shard["file"], cached=False)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        bar.close()
    _check_splits(src, stats, options, capped=max_tokens is not None and total >= max_tokens)
    capped = max_tokens is not None and total >= max_tokens
    return _meta(src, tok, options, writers, stats, capped, time.time() - start)


def _check_splits(src: Source, stats: dict, options: dict, *, capped: bool) -> None:
    """Refuse (DataError, one line) a dataset whose train split, or val split when asked for, would be empty."""
    train, val = stats["train"]["documents"], stats["val"]["documents"]
    total, vf = train + val, options["val_fraction"]
    if total == 0:
        files = getattr(src, "files", ())
        if src.skipped:
            raise DataError(
                f"source {src.name} yielded no documents: its files are not UTF-8 text ({src.skipped[0]}"
                f"{' and more' if len(src.skipped) > 1 else ''}); pass --encoding-errors replace or convert them"
            )
        if files and all(f.suffix in TEXT_SUFFIXES for f in files):
            raise DataError(f"source {src.name} yielded no documents: its text files are empty; check the path")
        raise DataError(f"source {src.name} yielded no documents; check the path and text_field")
    if train == 0:
        raise DataError(
            f"the train split would be empty: all {total} document(s) of {src.name} hash into validation at "
            f"--val-fraction {vf}; lower --val-fraction or add documents (nothing was written)"
        )
    if vf > 0 and val == 0:
        doc = "document" if total == 1 else "documents"
        if capped:
            why = f"--max-tokens {options['max_tokens']} keeps {total} {doc}"
            fix = "raise --max-tokens"
        else:
            why = f"source {src.name} gave {total} {doc}"
            fix = "give more documents (a folder of files, or .jsonl with one per line)"
        if any(f.suffix in TEXT_SUFFIXES for f in getattr(src, "files", ())):
            rule = options.get("doc_separator")
            how = f"cut at {rule!r}" if rule else "kept whole"
            how = "cut at blank lines" if rule == DEFAULT_DOC_SEPARATOR else how
            why += f" (text files {how})"
        raise DataError(
            f"the validation split would be empty: {why}, and train and validation need 2 at least; {fix}, or "
            "cut the text into documents with --doc-separator REGEX; nothing was written"
        )


def _move_to_val(out: Path, writers: dict, best: tuple, kw: dict) -> None:
    """Cut the train span ``best`` out of the (closed) train shards and append it to the val writer."""
    _, start, length, _ = best
    pieces, base = [], 0
    for shard in writers["train"].shards:
        n = shard["tokens"]
        lo, hi = max(start, base), min(start + length, base + n)
        if lo < hi:
            path = out / shard["file"]
            data = np.array(open_shard(path))
            pieces.append(data[lo - base : hi - base])
            keep = np.concatenate([data[: lo - base], data[hi - base :]])
            write_shard(path, keep, **kw)
            shard["tokens"] = int(keep.size)
        base += n
    writers["train"].tokens -= length
    writers["val"].write(np.concatenate(pieces))


def _angpt_version() -> str:
    import angpt

    version = getattr(angpt, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import version as dist_version

        return dist_version("angpt")
    except Exception:  # not installed (running from a source tree)
        return "unknown"


def _meta(src: Source, tok: Tokenizer, options, writers, stats, capped: bool, seconds: float) -> dict:
    splits = {}
    for s in (s for s in SPLITS if s in writers):
        tokens = writers[s].tokens
        splits[s] = {
            "shards": writers[s].shards,
            "documents": stats[s]["documents"],
            "tokens": tokens,
            "bytes": stats[s]["bytes"],
            "bytes_per_token": stats[s]["bytes"] / tokens if tokens else 0.0,
        }
    detail = {}
    if isinstance(src, StdlibSource):
        detail = {"stdlib": sysconfig.get_paths()["stdlib"], "python": sys.version.split()[0]}
    return {
        "format": "angpt-tokens",
        "format_version": FORMAT_VERSION,
        "angpt_version": _angpt_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 3),
        "options": options,
        "source": src.name,
        "source_detail": detail,
        "tokenizer": {
            "spec": tok.spec,
            "kind": tok.kind,
            "hash": tok.hash,
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id,
            "eos_token": tok.eos_token,
        },
        "tokenizer_hash": tok.hash,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype_for_vocab(tok.vocab_size).name,
        "val_fraction": options["val_fraction"],
        "test_fraction": options["test_fraction"],
        "seed": options["seed"],
        "max_tokens": options["max_tokens"],
        "capped": capped,  # max_tokens was reached (the source may hold more)
        "documents": sum(v["documents"] for v in splits.values()),
        "tokens": sum(v["tokens"] for v in splits.values()),
        "bytes": sum(v["bytes"] for v in splits.values()),
        "skipped_files": list(src.skipped),  # not UTF-8, left out (encoding_errors skip); paths within the source
        "splits": splits,
    }


def reprepare_hint(meta: dict, out_dir: str | Path) -> list[str]:
    """The line naming how to prepare ``out_dir`` again with larger held-out splits (data/splits.py proposes the
    fractions), as a command with the source's own options; nothing when no split is too small or larger shares
    would not help."""
    fractions = larger_fractions(meta)
    if fractions is None:
        return []
    options = meta.get("options", {})
    val, test = (repr(float(fractions[s])) for s in ("val", "test"))
    no_flag = {"seed": 0, "shard_tokens": DEFAULT_SHARD_TOKENS, "tokenizer_train_bytes": DEFAULT_TOKENIZER_TRAIN_BYTES}
    if any(options.get(k, v) != v for k, v in no_flag.items()):  # the command line cannot say these
        again = f"val_fraction={val}, test_fraction={test} and overwrite=True"
        return [f"to re-prepare with larger held-out splits, call prepare again with {again}"]
    argv = ["angpt", "prepare", "--source", options["source"], "--tokenizer", options["tokenizer"]]
    argv += ["--out", str(out_dir)]
    if options.get("max_tokens") is not None:
        argv += ["--max-tokens", str(options["max_tokens"])]
    if options.get("text_field", "text") != "text":
        argv += ["--text-field", options["text_field"]]
    source, rule = options["source"], options.get("doc_separator")
    one_txt = (
        source != "stdlib"
        and not source.startswith("hf:")
        and source.endswith(TEXT_SUFFIXES)
        and Path(source).is_file()
    )
    if rule != (DEFAULT_DOC_SEPARATOR if one_txt else None):
        argv += ["--doc-separator", rule or ""]  # not what the source gets by default
    if options.get("encoding_errors", "skip") != "skip":
        argv += ["--encoding-errors", options["encoding_errors"]]
    argv += ["--val-fraction", val, "--test-fraction", test, "--overwrite"]
    return [f"to re-prepare with larger held-out splits (replacing this one): {shlex.join(argv)}"]
