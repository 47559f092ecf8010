"""The race corpus, made on the machine from its own files (issue 37, item 2).

A GPU loan has no network, so the text comes from what the machine holds: its installed packages' source, headers
and text files, the standard library, the system's C headers and documentation. The same image gives the same
corpus: files are taken in a fixed order (root by root, sorted relative paths), the first copy of each content
is kept (packages vendor the same file many times), and the corpus carries a fingerprint of what it holds
(`corpus_fingerprint`: each kept file's root, relative path and content hash), so that a later loan on a changed
image is told so. Reading and hashing run in a thread pool, tokenizing in the tokenizers library's pool: on a
16-core machine the cost is the disk's, not one core's.

    build_corpus(out_jsonl, max_bytes=..., workers=16) -> summary     the documents, as JSONL ({"text": ...})
    prepare_race_data(spec, work, workers) -> data                    the corpus, tokenised into splits
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import sysconfig
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# What counts as text: source, headers and prose. Binary files, archives and data dumps are left out.
SUFFIXES = frozenset(
    ".py .pyi .pyx .pxd .c .h .cc .cpp .cxx .hpp .hh .hxx .cu .cuh .inl .js .ts .java .go .rs .sh .cmake "
    ".txt .md .rst .tex".split()
)
MIN_BYTES, MAX_BYTES = 200, 1_000_000  # tiny stubs teach nothing; the largest files are generated tables
MAX_MEAN_LINE = 200  # characters per line on average: above it a file is minified or a data blob


def default_roots() -> list[tuple[str, Path]]:
    """(label, folder) in the order the corpus reads them: the installed packages, the standard library, the C
    headers, the documentation. Labels, not paths, enter the fingerprint, so a prefix that moves does not count."""
    paths = sysconfig.get_paths()
    roots = [("site-packages", Path(p)) for p in sorted({paths["purelib"], paths["platlib"]})]
    roots += [("stdlib", Path(paths["stdlib"])), ("include", Path(paths["include"]))]
    roots += [("usr-include", Path("/usr/include")), ("usr-share-doc", Path("/usr/share/doc"))]
    seen, out = set(), []
    for label, root in roots:
        if root.is_dir() and root.resolve() not in seen:
            seen.add(root.resolve())
            out.append((label, root))
    return out


def list_files(roots: Iterable[tuple[str, Path]]) -> list[tuple[str, str, Path]]:
    """(label, relative path, path) of every text-suffixed file under each root, roots in order, paths sorted.
    A folder under an earlier root (site-packages inside the stdlib's tree, say) is read once, under the first."""
    out, taken = [], set()
    for label, root in roots:
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and (here / d).resolve() not in taken)
            found += [here / f for f in filenames if Path(f).suffix in SUFFIXES]
        taken.add(root.resolve())
        out += sorted((label, p.relative_to(root).as_posix(), p) for p in found)
    return out


def read_text(path: Path) -> tuple[str, str] | None:
    """(sha256 of the bytes, UTF-8 text) of a file worth training on, or None: unreadable, not UTF-8, holding
    NUL bytes, too small or too large, or minified."""
    try:
        if not MIN_BYTES <= path.stat().st_size <= MAX_BYTES or not path.is_file():
            return None
        raw = path.read_bytes()
    except OSError:
        return None
    if b"\x00" in raw or not MIN_BYTES <= len(raw) <= MAX_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(text) / (text.count("\n") + 1) > MAX_MEAN_LINE:
        return None
    return hashlib.sha256(raw).hexdigest(), text


def build_corpus(out: Path, *, max_bytes: int, workers: int = 16, roots: list[tuple[str, Path]] | None = None) -> dict:
    """Write the machine's text files to `out` (JSONL, one document per file) until `max_bytes` of text, and
    return what it holds: files, bytes, duplicates and unusable files skipped, per-root counts, the content
    fingerprint and the seconds taken. The same files give the same corpus and fingerprint, whatever `workers`."""
    t0 = time.time()
    roots = default_roots() if roots is None else roots
    files = list_files(roots)
    digest = hashlib.sha256()
    # the machine's text files by name and size, however many the cut takes: a smaller corpus of the same image
    # has another corpus fingerprint and the same image fingerprint
    image = hashlib.sha256()
    for label, rel, path in files:
        with contextlib.suppress(OSError):
            image.update(f"{label}/{rel}\0{path.stat().st_size}\n".encode())
    seen: set[str] = set()
    kept = duplicates = skipped = used = 0
    per_root: dict[str, int] = {}
    tmp = out.with_name(out.name + ".tmp")
    with ThreadPoolExecutor(max(1, workers)) as pool, tmp.open("w", encoding="utf-8") as f:
        # map keeps the listing's order; chunks of files bound the texts held in memory at once
        for start in range(0, len(files), 4096):
            chunk = files[start : start + 4096]
            for (label, rel, _), got in zip(chunk, pool.map(read_text, (p for _, _, p in chunk))):
                if got is None:
                    skipped += 1
                    continue
                sha, text = got
                if sha in seen:
                    duplicates += 1
                    continue
                seen.add(sha)
                f.write(json.dumps({"text": text}) + "\n")
                digest.update(f"{label}/{rel}\0{sha}\n".encode())
                kept += 1
                used += len(text.encode("utf-8"))
                per_root[label] = per_root.get(label, 0) + 1
                if used >= max_bytes:
                    break
            if used >= max_bytes:
                break
    tmp.replace(out)
    return {
        "files": kept,
        "bytes": used,
        "listed": len(files),
        "duplicates": duplicates,
        "skipped": skipped,
        "per_root": per_root,
        "roots": [label for label, _ in roots],
        "complete": used < max_bytes,  # the machine ran out of text before max_bytes
        "corpus_fingerprint": digest.hexdigest(),
        "image_fingerprint": image.hexdigest(),
        "seconds": round(time.time() - t0, 1),
    }


def prepare_race_data(spec: dict, work: Path, workers: int, roots: list[tuple[str, Path]] | None = None) -> dict:
    """The corpus of `spec` (tokenizer, val_fraction, test_fraction, train_tokens; tokenizer_train_bytes, the BPE's
    sample) tokenised in `work`, with its fingerprints: the corpus's (which files) and the tokens' (angpt.data.
    data_identity). Reading uses `workers` threads, tokenizing `workers` processes (angpt.data.prepare_dataset).
    `roots` ((label, folder) pairs) replaces the machine's folders (default_roots)."""
    from angpt.data import data_identity, prepare_dataset

    work.mkdir(parents=True, exist_ok=True)
    held_out = spec["val_fraction"] + spec["test_fraction"]
    max_tokens = int(spec["train_tokens"] / (1 - held_out)) + 1
    t0 = time.time()
    corpus = build_corpus(
        work / "corpus.jsonl", max_bytes=spec.get("bytes_per_token", 4) * max_tokens, workers=workers, roots=roots
    )
    t1 = time.time()
    data_dir = work / f"race-data-{spec['tokenizer'].replace(':', '')}-{max_tokens}"
    meta = prepare_dataset(
        work / "corpus.jsonl",
        spec["tokenizer"],
        data_dir,
        val_fraction=spec["val_fraction"],
        test_fraction=spec["test_fraction"],
        max_tokens=max_tokens,
        progress=False,
        workers=max(1, workers),
        tokenizer_train_bytes=int(spec.get("tokenizer_train_bytes", 50_000_000)),
    )
    identity = data_identity(data_dir)
    return {
        "dir": str(data_dir),
        "source": "machine",
        "vocab_size": meta["vocab_size"],
        "tokens": {k: v.get("tokens", 0) for k, v in meta["splits"].items()},
        "documents": {k: v.get("documents", 0) for k, v in meta["splits"].items()},
        "corpus": corpus,
        "corpus_fingerprint": corpus["corpus_fingerprint"],
        "image_fingerprint": corpus["image_fingerprint"],
        "data_fingerprint": identity["data_fingerprint"],
        "tokenizer_hash": identity["tokenizer_hash"],
        "python": sys.version.split()[0],
        "corpus_s": round(t1 - t0, 1),
        "prepare_s": round(time.time() - t1, 1),
        "seconds": round(time.time() - t0, 1),
        "workers": workers,
    }


def rehearsal_corpus(root: Path, files: int = 300) -> Path:
    """~700 KB of made-up Python in `files` files under `root`: the same on every machine, for rehearsing a loan on a
    CPU (`kit.py --loan --smoke --corpus-root ROOT`; the machine's own files differ from machine to machine)."""
    import random

    rng = random.Random(0)
    words = "alpha beta gamma delta total count index value items result buffer offset window scale".split()
    for i in range(files):
        lines = []
        for j in range(40):
            a, b, c = rng.sample(words, 3)
            lines.append(
                f"def {a}_{b}_{i}_{j}({c}, n={rng.randint(0, 99)}):\n    return {c} * n + {rng.randint(1, 9)}\n"
            )
        path = root / f"pkg{i % 7}" / f"mod{i:03d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines))
    return root


if __name__ == "__main__":  # python benchmarks/gpu/corpus.py --rehearsal ROOT
    if len(sys.argv) == 3 and sys.argv[1] == "--rehearsal":
        print(rehearsal_corpus(Path(sys.argv[2])))
    else:
        sys.exit("usage: python benchmarks/gpu/corpus.py --rehearsal ROOT")
