"""The generated references in ``docs/``: every command and every setting, made from the code.

``docs/commands.md`` is the help of every ``governor`` command, walked from the one parser
(``governor.cli.build_parser``); ``docs/settings.md`` is the settings table of
``core.settings.settings_table``.  Neither is written by hand: regenerate them with

    python -m governor.reference            # write both files
    python -m governor.reference --check    # exit 1 naming each file that differs

and ``tests/unit/test_reference_docs.py`` keeps them equal to the code.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["REFERENCES", "command_parsers", "commands_markdown", "main", "settings_markdown"]

#: Help is wrapped at this width whatever the terminal, so the file does not depend on who made it.
HELP_WIDTH = 100

_GENERATED = "Generated from the code by `python -m governor.reference`; do not edit by hand."


def command_parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Every parser under ``parser``, depth first, subcommands by name: (prog, help, parser).

    By name, not in the order they were registered, so the file does not move when the CLI's
    registry is reordered.

    >>> p = argparse.ArgumentParser(prog="g")
    >>> sub = p.add_subparsers()
    >>> a = sub.add_parser("a", help="first")
    >>> _ = a.add_subparsers().add_parser("x", help="inner")
    >>> _ = sub.add_parser("0")
    >>> [(prog, text) for prog, text, _ in command_parsers(p)]
    [('g', ''), ('g 0', ''), ('g a', 'first'), ('g a x', 'inner')]
    """
    yield from _walk(parser, "")


def _walk(parser: argparse.ArgumentParser, text: str) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    yield parser.prog, text, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in sorted(action.choices.items()):
                yield from _walk(child, helps.get(name, ""))


def _help(parser: argparse.ArgumentParser) -> str:
    """``parser``'s --help at HELP_WIDTH columns (the top level without its environment epilog:
    docs/settings.md is that list)."""
    parser.formatter_class = functools.partial(parser.formatter_class, width=HELP_WIDTH)  # type: ignore[call-arg]
    if " " not in parser.prog:
        parser.epilog = "environment: every variable is in docs/settings.md"
    return parser.format_help().rstrip()


def commands_markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """``docs/commands.md``: a section per command with its one-line help and its full --help."""
    if parser is None:
        from governor.cli import build_parser

        parser = build_parser()
    parsers = list(command_parsers(parser))
    out = [
        "# Command reference",
        "",
        _GENERATED,
        "",
        "Every `governor` command with its options, as `--help` prints them. The guides say when to",
        "use which: [README.md](../README.md), [operations.md](operations.md),",
        "[benchmarks.md](benchmarks.md).",
        "",
    ]
    out += [f"- [`{prog}`](#{_anchor(prog)}){': ' + text if text else ''}" for prog, text, _ in parsers[1:]]
    for prog, text, sub in parsers:
        out += ["", f"## {prog}", ""]
        if text:
            out += [text[0].upper() + text[1:] + ".", ""]
        out += ["```text", _help(sub), "```"]
    return "\n".join(out) + "\n"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading of words and dashes.

    >>> _anchor("governor bench control")
    'governor-bench-control'
    """
    return heading.lower().replace(" ", "-")


def settings_markdown() -> str:
    """``docs/settings.md``: every setting, its environment variable, default and meaning."""
    from core.settings import settings_table

    return "\n".join(
        [
            "# Settings reference",
            "",
            _GENERATED,
            "",
            "Every setting comes from its environment variable or from the config file that",
            "`GOVERNOR_CONFIG` names (keys: the field names of `docs/settings.schema.json`, the JSON",
            "Schema made from the same fields). How they are read, the config file and the secrets:",
            "[operations.md](operations.md#configuration).",
            "",
            settings_table(),
            "",
        ]
    )


#: file under the repository root -> the function that makes its text.
REFERENCES: dict[str, Callable[[], str]] = {
    "docs/commands.md": commands_markdown,
    "docs/settings.md": settings_markdown,
}


def main(argv: Sequence[str] | None = None, root: Path | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m governor.reference", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file that differs")
    args = ap.parse_args(argv)
    base = root if root is not None else Path(__file__).resolve().parents[1]
    stale = []
    for name, make in REFERENCES.items():
        path = base / name
        text = make()
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    for name in stale:
        print(f"{name}: {'differs from the code' if args.check else 'written'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
