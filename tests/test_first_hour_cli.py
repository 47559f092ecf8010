"""A newcomer's first hour at the command line: the version, defaults in the help, an export over an existing
folder, length warnings from an export's generate, and what a mistyped key, a missing dataset or a missing
checkpoint is told. Each test fails with its fix removed."""

import pytest

import angpt
from angpt.cli import main


def one_line_error(capsys, rc, *needles) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and all(n in err[0] for n in needles), err
    return err[0]


# ------------------------------------------------------------------------------------------------ --version
def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"angpt {angpt.__version__}"
