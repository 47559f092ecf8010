"""Data faults of issue 10 (classes 3, 7 and 9): documents of a single .txt file, empty splits refused at prepare
time, out-of-range token ids in a shard with a valid header, the dataset identity a resume compares, and the
checks that make a dataset trainable before step 1."""

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from angpt.cli import main
from angpt.data import HEADER_SIZE, TokenLoader, iter_eval_batches, load_meta, prepare_dataset, split_value
from angpt.errors import DataError

from .test_data import decode_docs, expected_split, write_source

WORDS = "alpha beta gamma delta epsilon zeta theta lambda sigma omega naïve café 日本語 def return".split()


def paragraphs(n: int, seed: int = 0) -> list[str]:
    """Distinct multi-line blocks without blank lines inside, each ending with a newline."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 12))) for _ in range(rng.randrange(1, 4))]
        lines[0] = f"block {i}: {lines[0]}"
        if i % 5 == 0:
            lines.append("    indented line, not a separator")
        out.append("\n".join(lines) + "\n")
    return out


def no_temp_folders(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(".")]


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg, msg
    return msg


# -- class 9: a single .txt file is cut into documents --------------------------------------------------------


def test_single_txt_file_is_split_at_blank_lines(tmp_path):
    blocks = paragraphs(120)
    seps = ["\n", "\n\n\n", "  \t\n", " \n\n\t\n", "\r\n"]
    text = "\n\n" + "".join(b + seps[i % len(seps)] for i, b in enumerate(blocks))  # leading blank lines too
    src = tmp_path / "corpus.txt"
    src.write_text(text, encoding="utf-8", newline="")
    out = tmp_path / "out"
    meta = prepare_dataset(src, "bytes", out, val_fraction=0.1, progress=False)
    assert meta["documents"] == 120
    train, val, _ = expected_split(blocks, 0.1)
    assert val and train
    assert decode_docs(out, "train") == train and decode_docs(out, "val") == val  # blocks kept verbatim
    from angpt.data import DEFAULT_DOC_SEPARATOR

    assert meta["options"]["doc_separator"] == DEFAULT_DOC_SEPARATOR  # the rule is recorded


def test_doc_separator_option(tmp_path):
    docs = [b + "\n\nsecond paragraph of the same document\n" for b in paragraphs(60, seed=1)]  # blank lines inside
    src = tmp_path / "corpus.txt"
    src.write_text("".join(d + "<|doc|>\n" for d in docs), encoding="utf-8")
    out = tmp_path / "out"
    meta = prepare_dataset(src, "bytes", out, val_fraction=0.1, doc_separator=r"<\|doc\|>\n", progress=False)
    train, val, _ = expected_split(docs, 0.1)
    assert meta["documents"] == 60 and decode_docs(out, "train") == train and decode_docs(out, "val") == val
    assert meta["options"]["doc_separator"] == r"<\|doc\|>\n"
    # Re-running with another rule into the same folder is refused, naming the option.
    with pytest.raises(DataError, match="doc_separator"):
        prepare_dataset(src, "bytes", out, val_fraction=0.1, progress=False)
    # A regex that does not compile, or one that matches the empty string: one line, nothing written.
    for bad, needle in (("(", "doc_separator"), ("x*", "matches the empty string")):
        with pytest.raises(DataError, match=needle) as e:
            prepare_dataset(src, "bytes", tmp_path / "bad", doc_separator=bad, progress=False)
        one_line(e)
    # A separator for a source without .txt files would be silently ignored: refused instead.
    jsonl = write_source("jsonl", tmp_path / "j", docs)
    with pytest.raises(DataError, match=r"\.txt"):
        prepare_dataset(jsonl, "bytes", tmp_path / "bad", doc_separator="\n\n", progress=False)
    assert not (tmp_path / "bad").exists() and no_temp_folders(tmp_path)


def test_txt_files_in_a_folder_stay_whole_unless_a_separator_is_given(tmp_path):
    docs = [b + "\n\nmore of the same file\n" for b in paragraphs(30, seed=2)]
    folder = tmp_path / "src"
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"{i:03d}.txt").write_text(d, encoding="utf-8")
    meta = prepare_dataset(folder, "bytes", tmp_path / "whole", val_fraction=0.2, progress=False)
    assert meta["documents"] == 30 and meta["options"]["doc_separator"] is None
    split = prepare_dataset(folder, "bytes", tmp_path / "cut", val_fraction=0.2, doc_separator=r"\n\n", progress=False)
    assert split["documents"] == 60


# -- class 9: empty splits are refused at prepare time ----------------------------------------------------------


def test_prepare_refuses_an_empty_validation_split(tmp_path):
    src = tmp_path / "book.txt"
    src.write_text("".join(b for b in paragraphs(200)), encoding="utf-8")  # no blank lines: one document
    out = tmp_path / "new" / "out"
    with pytest.raises(DataError, match="validation split would be empty") as e:
        prepare_dataset(src, "bytes", out, val_fraction=0.1, progress=False)
    msg = one_line(e)
    assert "--doc-separator" in msg and "documents" in msg
    assert not out.exists() and not out.parent.exists() and no_temp_folders(tmp_path)
    # The explicit "keep the file whole" rule on a file with blank lines: the same refusal.
    src.write_text("".join(b + "\n" for b in paragraphs(200)), encoding="utf-8")
    with pytest.raises(DataError, match="validation split would be empty"):
        prepare_dataset(src, "bytes", out, val_fraction=0.1, doc_separator="", progress=False)
    # One JSON line: one document.
    one = write_source("jsonl", tmp_path / "j", ["just one document\n"])
    with pytest.raises(DataError, match="validation split would be empty"):
        prepare_dataset(one, "bytes", out, val_fraction=0.1, progress=False)
    assert not out.exists() and no_temp_folders(tmp_path)
    # An explicit val_fraction=0 asks for a train-only dataset (check_trainable refuses to train on it).
    meta = prepare_dataset(one, "bytes", out, val_fraction=0.0, progress=False)
    assert meta["splits"]["val"]["documents"] == 0


def test_prepare_refuses_an_empty_train_split(tmp_path):
    docs = [f"document {i}\n" for i in range(200)]
    docs = [d for d in docs if split_value(d) < 0.9][:3]  # three documents that all hash into val at 0.9
    src = write_source("jsonl", tmp_path / "src", docs)
    with pytest.raises(DataError, match="train split would be empty") as e:
        prepare_dataset(src, "bytes", tmp_path / "out", val_fraction=0.9, progress=False)
    assert "--val-fraction" in one_line(e)
    assert not (tmp_path / "out").exists() and no_temp_folders(tmp_path)


def test_cli_prepare_of_one_document_is_a_one_line_error(tmp_path, capsys):
    src = tmp_path / "book.txt"
    src.write_text("a single paragraph\nwithout blank lines\n" * 50, encoding="utf-8")
    rc = main(["prepare", "--source", str(src), "--tokenizer", "bytes", "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "validation split would be empty" in err[0], err
    assert not (tmp_path / "out").exists()


# -- class 7: out-of-range token ids in a shard with a valid header ------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A bytes dataset with several train shards and one val shard."""
    root = tmp_path_factory.mktemp("faults")
    src = write_source("jsonl", root / "src", [p * 2 for p in paragraphs(300, seed=3)])
    prepare_dataset(src, "bytes", root / "out", val_fraction=0.1, progress=False, shard_tokens=20_000)
    meta = load_meta(root / "out")
    assert len(meta["splits"]["train"]["shards"]) >= 3 and len(meta["splits"]["val"]["shards"]) == 1
    assert meta["splits"]["val"]["tokens"] > 1000
    return root / "out"


def poke(path: Path, index: int, value: int, dtype=np.uint16) -> None:
    """Overwrite token ``index`` of a shard in place, leaving its header valid."""
    with open(path, "r+b") as f:
        f.seek(HEADER_SIZE + index * np.dtype(dtype).itemsize)
        f.write(np.array([value], dtype=dtype).tobytes())


def test_out_of_range_token_ids_are_refused_when_a_shard_is_opened(dataset, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(dataset, bad)
    poke(bad / "train_000001.bin", 1234, 300)  # vocab_size is 257
    with pytest.raises(DataError, match=r"train_000001\.bin.*300") as e:
        TokenLoader(bad, "train", 2, 16)
    assert "257" in one_line(e)
    TokenLoader(bad, "val", 2, 16)  # the val split is clean
    poke(bad / "val_000000.bin", 7, 65535)
    with pytest.raises(DataError, match=r"val_000000\.bin.*65535"):
        next(iter_eval_batches(bad, 2, 16))
    # A header whose vocabulary disagrees with meta.json (so that 300 would look valid) is refused as well.
    other = tmp_path / "other"
    shutil.copytree(dataset, other)
    with open(other / "train_000002.bin", "r+b") as f:
        f.seek(20)  # magic(8) version(4) header(4) itemsize(4) -> vocab_size
        f.write(np.array([1000], dtype="<u4").tobytes())
    with pytest.raises(DataError, match=r"train_000002\.bin does not match"):
        TokenLoader(other, "train", 2, 16)
    poke(other / "train_000002.bin", 5, 300)
    with pytest.raises(DataError, match=r"train_000002\.bin"):
        TokenLoader(other, "train", 2, 16)


def test_token_ids_are_scanned_once_per_shard(dataset, monkeypatch):
    import angpt.data.format as fmt

    calls = []
    real = fmt._max_token_id
    monkeypatch.setattr(fmt, "_max_token_id", lambda tokens: calls.append(len(tokens)) or real(tokens))
    fmt._SCANNED.clear()
    shards = len(load_meta(dataset)["splits"]["train"]["shards"])
    TokenLoader(dataset, "train", 2, 16)
    TokenLoader(dataset, "train", 4, 32, seed=1)
    assert len(calls) == shards
    list(iter_eval_batches(dataset, 4, 16))
    list(iter_eval_batches(dataset, 4, 16))
    assert len(calls) == shards + 1


def test_eval_with_more_ranks_than_windows_is_an_error_not_a_zero_loss(dataset):
    val = load_meta(dataset)["splits"]["val"]["tokens"]
    seq_len = (val - 1) // 2  # exactly two windows
    assert len(list(iter_eval_batches(dataset, 1, seq_len, rank=0, world_size=2))) == 1
    with pytest.raises(DataError, match="world_size"):
        next(iter_eval_batches(dataset, 1, seq_len, rank=0, world_size=3))


# -- class 3: the identity of a dataset, for the resume check ------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    text = "".join(b + "\n" for b in paragraphs(400, seed=4))
    (root / "corpus.txt").write_text(text, encoding="utf-8")
    return root


def test_data_identity_is_stable_and_tells_datasets_apart(corpus, tmp_path):
    from angpt.data import data_identity, train_bpe

    src = corpus / "corpus.txt"
    a = prepare_dataset(src, "bytes", tmp_path / "a", val_fraction=0.1, progress=False)
    prepare_dataset(src, "bytes", tmp_path / "b", val_fraction=0.1, progress=False)
    ida, idb = data_identity(tmp_path / "a"), data_identity(tmp_path / "b")
    assert ida == idb  # the same prepare twice (another folder, another time) is the same dataset
    assert ida["tokenizer_hash"] == a["tokenizer_hash"] and ida["vocab_size"] == 257
    assert ida["tokens"] == {s: a["splits"][s]["tokens"] for s in ("train", "val", "test")}
    json.dumps(ida)  # recordable in a checkpoint's state.json
    # Two BPE tokenizers with the same vocabulary size: one fitted on the corpus, one on other text.
    bpe = prepare_dataset(src, "bpe:300", tmp_path / "bpe", val_fraction=0.1, progress=False)
    other_tok = train_bpe([[f"unrelated text number {i} with other words\n" for i in range(2000)]], 300)
    other = prepare_dataset(src, other_tok, tmp_path / "other", val_fraction=0.1, progress=False)
    assert bpe["vocab_size"] == other["vocab_size"] == 300
    idb, ido = data_identity(tmp_path / "bpe"), data_identity(tmp_path / "other")
    assert idb["vocab_size"] == ido["vocab_size"] == 300
    assert len({ida["tokenizer_hash"], idb["tokenizer_hash"], ido["tokenizer_hash"]}) == 3
    assert len({ida["data_fingerprint"], idb["data_fingerprint"], ido["data_fingerprint"]}) == 3
    # Text differing in one character (same size, same token counts, same shard layout) is other data.
    edited = corpus / "edited.txt"
    text = src.read_text(encoding="utf-8")
    i = text.index("alpha")
    edited.write_text(text[:i] + "A" + text[i + 1 :], encoding="utf-8")
    prepare_dataset(edited, "bytes", tmp_path / "edited", val_fraction=0.1, progress=False)
    ide = data_identity(tmp_path / "edited")
    # (the edited document may change split: its hash does; the total stays)
    assert sum(ide["tokens"].values()) == sum(ida["tokens"].values())
    assert ide["data_fingerprint"] != ida["data_fingerprint"]
    # Another split of the same text (another seed) is other data with the same tokenizer.
    prepare_dataset(src, "bytes", tmp_path / "seed1", val_fraction=0.1, seed=1, progress=False)
    ids1 = data_identity(tmp_path / "seed1")
    assert ids1["tokenizer_hash"] == ida["tokenizer_hash"] and ids1["data_fingerprint"] != ida["data_fingerprint"]


def test_data_identity_without_recorded_hashes(corpus, tmp_path):
    """A dataset whose meta.json predates the recorded shard hashes gets the same identity, computed."""
    from angpt.data import data_identity

    prepare_dataset(corpus / "corpus.txt", "bpe:300", tmp_path / "d", val_fraction=0.1, progress=False)
    want = data_identity(tmp_path / "d")
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    for split in meta["splits"].values():
        for shard in split["shards"]:
            shard.pop("sha256")
    (tmp_path / "d" / "meta.json").write_text(json.dumps(meta))
    assert data_identity(tmp_path / "d") == want
    # No tokenizer hash recorded anywhere: the sha256 of tokenizer.json.
    meta.pop("tokenizer_hash")
    meta["tokenizer"].pop("hash")
    (tmp_path / "d" / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "d" / "angpt_tokenizer.json").unlink()
    raw = (tmp_path / "d" / "tokenizer.json").read_bytes()
    assert data_identity(tmp_path / "d")["tokenizer_hash"] == hashlib.sha256(raw).hexdigest() == want["tokenizer_hash"]


def test_data_identity_verify_detects_a_changed_byte(corpus, tmp_path, monkeypatch):
    import angpt.data.format as fmt
    from angpt.data import data_identity

    # Bit rot does not touch a file's size or times: verify must re-read even a file it has hashed before.
    monkeypatch.setattr(fmt, "_file_key", lambda path: (str(path),))
    prepare_dataset(corpus / "corpus.txt", "bytes", tmp_path / "d", val_fraction=0.1, progress=False)
    want = data_identity(tmp_path / "d", verify=True)
    assert want == data_identity(tmp_path / "d")
    poke(tmp_path / "d" / "train_000000.bin", 100, ord("#"))  # in range: only a content hash sees it
    # The recorded identity is what was prepared; verify=True re-reads every shard and names the changed one.
    assert data_identity(tmp_path / "d") == want
    with pytest.raises(DataError, match=r"train_000000\.bin") as e:
        data_identity(tmp_path / "d", verify=True)
    assert "changed" in one_line(e)


def test_recorded_shard_hashes_survive_the_move_to_val(tmp_path):
    """With few documents prepare moves one into val, rewriting a train shard: the recorded hashes must follow."""
    from angpt.data import data_identity

    src = write_source("jsonl", tmp_path / "src", [p * 3 for p in paragraphs(3, seed=5)])
    meta = prepare_dataset(src, "bytes", tmp_path / "d", val_fraction=1e-12, shard_tokens=100, progress=False)
    assert meta["splits"]["val"]["documents"] == 1 and len(meta["splits"]["train"]["shards"]) > 1
    data_identity(tmp_path / "d", verify=True)


# -- class 9: is the dataset trainable at this seq_len? ------------------------------------------------------


def test_check_trainable(dataset, tmp_path):
    from angpt.data import check_trainable

    meta = load_meta(dataset)
    val = meta["splits"]["val"]["tokens"]
    info = check_trainable(dataset, 16)
    assert info["val_windows"] == (val - 1) // 16 and info["train_windows"] > 100
    with pytest.raises(DataError, match=r"validation split .* fewer than seq_len\+1") as e:
        check_trainable(dataset, val)
    assert "--val-fraction" in one_line(e)
    with pytest.raises(DataError, match="world_size"):
        check_trainable(dataset, (val - 1) // 2, world_size=3)
    # A train-only dataset (val_fraction=0) is refused before step 1, not at the first evaluation.
    src = write_source("jsonl", tmp_path / "src", [p * 4 for p in paragraphs(20)])
    prepare_dataset(src, "bytes", tmp_path / "trainonly", val_fraction=0.0, progress=False)
    with pytest.raises(DataError, match="validation split .* is empty"):
        check_trainable(tmp_path / "trainonly", 16)
    # A train split too short for one window.
    train_max = max(s["tokens"] for s in meta["splits"]["train"]["shards"])
    with pytest.raises(DataError, match=r"train split .* seq_len\+1"):
        check_trainable(dataset, train_max)
    # Out-of-range ids in the val split are found here too, before step 1.
    bad = tmp_path / "bad"
    shutil.copytree(dataset, bad)
    poke(bad / "val_000000.bin", 3, 999)
    with pytest.raises(DataError, match=r"val_000000\.bin.*999"):
        check_trainable(bad, 16)
