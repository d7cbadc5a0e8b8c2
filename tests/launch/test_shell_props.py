"""Property-based tests of the shell evaluator against independent reference semantics."""
import shlex
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_plugin.launch import parse_script

from .helpers import array, run_shell

SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
MASK = (1 << 64) - 1


def wrap(v: int) -> int:
    v &= MASK
    return v - (1 << 64) if v >> 63 else v


def c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


@st.composite
def expr(draw, depth=0):
    """(bash text, value) built bottom-up so the expected value never uses the code under test."""
    if depth > 3 or draw(st.booleans()):
        n = draw(st.integers(0, 10**6))
        return str(n), n
    op = draw(st.sampled_from(["+", "-", "*", "/", "%", "?", "<", "=="]))
    a_t, a = draw(expr(depth + 1))
    b_t, b = draw(expr(depth + 1))
    if op in "/%" and b == 0:
        op = "+"
    if op == "?":
        c_t, c = draw(expr(depth + 1))
        return f"({c_t} ? {a_t} : {b_t})", a if c else b
    val = {"+": a + b, "-": a - b, "*": a * b, "<": int(a < b), "==": int(a == b)}.get(op)
    if op == "/":
        val = c_div(a, b)
    elif op == "%":
        val = a - c_div(a, b) * b
    return f"({a_t} {op} {b_t})", wrap(val)


@SETTINGS
@given(expr())
def test_arithmetic_matches_reference(e):
    text, value = e
    sh = run_shell(f"R=$(( {text} ))\n")
    assert sh.text_of("R") == str(value)


@SETTINGS
@given(st.integers(-10**9, 10**9), st.integers(-10**9, 10**9))
def test_arithmetic_through_variables_and_ternary(a, b):
    sh = run_shell(f"A={a}\nB=A\nR=$(( B > {b} ? B - {b} : {b} - A ))\n")
    assert sh.text_of("R") == str(a - b if a > b else b - a)


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\ue000\ue001"),
               max_size=40)


@SETTINGS
@given(TEXT)
def test_quoted_value_round_trips(s):
    sh = run_shell(f"X={shlex.quote(s)}\nY=\"$X\"\nZ=\"${{X}}\"\n")
    assert sh.text_of("Y") == s
    assert sh.text_of("Z") == s


WORDS = st.lists(st.text(alphabet=string.ascii_letters + string.digits + "-_.=/", min_size=1, max_size=8),
                 max_size=8)


@SETTINGS
@given(WORDS, st.sampled_from([" ", "  ", "\t", "\n "]))
def test_field_splitting_and_arrays(words, sep):
    joined = sep.join(words)
    sh = run_shell(f"X={shlex.quote(joined)}\nA=( $X )\nB=( \"$X\" )\nN=${{#A[@]}}\nC=( \"${{A[@]}}\" )\n")
    assert array(sh, "A") == words
    assert array(sh, "C") == words
    assert array(sh, "B") == [joined]
    assert sh.text_of("N") == str(len(words))


@SETTINGS
@given(st.one_of(st.none(), st.just(""), TEXT), TEXT)
def test_default_and_alternate_expansions(value, default):
    pre = "" if value is None else f"X={shlex.quote(value)}\n"
    sh = run_shell(pre + f"D={shlex.quote(default)}\nA=\"${{X:-$D}}\"\nB=\"${{X-$D}}\"\nC=\"${{X:+alt}}\"\n")
    unset_or_empty = value is None or value == ""
    assert sh.text_of("A") == (default if unset_or_empty else value)
    assert sh.text_of("B") == (default if value is None else value)
    assert sh.text_of("C") == ("" if unset_or_empty else "alt")


@SETTINGS
@given(st.integers(0, 10**12))
def test_underscore_removal(n):
    with_us = f"{n:_}"
    sh = run_shell(f"T={with_us}\nT=${{T//_}}\nS=$(( T / 1 ))\n")
    assert sh.text_of("T") == str(n)
    assert sh.text_of("S") == str(n)


LINES = st.lists(st.text(alphabet=string.ascii_letters + string.digits + ' {}":,.$', max_size=30)
                 .filter(lambda s: s != "EOT"), max_size=8)


@SETTINGS
@given(LINES)
def test_quoted_heredoc_writes_exact_file(lines):
    body = "".join(line + "\n" for line in lines)
    sh = run_shell("cat <<'EOT' > out.json\n" + body + "EOT\n")
    f = sh.vfs["/work/out.json"]
    assert f.text == body
    assert len(f.line_origins) == len([ln for ln in lines if ln]) or len(f.line_origins) == len(lines)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["TP", "PP", "MBS", "L"]), st.integers(1, 64), min_size=1))
def test_unquoted_heredoc_expands_variables(vals):
    assigns = "".join(f"{k}={v}\n" for k, v in vals.items())
    body = "".join(f'"{k}": ${k}\n' for k in vals)
    sh = run_shell(assigns + "cat <<EOT > cfg\n" + body + "EOT\n")
    want = "".join(f'"{k}": {v}\n' for k, v in vals.items())
    assert sh.vfs["/work/cfg"].text == want


@SETTINGS
@given(st.sampled_from(["a", "b", "c", "zz"]))
def test_if_elif_case_pick_the_known_branch(v):
    sh = run_shell(f"""V={v}
if [ "$V" = a ]; then R=1
elif [[ $V == b ]]; then R=2
else R=3; fi
case $V in a|b) S=ab ;; c*) S=c ;; *) S=other ;; esac
""")
    assert sh.text_of("R") == {"a": "1", "b": "2"}.get(v, "3")
    assert sh.text_of("S") == {"a": "ab", "b": "ab", "c": "c"}.get(v, "other")
    assert not sh.warnings


TOKENS = st.sampled_from(list("$(){}[]'\"`\\|&;<> \n#=-abcXY0123:?+*/%!") +
                         ["<<EOF", "EOF", "if ", "then ", "fi", "for ", "do ", "done", "${", "$((", "[[ "])


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(TOKENS, max_size=80).map("".join))
def test_parser_never_raises(text):
    res = parse_script("fuzz.sbatch", "#!/bin/bash\n" + text)
    assert res.job is None or res.error is None
    if res.error:
        assert res.error.startswith("cannot predict: ") and "\n" not in res.error


# The directive tokenizer is linear-time; shlex (quadratic in a word's length) is its reference.
@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab \t\"'\\#=-$x", max_size=40))
def test_split_directive_matches_shlex(line):
    import shlex

    from slurm_plugin.launch.sbatch import split_directive
    try:
        want = shlex.split(line, comments=True, posix=True)
    except ValueError:
        want = None
    try:
        got = split_directive(line)
    except ValueError:
        got = None
    assert got == want
