import os

# Tests never touch the network: the hub would hang for tens of seconds without these.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Machine measurements (the CPU's bf16 speed) go to a folder of this test session, not the user's cache.
if "ANGPT_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["ANGPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="angpt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ANGPT_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Where the Slurm tests are left out (`make test`: -m "not slurm"), the summary says so and why."""
    expr = config.getoption("markexpr") or ""
    if "not slurm" not in expr:
        return
    from angpt.study.slurm import available

    why = available()
    here = f"no Slurm here: {why}" if why else "a Slurm is up here"
    terminalreporter.write_line(
        f"Slurm tests left out by -m {expr!r}; `make test-slurm` starts a one-node Slurm and runs them ({here})"
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """`angpt train` run in this process reads how busy the machine is (train/hardware.py's cpu_share): here it
    reads it as quiet at once (no 0.25 s sample a run), and no test's thread count leaks into the next.
    tests/test_hardware.py checks the real reading."""
    import angpt.train.hardware as hardware

    monkeypatch.setattr(hardware, "busy_cores", lambda *a, **k: 0.0)
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: two OpenMP threads on a busy 2-core machine are far slower for tiny models."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tok():
    from angpt.data import make_tokenizer

    return make_tokenizer("bytes")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A small byte-level dataset: 60 documents of shuffled pangram words, 10% of them for validation."""
    from angpt.data import prepare_dataset

    root = tmp_path_factory.mktemp("corpus")
    docs = root / "docs"
    docs.mkdir()
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex jumbo plums".split()
    for i in range(60):
        text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(400))
        (docs / f"doc{i:03d}.txt").write_text(text + "\n")
    out = root / "bytes"
    prepare_dataset(docs, "bytes", out, val_fraction=0.1, progress=False)
    return out
