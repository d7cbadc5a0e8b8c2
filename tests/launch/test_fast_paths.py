"""The parser's shortcuts for common input read exactly what the general code reads.

Runs of plain command arguments (shell_parse._ARG_RUN), #SBATCH lines without quoting and plain
decimal arguments each have a shortcut; here each is compared with the general path it skips.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_plugin.launch import shell_parse
from slurm_plugin.launch.facts import Facts
from slurm_plugin.launch.limits import Budget, CannotPredict
from slurm_plugin.launch.values import Tok, Unknowns

# Words around the shortcut's edges: fds before redirections, comments, continuations, quotes,
# Unicode digits and blanks that end no word.
PIECES = ["2", "12", "123", "2>", ">", ">>", "<", "&", "&>", "2>&1", "x", "--a", "-b", "#c", "a#b", "\\\n",
          " ", "\t", "\xa0", "\x1c", "é", "\u0663", "\u0663>", "\r", "\r\n", "(", ")", "|", ";", "\n", "'q'",
          '"d"', "$V", "${V}", "\\x", "=", "A=1", "[[", "]]", "{", "}", "\f", "\v", "\\", "`x`", "$(y)", "1<",
          "--k=v", "0", "9x", "x9", "#", "~", "~/p", "*", "<<E\nb\nE\n"]
SEPARATORS = ["", " ", " ", "\\\n  "]


def _dump(node) -> str:
    """The whole syntax tree as text (every slot of every node)."""
    if isinstance(node, (list, tuple)):
        return "[" + ",".join(_dump(x) for x in node) + "]"
    slots = [s for cls in type(node).__mro__ for s in getattr(cls, "__slots__", ())]
    if not slots:
        return repr(node)
    fields = ",".join(f"{s}={_dump(getattr(node, s, None))}" for s in sorted(set(slots)))
    return f"{type(node).__name__}{{{fields}}}"


def _parse(text: str) -> str:
    try:
        return _dump(shell_parse.Parser(text, "t.sh", Budget(10.0), line_offset=3).parse_all())
    except CannotPredict as exc:
        return "error: " + exc.line()


@settings(max_examples=400, deadline=None, database=None)
@given(st.sampled_from(["srun", "python", "echo", "export", "A=1 cmd", "cmd 2", ""]),
       st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from(SEPARATORS)), max_size=30))
def test_argument_runs_read_as_word_by_word(first, pieces):
    text = first + " " + "".join(p + s for p, s in pieces)
    with_runs = _parse(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shell_parse, "_ARG_RUN", re.compile(r"(?!)"))    # never matches: word by word
        assert _parse(text) == with_runs


def test_a_long_run_falls_back_to_the_word_limit():
    # the run is longer than MAX_COMMAND_WORDS: the word-by-word loop names the limit
    text = "srun python x.py " + "--a 1 " * 6000
    assert _parse(text).startswith("error: cannot predict: a command of more than")


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(alphabet="0123456789 _+-.e\u0663x", max_size=18))
def test_plain_decimal_argument_reads_as_set_int_value(word):
    short, full = Facts(Unknowns()), Facts(Unknowns())
    short.set_int("k", Tok(word, [(word, "t.sh:1")]), what="--k")
    full.set_int_value("k", word, "t.sh:1", what="--k")
    assert short.d == full.d and short.warnings == full.warnings
