"""Every option of every attn-zoo command says what it does, and its default where it has one."""

import argparse

import pytest

from ablations.cli import parser


def commands(p: argparse.ArgumentParser, path=()):
    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


COMMANDS = dict(commands(parser()))


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: " ".join(p) or "attn-zoo")
def test_every_option_has_help_and_shows_its_default(path):
    p = COMMANDS[path]
    formatter = p.formatter_class(prog="attn-zoo")
    for action in p._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        assert action.help, f"{' '.join(path)} {action.dest}: no help"
        if action.default not in (None, False, [], argparse.SUPPRESS):
            shown = formatter._get_help_string(action) % {"default": action.default}
            assert "(default: " in shown, f"{' '.join(path)} {action.dest}: {shown!r}"


def test_version_is_the_packages_one(capsys):
    import attn_zoo
    from ablations.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"attn-zoo {attn_zoo.__version__}"
