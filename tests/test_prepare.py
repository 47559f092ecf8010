"""`angpt prepare` on a first corpus of one's own: a file that is not UTF-8, re-preparing a folder, and a held-out
share that suits a small corpus. Each test failed with its fix removed."""

import json
import os
import shlex
from pathlib import Path

import pytest

from angpt.cli import main
from angpt.data import load_meta, prepare_dataset
from angpt.errors import DataError

from .test_data import decode_docs, expected_split, file_state, make_docs, write_source
from .test_faults_data import no_temp_folders, one_line


# ------------------------------------------------------------------------------------- files that are not UTF-8
@pytest.fixture
def mixed(tmp_path):
    """A folder of ten UTF-8 .txt files and one Latin-1 file (b'caf\\xe9')."""
    folder = tmp_path / "src"
    folder.mkdir()
    for i, doc in enumerate(make_docs(10)):
        (folder / f"{i:02d}.txt").write_text(doc, encoding="utf-8")
    (folder / "latin1.txt").write_bytes(b"caf\xe9\n")
    return folder


def test_a_file_that_is_not_utf8_is_left_out_with_a_warning_naming_it(mixed, tmp_path, capsys):
    meta = prepare_dataset(mixed, "bytes", tmp_path / "out", val_fraction=0.2, progress=False)
    assert meta["skipped_files"] == ["latin1.txt"] and meta["documents"] == 10
    assert load_meta(tmp_path / "out")["skipped_files"] == meta["skipped_files"]
    err = capsys.readouterr().err
    assert "left out 1 file that is not UTF-8 text" in err and "latin1.txt" in err, err
    assert "--encoding-errors replace" in err
    # the CLI's summary counts it
    args = ["prepare", "--source", str(mixed), "--tokenizer", "bytes", "--val-fraction", "0.2", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "cli")]) == 0
    assert "1 file(s) left out as not UTF-8" in capsys.readouterr().out


def test_encoding_errors_replace_keeps_the_file(mixed, tmp_path):
    meta = prepare_dataset(
        mixed, "bytes", tmp_path / "out", val_fraction=0.2, encoding_errors="replace", progress=False
    )
    assert meta["skipped_files"] == [] and meta["documents"] == 11
    docs = [d for split in meta["splits"] for d in decode_docs(tmp_path / "out", split)]
    assert "caf\ufffd\n" in docs


def test_encoding_errors_strict_is_a_one_line_error_naming_the_file_and_the_option(mixed, tmp_path, capsys):
    with pytest.raises(DataError) as e:
        prepare_dataset(mixed, "bytes", tmp_path / "out", encoding_errors="strict", progress=False)
    assert "latin1.txt" in one_line(e) and "--encoding-errors skip" in one_line(e)
    args = ["prepare", "--source", str(mixed), "--tokenizer", "bytes", "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*args, "--encoding-errors", "strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "latin1.txt" in err[0], err
    assert not (tmp_path / "out").exists() and no_temp_folders(tmp_path)


def test_a_dataset_prepared_before_encoding_errors_existed_is_reused(mixed, tmp_path):
    out = tmp_path / "out"
    prepare_dataset(mixed, "bytes", out, val_fraction=0.2, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    del meta["options"]["encoding_errors"]  # as an older angpt wrote it
    (out / "meta.json").write_text(json.dumps(meta))
    before = file_state(out)
    assert prepare_dataset(mixed, "bytes", out, val_fraction=0.2, progress=False)["documents"] == 10
    assert file_state(out) == before


# ------------------------------------------------------------------------------------------------ --overwrite
@pytest.fixture
def prepared(tmp_path):
    """A jsonl source of 60 documents prepared at val_fraction 0.1 into out/."""
    src = write_source("jsonl", tmp_path / "src", make_docs(60))
    prepare_dataset(src, "bytes", tmp_path / "out", val_fraction=0.1, progress=False)
    return src, tmp_path / "out"


def test_overwrite_replaces_a_prepared_dataset(prepared, tmp_path, capsys):
    src, out = prepared
    with pytest.raises(DataError, match="--overwrite to replace it"):
        prepare_dataset(src, "bytes", out, val_fraction=0.2, progress=False)
    meta = prepare_dataset(src, "bytes", out, val_fraction=0.2, overwrite=True, progress=False)
    assert load_meta(out) == meta and meta["val_fraction"] == 0.2
    assert decode_docs(out, "val") == expected_split(make_docs(60), 0.2)[1]
    assert no_temp_folders(tmp_path)
    args = ["prepare", "--source", str(src), "--tokenizer", "bytes", "--out", str(out), "--quiet"]
    assert main([*args, "--val-fraction", "0.3"]) == 2 and "--overwrite" in capsys.readouterr().err
    assert main([*args, "--val-fraction", "0.3", "--overwrite"]) == 0
    assert load_meta(out)["val_fraction"] == 0.3 and no_temp_folders(tmp_path)


def test_a_failed_overwrite_leaves_the_old_dataset_as_it_was(prepared, tmp_path, monkeypatch):
    src, out = prepared
    before = file_state(out)
    broken = tmp_path / "broken.jsonl"  # fails on its last line, while the new dataset is being built
    broken.write_text(src.read_text() + "{not json\n")
    with pytest.raises(DataError, match="broken.jsonl:62"):
        prepare_dataset(broken, "bytes", out, val_fraction=0.2, overwrite=True, progress=False)
    assert file_state(out) == before and no_temp_folders(tmp_path)
    # The new dataset is complete but cannot be moved into place: the old one is put back.
    real = os.replace

    def failing(a, b):
        if ".tmp-" in str(a) and Path(b) == out:
            raise OSError("disk gone")
        real(a, b)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="disk gone"):
        prepare_dataset(src, "bytes", out, val_fraction=0.2, overwrite=True, progress=False)
    assert file_state(out) == before and no_temp_folders(tmp_path)


def test_overwrite_refuses_a_folder_that_is_not_only_a_prepared_dataset(prepared, tmp_path):
    src, out = prepared
    (out / "notes.md").write_text("mine")
    before = file_state(out)
    with pytest.raises(DataError, match="notes.md") as e:
        prepare_dataset(src, "bytes", out, val_fraction=0.2, overwrite=True, progress=False)
    assert "--overwrite would delete" in one_line(e) and file_state(out) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.md").write_text("mine")
    with pytest.raises(DataError, match="not a prepared dataset"):
        prepare_dataset(src, "bytes", other, overwrite=True, progress=False)
    assert [p.name for p in other.iterdir()] == ["notes.md"] and no_temp_folders(tmp_path)


# ------------------------------------------------------------------------------------------ the held-out share
def sized_docs(n: int, nbytes: int) -> list[str]:
    """n distinct documents of exactly `nbytes` UTF-8 bytes (nbytes + 1 byte-tokens with EOS)."""
    return [f"{i:05d} " + "x" * (nbytes - 7) + "\n" for i in range(n)]


@pytest.mark.parametrize(
    "nbytes, k",
    [
        (5_000, 20),  # 20 documents hold 100K tokens: the documents' minimum
        (999, 50),  # 50 x 1,000 tokens: the tokens' minimum
        (200, 59),  # 50K tokens would need 249 documents: 10% of 595 is the most auto takes
    ],
)
def test_auto_holds_out_enough_documents_of_a_small_corpus(tmp_path, nbytes, k):
    docs = sized_docs(595, nbytes)
    src = write_source("jsonl", tmp_path / "src", docs)
    meta = prepare_dataset(src, "bytes", tmp_path / "out", progress=False)  # the default: auto
    vf, tf = meta["val_fraction"], meta["test_fraction"]
    assert meta["options"]["val_fraction_rule"] == "auto" and (meta["options"]["val_fraction"], vf) == (vf, vf)
    train, val, test = expected_split(docs, vf, test_fraction=tf)  # still assigned by hash < fraction
    assert (len(val), len(test), len(train)) == (k, k, 595 - 2 * k)
    for split, texts in (("train", train), ("val", val), ("test", test)):
        assert decode_docs(tmp_path / "out", split) == texts
    # An explicit fraction is honoured as given.
    given = prepare_dataset(src, "bytes", tmp_path / "given", val_fraction=0.005, progress=False)
    assert given["val_fraction"] == given["test_fraction"] == 0.005
    assert given["options"]["val_fraction_rule"] == "given"
    assert decode_docs(tmp_path / "given", "val") == expected_split(docs, 0.005)[1]


def test_auto_counts_only_the_documents_max_tokens_keeps(tmp_path):
    docs = sized_docs(595, 999)
    src = write_source("jsonl", tmp_path / "src", docs)
    meta = prepare_dataset(src, "bytes", tmp_path / "out", max_tokens=100_000, progress=False)
    assert meta["documents"] == 100 and meta["splits"]["val"]["documents"] == 10  # 10% of the 100 it keeps


def test_auto_reads_a_large_corpus_only_until_half_a_percent_is_enough():
    from angpt.data.sources import Source
    from angpt.data.splits import auto_fractions

    class Endless(Source):
        read = 0

        def __iter__(self):
            self.read = 0
            while True:  # 4,000 documents of 3 KB: 0.5% of them is 20 documents and 60K tokens
                assert self.read < 4_000, "read past the point where 0.5% meets the minimums"
                self.read += 1
                yield f"{self.read} " + "y" * 3_000

    src = Endless("endless")
    assert auto_fractions(src, 0, None, None) == (0.005, 0.005) and src.read == 4_000
    assert auto_fractions(src, 0, None, 0.0) == (0.005, 0.0)


def test_auto_reuses_its_dataset_and_one_prepared_before_auto(tmp_path):
    docs = sized_docs(300, 500)
    src = write_source("jsonl", tmp_path / "src", docs)
    out = tmp_path / "out"
    meta = prepare_dataset(src, "bytes", out, progress=False)
    before = file_state(out)
    assert prepare_dataset(src, "bytes", out, progress=False) == meta and file_state(out) == before
    with pytest.raises(DataError, match="val_fraction="):  # an explicit other fraction is another dataset
        prepare_dataset(src, "bytes", out, val_fraction=0.005, progress=False)
    # A folder written before auto existed, at the old default 0.005, is reused as it is by the new default.
    old = tmp_path / "old"
    prepare_dataset(src, "bytes", old, val_fraction=0.005, progress=False)
    stored = json.loads((old / "meta.json").read_text())
    del stored["options"]["val_fraction_rule"]
    (old / "meta.json").write_text(json.dumps(stored))
    before = file_state(old)
    assert prepare_dataset(src, "bytes", old, progress=False)["val_fraction"] == 0.005
    assert file_state(old) == before


def test_the_small_split_warning_gives_the_command_that_prepares_again(tmp_path, capsys):
    docs = sized_docs(400, 300)
    src = write_source("jsonl", tmp_path / "src", docs)
    out = tmp_path / "out"
    args = ["prepare", "--source", str(src), "--tokenizer", "bytes", "--out", str(out), "--quiet"]
    assert main([*args, "--val-fraction", "0.02", "--max-tokens", "100000"]) == 0
    err = capsys.readouterr().err.splitlines()
    small = [x for x in err if x.startswith("warning: the validation split holds")]
    assert len(small) == 1 and "too few to measure" in small[0] and "(now 0.02)" in small[0], err
    lines = [x for x in err if "angpt prepare" in x]
    assert len(lines) == 1 and lines[0].startswith("warning: to re-prepare with larger held-out splits"), lines
    command = shlex.split(lines[0].split(": ", 2)[2])
    assert command[:2] == ["angpt", "prepare"] and "--overwrite" in command and "--max-tokens" in command
    assert main(command[1:]) == 0  # it runs as printed, replacing the folder
    meta = load_meta(out)
    assert meta["val_fraction"] == float(command[command.index("--val-fraction") + 1]) > 0.02
    assert meta["splits"]["val"]["documents"] >= 20 and meta["max_tokens"] == 100_000


def test_worker_processes_make_the_same_dataset_as_one_process(tmp_path, monkeypatch):
    """`workers=N >= 2` tokenizes in processes, a few chunks ahead: the shards, splits and cut at max_tokens are
    byte for byte those of one process (the tokenizers pool) and of the serial path. Checked failing with the
    workers' split keyed by another seed and with their chunks taken out of order."""
    import random

    from angpt.data import load_meta, prepare_dataset
    from angpt.data import prepare as prep

    monkeypatch.setattr(prep, "_CHUNK_DOCS", 8)  # 15 chunks: more than the workers, so that order matters
    rng = random.Random(3)
    docs = tmp_path / "docs"
    docs.mkdir()
    words = "alpha beta gamma delta total count index value items result offset window".split()
    for i in range(120):
        (docs / f"d{i:03d}.txt").write_text(" ".join(rng.choice(words) for _ in range(rng.randint(20, 900))) + "\n")
    hashes = {}
    for workers in (None, 1, 3):
        out = tmp_path / f"w{workers}"
        meta = prepare_dataset(docs, "bpe:300", out, val_fraction=0.1, max_tokens=30_000, progress=False,
                               workers=workers, seed=7)  # fmt: skip
        assert meta["capped"] and meta["tokens"] == 30_000
        hashes[workers] = [(s, sh["sha256"]) for s, sp in load_meta(out)["splits"].items() for sh in sp["shards"]]
    assert hashes[3] == hashes[None] == hashes[1]
    assert {s for s, _ in hashes[3]} == {"train", "val", "test"}


def test_the_default_split_does_not_warn_about_its_own_choice_under_bpe(tmp_path, capsys):
    """`auto` holds out >= 50,000 bytes of text from >= 20 documents; under BPE those are far fewer tokens, and the
    small-split warning counted tokens, so prepare warned about the split it had just chosen (a 3 MB corpus, issue
    48). Counted in bytes, as auto counts, it is quiet; a split truly too small still warns, in bytes."""
    src = write_source("jsonl", tmp_path / "src", sized_docs(400, 2_000))
    out = tmp_path / "out"
    assert main(["prepare", "--source", str(src), "--tokenizer", "bpe:300", "--out", str(out), "--quiet"]) == 0
    meta = load_meta(out)
    val = meta["splits"]["val"]
    assert val["tokens"] < 50_000 <= val["bytes"] and val["documents"] >= 20  # what used to warn
    assert "split holds" not in capsys.readouterr().err
    small = tmp_path / "small"
    args = ["prepare", "--source", str(src), "--tokenizer", "bpe:300", "--out", str(small), "--quiet"]
    assert main([*args, "--val-fraction", "0.02"]) == 0
    assert "warning: the validation split holds " in capsys.readouterr().err
