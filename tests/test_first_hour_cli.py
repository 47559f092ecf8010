"""A newcomer's first hour at the command line: the version, defaults in the help, an export over an existing
folder, length warnings from an export's generate, and what a mistyped key, a missing dataset or a missing
checkpoint is told. Each test fails with its fix removed."""

import argparse

import pytest

import angpt
from angpt.cli import build_parser, main


def one_line_error(capsys, rc, *needles) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and all(n in err[0] for n in needles), err
    return err[0]


def verb(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


# ------------------------------------------------------------------------------------------------ --version
def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"angpt {angpt.__version__}"


# ------------------------------------------------------------------------------------------- help defaults
@pytest.mark.parametrize("name", ["prepare", "generate", "export"])
def test_every_option_with_a_value_shows_its_default(name):
    hidden = []
    for action in verb(name)._actions:
        takes_value = action.option_strings and action.nargs != 0 and not action.required
        if takes_value and "default" not in (action.help or ""):
            hidden.append(action.option_strings[0])
    assert not hidden, f"{name}: say the default of {hidden}"
    text = verb(name).format_help()
    for action in verb(name)._actions:  # a literal default is printed as it is
        if isinstance(action.default, (int, float, str)) and action.nargs != 0 and action.option_strings:
            assert f"(default: {action.default})" in " ".join(text.split()), action.option_strings[0]
