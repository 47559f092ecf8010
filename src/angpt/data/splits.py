"""Which documents are held out: the hash rule that puts a document in train, validation or test, the ``auto``
share that gives a small corpus enough held-out documents, and the warning (with the larger shares to prepare it
again with) when a held-out split is still too small to measure anything."""

from __future__ import annotations

import hashlib
import math

from angpt.data.sources import Source

AUTO = "auto"
# A validation split below these measures little: the loss of 50K tokens from 20 documents moves by a few
# hundredths of a nat from one checkpoint to the next on noise alone, and one document's style dominates it.
MIN_VAL_TOKENS, MIN_VAL_DOCUMENTS = 50_000, 20
AUTO_SHARE = 0.005  # what a large corpus holds out: thousands of documents, and training keeps 99%
AUTO_MAX_SHARE = 0.1  # the most auto takes from a small corpus for each held-out split
_SUGGESTED = (0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.2)  # fractions the small-split warning proposes, at most 0.2


def split_value(text: str | bytes, seed: int = 0) -> float:
    """A document's position in [0, 1), from a keyed blake2b hash of its UTF-8 text.

    Documents with ``split_value < val_fraction`` go to the val split: the choice depends only on the text and
    the seed, so it is stable across runs, machines and source order, and duplicates share a split.
    """
    raw = text.encode("utf-8") if isinstance(text, str) else text
    digest = hashlib.blake2b(raw, digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def auto_fractions(src: Source, seed: int, max_tokens: int | None, test_fraction: float | None) -> tuple[float, float]:
    """The ``auto`` validation fraction, and the test fraction (``test_fraction``, or when None as many documents).

    The rule: 0.5% of the documents, but at least ``MIN_VAL_DOCUMENTS`` documents holding ``MIN_VAL_TOKENS``
    byte-tokens (UTF-8 bytes + EOS: a byte tokenizer's count; BPE packs 3-4 bytes per token, so its split holds
    fewer tokens and prepare's warning says so), and at most 10% of the documents (at least one). Why: 0.5% is what
    a large corpus can spare unnoticed and already holds thousands of documents, while a corpus of a few hundred
    files at 0.5% holds out one or two documents, whose loss says more about them than about the model; 10% keeps
    the bulk of a small corpus for training.

    Documents are still assigned by ``split_value < fraction``; the fraction is fixed before any is assigned, by one
    pass over the source that keeps each document's hash value and size. The pass stops as soon as 0.5% of what it
    read meets both minimums (4,000 documents and 10 MB): that corpus gets 0.005 and only that prefix is read twice.
    A smaller corpus gets a fraction between two consecutive hash values, so that validation holds exactly the k
    documents the rule asks for, and test (when not given) the next k. With ``max_tokens`` the pass stops at the cap
    counting bytes + 1 per document (exact for a byte tokenizer; under BPE more documents fit, and they are assigned
    by the same fraction). Fewer than three documents get 0.005 and prepare's own rules (one moved to validation,
    or a refusal).
    """
    default = (AUTO_SHARE, AUTO_SHARE if test_fraction is None else test_fraction)
    scanned = _scan(src, seed, max_tokens)
    if scanned is None or len(scanned) < 3:
        return default
    scanned.sort()
    values = [u for u, _ in scanned]
    n, cap = len(values), max(1, int(AUTO_MAX_SHARE * len(values)))
    want, k, tokens = max(MIN_VAL_DOCUMENTS, math.ceil(AUTO_SHARE * n)), 0, 0
    while k < cap and (k < want or tokens < MIN_VAL_TOKENS):
        tokens += scanned[k][1]
        k += 1
    val = _cut(values, k)
    if val is None:  # nearly all documents are copies of one: let prepare's own checks speak
        return default
    if test_fraction is not None:
        return val[0], test_fraction
    test = _cut(values, val[1] + min(val[1], n - val[1] - 1))
    return val[0], 0.0 if test is None or test[1] == val[1] else test[0] - val[0]


def _scan(src: Source, seed: int, max_tokens: int | None) -> list[tuple[float, int]] | None:
    """(hash value, bytes + 1) of each document prepare will read; None once 0.5% of them meets the minimums."""
    out, total = [], 0
    for doc in src:
        raw = doc.encode("utf-8")
        out.append((split_value(raw, seed), len(raw) + 1))
        total += len(raw) + 1
        if max_tokens is not None and total >= max_tokens:
            break
        if AUTO_SHARE * len(out) >= MIN_VAL_DOCUMENTS and AUTO_SHARE * total >= MIN_VAL_TOKENS:
            return None
    return out


def _cut(values: list[float], k: int) -> tuple[float, int] | None:
    """(a fraction halfway between the k-th and the next larger sorted hash value, how many values lie below it);
    None when no larger value is left. Halfway, so that ``val + test`` rounded still falls between the same two."""
    while k < len(values) and values[k] == values[k - 1]:
        k += 1  # a duplicate document shares its copy's split
    return None if k >= len(values) else ((values[k - 1] + values[k]) / 2, k)


def split_warnings(meta: dict) -> list[str]:
    """What a user should know about a dataset's validation and test splits before training on it. Sizes are in
    bytes of text, the unit of ``auto``'s rule: a BPE split holding 50 KB is ~15K tokens, which ``auto`` chose on
    purpose and must not then warn about (issue 48)."""
    return [
        f"the {name} split holds {size:,} {unit} in {docs} documents: too few to measure progress reliably "
        f"(aim for >= {MIN_VAL_TOKENS:,} {unit} from >= {MIN_VAL_DOCUMENTS} documents); raise "
        f"--{split}-fraction (now {fraction:.3g}) or add documents"
        for split, name, size, unit, docs, fraction in _small_splits(meta)
    ]


def larger_fractions(meta: dict) -> dict[str, float] | None:
    """The held-out fractions to prepare a dataset again with, so that each small split reaches
    ``MIN_VAL_DOCUMENTS`` and ``MIN_VAL_TOKENS`` (the next of ``_SUGGESTED`` that would, scaling its counts): None
    when no split is too small, or when the largest suggested share holds no more (only more documents help)."""
    fractions = {split: _fraction(meta, split) or 0.0 for split in ("val", "test")}
    larger = False
    for split, _, size, _, docs, fraction in _small_splits(meta):
        need = fraction * max(MIN_VAL_DOCUMENTS / max(docs, 1), MIN_VAL_TOKENS / max(size, 1))
        fractions[split] = max(fraction, next((f for f in _SUGGESTED if f >= need), _SUGGESTED[-1]))
        larger = larger or fractions[split] > fraction
    return fractions if larger else None


def _small_splits(meta: dict):
    """(split, its name, size, its unit, documents, fraction) of each held-out split asked for but too small to
    measure: its size in bytes of text (``MIN_VAL_TOKENS`` byte-tokens, as ``auto`` counts), or in tokens for a
    dataset prepared before splits recorded their bytes."""
    for split, name in (("val", "validation"), ("test", "test")):
        held = meta.get("splits", {}).get(split, {})
        size, unit = (held["bytes"], "bytes") if "bytes" in held else (held.get("tokens", 0), "tokens")
        docs, fraction = held.get("documents", 0), _fraction(meta, split)
        if fraction and (size < MIN_VAL_TOKENS or docs < MIN_VAL_DOCUMENTS):
            yield split, name, size, unit, docs, fraction


def _fraction(meta: dict, split: str) -> float | None:
    return meta.get(f"{split}_fraction", meta.get("options", {}).get(f"{split}_fraction"))
