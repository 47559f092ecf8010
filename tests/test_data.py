"""Data pipeline: sources, tokenizers, shard format, prepare_dataset and TokenLoader."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from angpt.data import (  # noqa: E402
    HEADER_SIZE,
    TokenLoader,
    check_compatible,
    iter_eval_batches,
    list_stdlib_files,
    load_meta,
    load_tokenizer,
    make_tokenizer,
    open_shard,
    prepare_dataset,
    read_shard_header,
    split_value,
)
from angpt.data.prepare import _train_texts  # noqa: E402
from angpt.data.sources import open_source  # noqa: E402
from angpt.errors import DataError  # noqa: E402

WORDS = "alpha beta gamma delta epsilon zeta theta lambda sigma omega naïve café 日本語 😀 def return".split()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def make_docs(n: int, seed: int = 0, words: int = 60) -> list[str]:
    """Distinct documents with multi-byte characters, newlines and a literal EOS string in one of them."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        body = " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(rng.randrange(5, words)))
        docs.append(f"doc {i}:\n{body}\n")
    docs[1] += "literal <|endoftext|> inside a document\n"
    return docs


def split_tokens(data_dir, split: str) -> np.ndarray:
    meta = load_meta(data_dir)
    parts = [np.asarray(open_shard(Path(data_dir) / s["file"])) for s in meta["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def decode_docs(data_dir, split: str, complete: bool = True) -> list[str]:
    """The split's documents: the shard stream cut at EOS ids, each piece decoded (without a cut-off tail)."""
    tok = load_tokenizer(data_dir)
    tokens = split_tokens(data_dir, split).astype(np.int64)
    cuts = np.flatnonzero(tokens == tok.eos_id)
    assert not complete or cuts.size == 0 or cuts[-1] == tokens.size - 1, "every document must end with EOS"
    return [tok.decode(piece[:-1]) for piece in np.split(tokens, cuts + 1)[:-1]]


def expected_split(docs, val_fraction, seed=0, test_fraction=None):
    """(train, val, test) by the documents' hash: [0, vf) val, [vf, vf + tf) test (tf: as vf), the rest train."""
    tf = val_fraction if test_fraction is None else test_fraction
    val = [d for d in docs if split_value(d, seed) < val_fraction]
    test = [d for d in docs if val_fraction <= split_value(d, seed) < val_fraction + tf]
    return [d for d in docs if d not in val and d not in test], val, test


def file_state(folder: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.iterdir())}


# -- tokenizers ---------------------------------------------------------------------------------------------


def test_bytes_tokenizer_round_trip(tmp_path):
    tok = make_tokenizer("bytes")
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    s = "héllo wörld\t<|endoftext|> 😀 日本\x00\n"
    ids = tok.encode(s)
    assert ids == list(s.encode("utf-8"))  # a literal EOS string is text, not a separator
    assert tok.decode(ids) == s
    assert tok.decode([104, 256, 105]) == "h<|endoftext|>i"
    assert tok.hf.encode(s, add_special_tokens=False).ids == ids  # the saved tokenizer.json agrees
    assert tok.bytes_per_token(s) == 1.0
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert (again.spec, again.hash, again.vocab_size) == ("bytes", tok.hash, 257)
    assert again.decode(again.encode(s)) == s


def test_bad_tokenizer_specs():
    for spec in ("bpe:100", "bpe:x", "words", "hf:"):
        with pytest.raises(DataError):
            make_tokenizer(spec)


# -- local sources ------------------------------------------------------------------------------------------


def write_source(kind: str, folder: Path, docs: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "txt":
        for i, d in enumerate(docs):
            sub = folder / ("a" if i % 2 else "b")  # nested folders, read in sorted path order
            sub.mkdir(exist_ok=True)
            (sub / f"{i:04d}.txt").write_text(d, encoding="utf-8")
        (folder / "ignored.csv").write_text("x,y\n")
        return folder
    if kind == "jsonl":
        path = folder / "docs.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"id": 1, "text": d}) + "\n")
            f.write("\n")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / "docs.parquet"
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), path, row_group_size=7)
    return path


def txt_order(docs):
    """Order of write_source('txt'): folder a (odd indices) before folder b (even)."""
    return [docs[i] for i in range(1, len(docs), 2)] + [docs[i] for i in range(0, len(docs), 2)]


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_source_shards_decode_to_documents(tmp_path, kind):
    docs = make_docs(40)
    src = write_source(kind, tmp_path / "src", docs)
    order = txt_order(docs) if kind == "txt" else docs
    meta = prepare_dataset(src, "bytes", tmp_path / "out", val_fraction=0.2, progress=False, shard_tokens=1000)
    train, val, test = expected_split(order, 0.2)
    assert val and train and test
    assert decode_docs(tmp_path / "out", "train") == train
    assert decode_docs(tmp_path / "out", "val") == val
    assert decode_docs(tmp_path / "out", "test") == test
    assert len(meta["splits"]["train"]["shards"]) > 1  # several shards, one stream
    for split, texts in (("train", train), ("val", val), ("test", test)):
        info = meta["splits"][split]
        nbytes = sum(len(d.encode()) for d in texts)
        assert (info["documents"], info["bytes"], info["tokens"]) == (len(texts), nbytes, nbytes + len(texts))
        assert info["bytes_per_token"] == pytest.approx(nbytes / (nbytes + len(texts)))
    assert meta["source"] == str(src.resolve())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257


def test_local_source_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="text_field"):
        prepare_dataset(tmp_path / "bad.jsonl", "bytes", tmp_path / "o1", progress=False)
    with pytest.raises(DataError, match="does not exist"):
        prepare_dataset(tmp_path / "missing", "bytes", tmp_path / "o2", progress=False)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DataError, match="latin1.txt"):
        prepare_dataset(tmp_path / "latin1.txt", "bytes", tmp_path / "o3", progress=False)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o3").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp folders cleaned up


def test_a_folder_of_source_code_and_markup_prepares_one_document_per_file(tmp_path):
    """Issue 55: `prepare --source` refused a folder of .py files, though the demo trains on Python source. .py,
    .md and .rst files are read as .txt files are (each file of a folder one document); other types stay out."""
    texts = {"a.py": "def main():\n\n    return 1\n", "b.md": "# Title\n\nA paragraph.\n", "c.rst": "Title\n=====\n"}
    src = tmp_path / "src"
    src.mkdir()
    for name, text in texts.items():
        (src / name).write_text(text)
    (src / "d.bin").write_bytes(b"\0\1")
    meta = prepare_dataset(src, "bytes", tmp_path / "out", val_fraction=0.0, progress=False)
    assert sorted(decode_docs(tmp_path / "out", "train")) == sorted(texts.values())
    assert meta["splits"]["train"]["documents"] == 3
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(DataError, match=r"x.bin has an unsupported type; use text \(.txt, .md, .rst, .py\)"):
        prepare_dataset(tmp_path / "x.bin", "bytes", tmp_path / "o", progress=False)


# -- BPE ----------------------------------------------------------------------------------------------------


def test_bpe_tokenizer(tmp_path):
    docs = make_docs(300, words=120)
    src = write_source("jsonl", tmp_path / "src", docs)
    meta = prepare_dataset(src, "bpe:400", tmp_path / "out", val_fraction=0.05, progress=False)
    tok = load_tokenizer(tmp_path / "out")
    assert tok.vocab_size == 400 == meta["vocab_size"]
    assert tok.hf.get_vocab_size() == 400  # the corpus is rich enough to learn every merge
    assert (tok.eos_id, tok.hash, tok.spec) == (meta["eos_id"], meta["tokenizer_hash"], "bpe:400")
    for s in [*docs[:20], "unseen: Ωmega ∑ 🚀 tabs\t\tand  spaces", "<|endoftext|>"]:
        assert tok.decode(tok.encode(s)) == s
    assert tok.eos_id not in tok.encode("<|endoftext|>")
    from tokenizers import Tokenizer as HFTokenizer

    assert HFTokenizer.from_file(str(tmp_path / "out" / "tokenizer.json")).get_vocab_size() == 400
    train, val, test = expected_split(docs, 0.05)
    assert decode_docs(tmp_path / "out", "train") == train
    assert decode_docs(tmp_path / "out", "val") == val
    assert decode_docs(tmp_path / "out", "test") == test
    for split, texts in (("train", train), ("val", val), ("test", test)):
        info = meta["splits"][split]
        assert info["tokens"] == sum(len(tok.encode(d)) + 1 for d in texts)
        assert info["bytes"] == sum(len(d.encode()) for d in texts)
        assert info["bytes_per_token"] == pytest.approx(info["bytes"] / info["tokens"])
        assert info["bytes_per_token"] > 1.5  # BPE actually compresses
    assert meta["dtype"] == "uint16"
    # The tokenizer is fitted on train documents only.
    options = {"tokenizer_train_bytes": 10**9, "max_tokens": None, "seed": 0, "val_fraction": 0.05}
    options["test_fraction"] = 0.05
    fitted = [d for batch in _train_texts(open_source(src), options) for d in batch]
    assert fitted == train
    # A tokenizer.json from disk works as hf:PATH.
    meta2 = prepare_dataset(
        src, f"hf:{tmp_path / 'out' / 'tokenizer.json'}", tmp_path / "out2", val_fraction=0.05, progress=False
    )
    assert meta2["tokenizer_hash"] == meta["tokenizer_hash"]
    assert np.array_equal(split_tokens(tmp_path / "out2", "train"), split_tokens(tmp_path / "out", "train"))


# -- Hugging Face datasets ----------------------------------------------------------------------------------


def test_hf_sources_through_datasets(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = make_docs(30)
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"text": docs[:15]}), tmp_path / "pq" / "part-0.parquet")
    pq.write_table(pa.table({"text": docs[15:]}), tmp_path / "pq" / "part-1.parquet")
    source = f"hf:parquet:{tmp_path}/pq/*.parquet"
    meta = prepare_dataset(source, "bytes", tmp_path / "out", val_fraction=0.2, progress=False)
    assert "datasets" in sys.modules and meta["source"] == source
    train, val, _ = expected_split(docs, 0.2)
    assert decode_docs(tmp_path / "out", "train") == train
    assert decode_docs(tmp_path / "out", "val") == val

    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"body": docs[:5]}), "test": datasets.Dataset.from_dict({"body": docs})}
    ).save_to_disk(str(saved))
    prepare_dataset(f"hf:{saved}@test", "bytes", tmp_path / "out2", text_field="body", progress=False)
    held = [d for s in ("train", "val", "test") for d in decode_docs(tmp_path / "out2", s)]
    assert sorted(held) == sorted(docs)
    with pytest.raises(DataError, match="no column 'text'"):
        prepare_dataset(f"hf:{saved}", "bytes", tmp_path / "out3", progress=False)
    with pytest.raises(DataError, match="no split"):
        prepare_dataset(f"hf:{saved}@nope", "bytes", tmp_path / "out4", text_field="body", progress=False)
    with pytest.raises(DataError, match="no files match"):
        prepare_dataset(f"hf:parquet:{tmp_path}/none/*.parquet", "bytes", tmp_path / "out5", progress=False)


def test_hf_hub_offline_fails_fast(tmp_path):
    start = time.time()
    with pytest.raises(DataError, match="unknown-dataset"):
        prepare_dataset("hf:some-org/unknown-dataset", "bytes", tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="unknown-tokenizer"):
        make_tokenizer("hf:some-org/unknown-tokenizer")
    assert time.time() - start < 10
    assert not (tmp_path / "out").exists()


# -- split, stdlib, re-runs ---------------------------------------------------------------------------------


def test_val_split_is_by_document_and_deterministic(tmp_path):
    docs = make_docs(200)
    src = write_source("jsonl", tmp_path / "src", docs)
    a = prepare_dataset(src, "bytes", tmp_path / "a", val_fraction=0.1, progress=False)
    b = prepare_dataset(src, "bytes", tmp_path / "b", val_fraction=0.1, progress=False)
    for split in ("train", "val", "test"):
        assert (tmp_path / "a" / f"{split}_000000.bin").read_bytes() == (
            tmp_path / "b" / f"{split}_000000.bin"
        ).read_bytes()
    assert a["splits"] == b["splits"]
    train, val = decode_docs(tmp_path / "a", "train"), decode_docs(tmp_path / "a", "val")
    test = decode_docs(tmp_path / "a", "test")  # as many as val by default: [0.1, 0.2) of the hash
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert sorted(train + val + test) == sorted(docs)
    assert 5 <= len(val) <= 40 and 5 <= len(test) <= 40
    assert all(0.1 <= split_value(d) < 0.2 for d in test) and all(split_value(d) < 0.1 for d in val)
    c = prepare_dataset(src, "bytes", tmp_path / "c", val_fraction=0.1, seed=1, progress=False)
    assert decode_docs(tmp_path / "c", "val") != val and c["documents"] == a["documents"]


def test_at_least_one_val_document(tmp_path):
    docs = make_docs(3)
    src = write_source("jsonl", tmp_path / "src", docs)
    meta = prepare_dataset(src, "bytes", tmp_path / "out", val_fraction=1e-12, progress=False, shard_tokens=50)
    moved = min(docs, key=split_value)  # the document nearest to the val side of the hash
    assert decode_docs(tmp_path / "out", "val") == [moved]
    assert decode_docs(tmp_path / "out", "train") == [d for d in docs if d != moved]
    assert meta["splits"]["val"]["documents"] == 1 and meta["splits"]["train"]["documents"] == 2
    for split in ("train", "val"):
        info = meta["splits"][split]
        assert info["tokens"] == sum(s["tokens"] for s in info["shards"]) == split_tokens(tmp_path / "out", split).size


def test_stdlib_source(tmp_path):
    files = list_stdlib_files()
    assert len(files) > 100 and all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = [f.relative_to(root).as_posix() for f in files]
    assert rel == sorted(rel)
    start = time.time()
    meta = prepare_dataset("stdlib", "bytes", tmp_path / "out", max_tokens=200_000, progress=False)
    assert time.time() - start < 20
    assert meta["tokens"] == 200_000 and meta["capped"]
    assert sum(meta["splits"][s]["tokens"] for s in ("train", "val", "test")) == 200_000
    first = files[0].read_text(encoding="utf-8")
    if split_value(first) >= meta["val_fraction"] + meta["test_fraction"]:
        assert decode_docs(tmp_path / "out", "train", complete=False)[0] == first


def test_max_tokens_cuts_last_document(tmp_path):
    docs = make_docs(10)
    src = write_source("jsonl", tmp_path / "src", docs)
    meta = prepare_dataset(src, "bytes", tmp_path / "out", max_tokens=1000, val_fraction=0.0, progress=False)
    tokens = split_tokens(tmp_path / "out", "train")
    assert tokens.size == 1000 == meta["tokens"] and meta["bytes"] == 1000 - (tokens == 256).sum()
    assert bytes(tokens[tokens != 256].astype(np.uint8)) == "".join(docs).encode()[: meta["bytes"]]


def test_rerun_is_noop_and_conflicts_change_nothing(tmp_path):
    src = write_source("jsonl", tmp_path / "src", make_docs(50))
    out = tmp_path / "out"
    meta = prepare_dataset(src, "bytes", out, val_fraction=0.1, progress=False)
    before = file_state(out)
    time.sleep(0.01)
    assert prepare_dataset(src, "bytes", out, val_fraction=0.1, progress=False) == meta
    assert file_state(out) == before
    with pytest.raises(DataError, match="tokenizer='bytes'"):
        prepare_dataset(src, "bpe:300", out, val_fraction=0.1, progress=False)
    other = write_source("txt", tmp_path / "src2", make_docs(5))
    with pytest.raises(DataError, match="source="):
        prepare_dataset(other, "bytes", out, val_fraction=0.1, progress=False)
    assert file_state(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src", "src2"]  # no temp folders left
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not a prepared dataset"):
        prepare_dataset(src, "bytes", tmp_path / "busy", progress=False)
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    prepare_dataset(src, "bytes", tmp_path / "empty", val_fraction=0.1, progress=False)
    assert load_meta(tmp_path / "empty")["documents"] == 50


# -- shard format -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A bytes dataset of ~40k train tokens in several shards."""
    root = tmp_path_factory.mktemp("ds")
    src = write_source("jsonl", root / "src", make_docs(300, seed=3))
    prepare_dataset(src, "bytes", root / "out", val_fraction=0.1, progress=False, shard_tokens=15_000)
    return root / "out"


def test_corrupt_shards(dataset, tmp_path):
    good = dataset / "train_000000.bin"
    assert read_shard_header(good)["count"] == (good.stat().st_size - HEADER_SIZE) // 2
    bad = tmp_path / "bad_magic.bin"
    bad.write_bytes(b"NOTTOKEN" + good.read_bytes()[8:])
    with pytest.raises(DataError, match="bad_magic.bin"):
        open_shard(bad)
    short = tmp_path / "short.bin"
    short.write_bytes(good.read_bytes()[:-3])
    with pytest.raises(DataError, match="short.bin.*truncated"):
        open_shard(short)
    newer = tmp_path / "newer.bin"
    raw = bytearray(good.read_bytes())
    raw[8] = 99
    newer.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="newer.bin.*version"):
        open_shard(newer)
    broken = tmp_path / "broken"
    shutil.copytree(dataset, broken)
    with open(broken / "train_000001.bin", "r+b") as f:
        f.truncate(HEADER_SIZE + 10)
    with pytest.raises(DataError, match="train_000001.bin"):
        TokenLoader(broken, "train", 2, 16)
    (broken / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match="meta.json"):
        load_meta(broken)
    with pytest.raises(DataError, match="no meta.json"):
        load_meta(tmp_path)


def test_vocab_check(dataset):
    meta = load_meta(dataset)
    check_compatible(meta, 257)
    check_compatible(meta, 50304)
    with pytest.raises(DataError, match="vocab_size >= 257"):
        check_compatible(meta, 256)


# -- TokenLoader --------------------------------------------------------------------------------------------


def take(loader, n):
    return [loader.next_batch() for _ in range(n)]


def test_loader_batches_are_shifted_windows(dataset):
    loader = TokenLoader(dataset, "train", 4, 32, shuffle=False)
    tokens = np.asarray(open_shard(dataset / "train_000000.bin")).astype(np.int64)
    for step, (x, y) in enumerate(take(loader, 3)):
        assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row in range(4):
            w = step * 4 + row
            assert x[row].tolist() == tokens[w * 32 : w * 32 + 32].tolist()
            assert y[row].tolist() == tokens[w * 32 + 1 : w * 32 + 33].tolist()
    counts = [s["tokens"] for s in load_meta(dataset)["splits"]["train"]["shards"]]
    assert loader.num_windows == sum((c - 1) // 32 for c in counts)


def test_loader_is_deterministic_and_seeded(dataset):
    a = take(TokenLoader(dataset, "train", 4, 16, seed=5), 6)
    b = take(TokenLoader(dataset, "train", 4, 16, seed=5), 6)
    c = take(TokenLoader(dataset, "train", 4, 16, seed=6), 6)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c))


def test_loader_resume(dataset):
    loader = TokenLoader(dataset, "train", 8, 64, seed=1)
    steps_per_epoch = loader.num_windows // 8
    take(loader, steps_per_epoch - 2)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = take(loader, 5)  # crosses into epoch 1
    assert loader.epoch == 1
    resumed = TokenLoader(dataset, "train", 8, 64, seed=1)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(expected, take(resumed, 5)):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    # The cursor is rank-independent: two ranks resume from the same state onto the same global batches.
    halves = []
    for rank in range(2):
        r = TokenLoader(dataset, "train", 4, 64, seed=1, rank=rank, world_size=2)
        r.load_state_dict(state)
        halves.append(r.next_batch()[0])
    assert torch.equal(torch.cat(halves), expected[0][0])
    with pytest.raises(DataError, match="seq_len"):
        TokenLoader(dataset, "train", 8, 32, seed=1).load_state_dict(state)


def window_rows(x):
    return [tuple(r) for r in x.tolist()]


def test_loader_ranks_partition_the_global_batch(dataset):
    single = TokenLoader(dataset, "train", 6, 16, seed=2)
    ranks = [TokenLoader(dataset, "train", 3, 16, seed=2, rank=r, world_size=2) for r in range(2)]
    for _ in range(40):  # several epochs' worth of steps for small shards
        full = single.next_batch()
        parts = [r.next_batch() for r in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), full[0])
        assert torch.equal(torch.cat([p[1] for p in parts]), full[1])
        assert not set(window_rows(parts[0][0])) & set(window_rows(parts[1][0]))


def test_loader_gradient_accumulation_equivalence(dataset):
    """Same global batch per optimizer step, whatever the split into ranks x micro-batch x accumulation."""

    def step_windows(world_size, micro, accum, steps):
        loaders = [
            TokenLoader(dataset, "train", micro, 16, seed=4, rank=r, world_size=world_size) for r in range(world_size)
        ]
        out = []
        for _ in range(steps):
            rows = []
            for _ in range(accum):
                for loader in loaders:
                    rows += window_rows(loader.next_batch()[0])
            out.append(sorted(rows))
        return out

    ref = step_windows(1, 12, 1, 5)
    assert step_windows(2, 2, 3, 5) == ref
    assert step_windows(3, 4, 1, 5) == ref
    assert step_windows(1, 4, 3, 5) == ref


def test_loader_epochs(dataset):
    loader = TokenLoader(dataset, "train", 1, 128, seed=0)
    n = loader.num_windows
    ordered = TokenLoader(dataset, "train", n, 128, shuffle=False).next_batch()[0]
    epoch0 = torch.cat([x for x, _ in take(loader, n)])
    epoch1 = torch.cat([x for x, _ in take(loader, n)])
    assert loader.epoch == 2
    assert sorted(window_rows(epoch0)) == sorted(window_rows(ordered)) == sorted(window_rows(epoch1))
    assert not torch.equal(epoch0, epoch1) and not torch.equal(epoch0, ordered)


def test_eval_batches(dataset):
    val_tokens = load_meta(dataset)["splits"]["val"]["tokens"]
    windows = (val_tokens - 1) // 16
    first = list(iter_eval_batches(dataset, 4, 16))
    assert [torch.equal(a[0], b[0]) for a, b in zip(first, iter_eval_batches(dataset, 4, 16))] == [True] * len(first)
    assert sum(x.shape[0] for x, _ in first) == windows  # one rank covers the split
    ordered = TokenLoader(dataset, "val", windows, 16, shuffle=False).next_batch()[0]
    assert torch.equal(torch.cat([x for x, _ in first]), ordered)
    assert len(list(iter_eval_batches(dataset, 4, 16, max_batches=2))) == 2
    two = [list(iter_eval_batches(dataset, 2, 16, rank=r, world_size=2)) for r in range(2)]
    assert len(two[0]) == len(two[1])
    for a, b, full in zip(two[0], two[1], first):
        if a[0].shape[0] == 2:
            assert torch.equal(torch.cat([a[0], b[0]]), full[0])
    with pytest.raises(DataError, match="seq_len"):
        list(iter_eval_batches(dataset, 4, val_tokens + 5))


def test_loader_is_fast(dataset):
    loader = TokenLoader(dataset, "train", 16, 256)
    loader.next_batch()
    start = time.perf_counter()
    for _ in range(200):
        loader.next_batch()
    assert (time.perf_counter() - start) / 200 < 2e-3


def test_import_is_light():
    code = "import sys, angpt.data; print(sorted({'datasets', 'transformers', 'pyarrow'} & set(sys.modules)))"
    import angpt

    env = {**os.environ, "PYTHONPATH": str(Path(angpt.__file__).parents[1])}  # works without an install too
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_large_vocab_uses_uint32(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab.update({"[UNK]": 70_000, "</s>": 70_001})
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    docs = [" ".join(f"w{(i * 7919 + j) % 70_000}" for j in range(50)) + " w69999 w65537" for i in range(20)]
    src = write_source("jsonl", tmp_path / "src", docs)
    meta = prepare_dataset(src, f"hf:{tmp_path}", tmp_path / "out", val_fraction=0.2, progress=False)
    assert (meta["dtype"], meta["vocab_size"], meta["eos_id"]) == ("uint32", 70_002, 70_001)
    tokens = np.concatenate([split_tokens(tmp_path / "out", s) for s in ("train", "val")])
    assert tokens.dtype == np.uint32 and tokens.max() == 70_001 and int(tokens[tokens < 70_000].max()) == 69_999
    x, y = TokenLoader(tmp_path / "out", "train", 2, 8).next_batch()
    assert x.dtype == torch.int64 and int(torch.cat([x, y]).max()) < 70_002
