"""`make test-compat`: the tests at our seams to outside libraries, in throwaway environments holding (a) the newest
releases within our declared ranges and (b) the oldest we declare. Prints one table: versions, passed / failed.

    python3 .ci/compat.py [newest] [oldest] [--keep]

- newest: a fresh venv, torch installed first and alone (`pip install torch==2.13.0`: the CPU build; torch is not
  upgraded past it, since every newer torch here is a CUDA download of several GB), then `pip install -e
  ".[all extras]"` with no constraints, as a new user's install resolves it today.
- oldest: the same torch, then the lowest versions that our declared floors resolve to (uv's `lowest-direct`
  resolution of pyproject.toml: direct dependencies at their floors, the rest as new as they allow), installed
  exactly. The leg fails when a direct dependency resolves above its declared floor: the floor would be a claim
  that no run has checked, so it must be raised to what ran.

Each leg runs SEAM_TESTS (HF export / import / generate, lm-eval, datasets, tokenizers, torch.compile, DDP and FSDP2
on gloo) and reports pytest's summary line. Exit status: 0 when every leg passed. Needs only the standard library
and a network path to the package registry; the venvs live in .venv-compat/ (removed afterwards unless --keep).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".venv-compat"
TORCH = "torch==2.13.0"
EXTRAS = "hf,eval,plot,log,dev,scaling"
# The tests that touch outside libraries (kept lean: CI runs the newest leg on every submission).
SEAM_TESTS = [
    "tests/test_hf_export.py",
    "tests/test_hf_generation.py",
    "tests/test_qwen3_parity.py",
    "tests/test_lm_eval.py",
    "tests/test_tokenformer.py",
    "tests/test_data.py::test_bpe_tokenizer",
    "tests/test_data.py::test_hf_sources_through_datasets",
    "tests/test_data.py::test_hf_hub_offline_fails_fast",
    "tests/test_compile.py::test_compiled_training_is_one_graph_matches_eager_and_does_not_recompile",
    "tests/test_compile.py::test_compiled_kv_cache_generation_matches_eager_without_recompiling_every_step",
    "tests/test_train.py::test_two_ranks_match_one_process_and_resume",
    "tests/test_precision.py::test_fsdp_mixed_precision_policy_under_bf16",
]
SHOWN = ["torch", "transformers", "tokenizers", "huggingface-hub", "datasets", "lm-eval", "safetensors", "numpy"]
# torch's own CUDA dependencies in PyPI's metadata: never installed here (the CPU build is).
NOT_INSTALLED = re.compile(r"^(torch|triton|nvidia-[\w-]+|cuda-[\w-]+)==", re.I)


def log(msg: str) -> None:
    print(f"[compat] {msg}", flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, text=True, **kw)


def pip(venv: Path, *args: str) -> None:
    res = run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True,
    )
    if res.returncode:
        sys.stdout.write(res.stdout + res.stderr)
        raise RuntimeError(f"pip install {' '.join(args)} failed")


def declared() -> dict[str, str]:
    """{name: floor} of every dependency in pyproject.toml that declares one (">=X")."""
    text = (ROOT / "pyproject.toml").read_text()
    text = text[text.index("[project]") : text.index("[project.scripts]")]  # not the build system's setuptools
    return {
        norm(name): floor for name, floor in re.findall(r'"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?>=([0-9][^,"<;\s]*)', text)
    }


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lowest_direct(venv: Path) -> Path:
    """A fully pinned requirements file: uv's lowest-direct resolution of pyproject.toml with torch fixed."""
    pip(venv, "uv")
    override = WORK / "torch-override.txt"
    override.write_text(TORCH + "\n")
    out = WORK / "oldest-resolved.txt"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    cmd = [
        str(venv / "bin" / "uv"),
        "pip",
        "compile",
        "pyproject.toml",
        "--resolution",
        "lowest-direct",
        "--python-version",
        ver,
        "--override",
        str(override),
        "--quiet",
        "--no-header",
        "-o",
        str(out),
    ]
    for extra in EXTRAS.split(","):
        cmd += ["--extra", extra]
    res = run(cmd, capture_output=True)
    if res.returncode:
        sys.stdout.write(res.stdout + res.stderr)
        raise RuntimeError("uv could not resolve the declared floors")
    pins = [ln for ln in out.read_text().splitlines() if re.match(r"^[A-Za-z0-9]", ln) and not NOT_INSTALLED.match(ln)]
    out.write_text("\n".join(pins) + "\n")
    return out


def versions(venv: Path) -> dict[str, str]:
    res = run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
    )
    return {norm(a): b for a, _, b in (ln.partition("==") for ln in res.stdout.splitlines()) if b}


def leg(name: str) -> dict:
    venv = WORK / name
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.time()
    log(f"{name}: creating {venv.relative_to(ROOT)}")
    run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip(venv, TORCH)
    problems = []
    if name == "newest":
        pip(venv, "-e", f".[{EXTRAS}]")
    else:
        pinned = lowest_direct(venv)
        pip(venv, "--no-deps", "-r", str(pinned))
        pip(venv, "--no-deps", "-e", ".")
        have = versions(venv)
        for dep, floor in declared().items():
            if dep in have and have[dep].split("+")[0] != floor:
                problems.append(f"{dep}>={floor} resolves to {have[dep]}: raise the floor to what ran")
    check = run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True)
    if check.returncode:
        problems.append("pip check: " + check.stdout.strip().replace("\n", "; "))
    have = versions(venv)
    log(f"{name}: installed in {time.time() - t0:.0f}s; running {len(SEAM_TESTS)} seam test groups")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    res = run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SEAM_TESTS],
        capture_output=True,
        env=env,
    )
    summary = next(
        (ln.strip("= ") for ln in reversed(res.stdout.splitlines()) if re.search(r"\d+ (passed|failed|error)", ln)), ""
    )
    if res.returncode:
        sys.stdout.write(res.stdout[-6000:] + res.stderr[-2000:])
    ok = res.returncode == 0 and not problems
    return {
        "leg": name,
        "ok": ok,
        "versions": have,
        "summary": summary or f"pytest exit {res.returncode}",
        "problems": problems,
        "seconds": time.time() - t0,
    }


def table(results: list[dict]) -> str:
    head = ["leg", *SHOWN, "tests", "result"]
    rows = [
        [r["leg"], *(r["versions"].get(d, "-") for d in SHOWN), r["summary"], "PASS" if r["ok"] else "FAIL"]
        for r in results
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    keep = "--keep" in argv
    legs = [a for a in argv if not a.startswith("--")] or ["newest", "oldest"]
    bad = [a for a in legs if a not in ("newest", "oldest")]
    if bad:
        print(f"compat: unknown leg {bad[0]!r}; the legs are newest and oldest", file=sys.stderr)
        return 2
    WORK.mkdir(exist_ok=True)
    results = []
    for name in legs:
        try:
            results.append(leg(name))
        except RuntimeError as e:
            results.append({"leg": name, "ok": False, "versions": {}, "summary": str(e), "problems": [], "seconds": 0})
    print()
    print(table(results))
    for r in results:
        for p in r["problems"]:
            print(f"{r['leg']}: {p}")
    if not keep:
        shutil.rmtree(WORK, ignore_errors=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
