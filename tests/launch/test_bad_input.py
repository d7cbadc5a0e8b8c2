"""Bad input never crashes or hangs: one line 'cannot predict: … (file:line)'. Timing is in benchmarks/."""
import os
import re

import pytest

from slurm_plugin.launch import parse_script

HEAD = "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=8\n"
LAUNCH = ("srun python pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 2 "
          "--seq-length 64 --micro-batch-size 1 --train-iters 1\n")


def _err(res):
    assert res.job is None
    assert res.error is not None and res.error.startswith("cannot predict: ")
    assert "\n" not in res.error
    return res.error


def _where(err):
    m = re.search(r"\(([^()]*):(\d+)\)$", err)
    assert m, f"no (file:line) at the end of {err!r}"
    return m.group(1), int(m.group(2))


def test_binary_garbage(tmp_path):
    p = tmp_path / "garbage.sbatch"
    p.write_bytes(b"#!/bin/bash\n" + bytes(range(256)) * 64)
    err = _err(parse_script(str(p)))
    assert "not a text file" in err
    assert _where(err)[0].endswith("garbage.sbatch")


def test_random_text_garbage_is_not_a_crash():
    res = parse_script(None, "\x01\x02(((( ${{{ ''' \"\" $(( ))) ` if then fi " * 1000)
    _err(res)


def test_script_over_4_mib_from_disk(tmp_path):
    p = tmp_path / "big.sbatch"
    p.write_bytes(b"# " + b"x" * (4 << 20) + b"\n")
    err = _err(parse_script(str(p)))
    assert "big.sbatch" in err


def test_4_mib_of_commands_stops_at_the_budget():
    text = HEAD + "echo hello world\n" * ((4 << 20) // 17)
    err = _err(parse_script("huge.sbatch", text))
    assert "huge.sbatch" in err


@pytest.mark.parametrize("body, what, line", [
    ("X='unterminated\n" + LAUNCH, "unterminated single quote", 3),
    ('X="unterminated\n' + LAUNCH, "unterminated double quote", 3),
    ("cat <<EOT > ds.json\n{\n}\n", "unterminated heredoc 'EOT'", 3),
    ("X=$(echo (\n", "", 3),
    ("if true; then\n echo x\n", "missing", 5),
    ("A=( 1 2\n", "unterminated array", 4),
    ("echo ${X\n", "bad substitution", 3),
])
def test_unterminated_constructs(body, what, line):
    err = _err(parse_script("bad.sbatch", HEAD + body))
    assert what in err
    f, ln = _where(err)
    assert f == "bad.sbatch" and ln >= 3


def test_yaml_alias_bomb(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("num_layers: 2")
    (tmp_path / "bomb.yml").write_text("\n".join(lines) + "\n")
    (tmp_path / "job.sbatch").write_text(HEAD + "python deepy.py train.py bomb.yml\n")
    err = _err(parse_script(str(tmp_path / "job.sbatch")))
    assert "bomb.yml" in err and "aliases" in err


def test_recursive_yaml_alias(tmp_path):
    (tmp_path / "rec.yml").write_text("a: &a [*a]\nnum_layers: 2\n")
    (tmp_path / "job.sbatch").write_text(HEAD + "python deepy.py train.py rec.yml\n")
    err = _err(parse_script(str(tmp_path / "job.sbatch")))
    assert "rec.yml" in err


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deep_json(tmp_path, depth):
    (tmp_path / "ds.json").write_text("[" * depth + "]" * depth)
    (tmp_path / "job.sbatch").write_text(HEAD + LAUNCH.rstrip("\n") + " --deepspeed_config ds.json\n")
    err = _err(parse_script(str(tmp_path / "job.sbatch")))
    assert "ds.json" in err and "nested" in err


def test_deep_block_yaml(tmp_path):
    text = "".join(" " * i + f"k{i}:\n" for i in range(300)) + " " * 300 + "v: 1\n"
    (tmp_path / "deep.yml").write_text(text)
    (tmp_path / "job.sbatch").write_text(HEAD + "python deepy.py train.py deep.yml\n")
    err = _err(parse_script(str(tmp_path / "job.sbatch")))
    assert "deep.yml" in err


def test_source_loop(tmp_path):
    (tmp_path / "a.sh").write_text("X=1\nsource ./b.sh\n")
    (tmp_path / "b.sh").write_text("source ./a.sh\n")
    (tmp_path / "job.sbatch").write_text(HEAD + "source ./a.sh\n" + LAUNCH)
    err = _err(parse_script(str(tmp_path / "job.sbatch")))
    assert ".sh" in err
    assert "source" in err or "sourced" in err


def test_symlink_loop_config(tmp_path):
    os.symlink(tmp_path / "loop2.yml", tmp_path / "loop1.yml")
    os.symlink(tmp_path / "loop1.yml", tmp_path / "loop2.yml")
    (tmp_path / "job.sbatch").write_text(HEAD + "python deepy.py train.py loop1.yml\n")
    err = _err(parse_script(str(tmp_path / "job.sbatch")))
    assert "loop1.yml" in err
    f, line = _where(err)
    assert f.endswith("job.sbatch") and line == 3


def test_symlink_loop_script(tmp_path):
    os.symlink(tmp_path / "s2", tmp_path / "s1")
    os.symlink(tmp_path / "s1", tmp_path / "s2")
    err = _err(parse_script(str(tmp_path / "s1")))
    assert "s1" in err


def test_fifo_config_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "fifo.yml")
    (tmp_path / "job.sbatch").write_text(HEAD + "python deepy.py train.py fifo.yml\n")
    err = _err(parse_script(str(tmp_path / "job.sbatch")))
    assert "fifo.yml" in err and "not a regular file" in err


def test_unreadable_config_names_the_file_not_its_contents(tmp_path):
    (tmp_path / "secret.yml").write_text("num_layers: 4  # WANDB_API_KEY=deadbeef\n")

    def deny(path):
        raise PermissionError(13, "Permission denied")
    (tmp_path / "job.sbatch").write_text(HEAD + "python deepy.py train.py secret.yml\n")
    res = parse_script(str(tmp_path / "job.sbatch"), read_file=deny)
    # the script itself is read with the same reader: denied too, and said so
    err = _err(res)
    assert "permission denied" in err and "deadbeef" not in err


@pytest.mark.parametrize("body, what", [
    ("while true; do :; done\n", "commands"),
    ("f() { f; }\nf\n", "recurses too deeply"),
    ("X=ab\nfor i in $(seq 1 40); do X=$X$X; done\n", "KiB"),
    ("eval 'eval \"$CMD\"'\nCMD='eval \"$CMD\"'\neval \"$CMD\"\n", "deep"),
    ("A=$(( 1 / 0 ))\nfor ((;;)); do X=1; done\n", "shell commands"),
    ("for ((;;)); do (( 1 )); done\n", "loops run too many"),
])
def test_runaway_shell(body, what):
    # The counted bounds must stop these whatever the machine's speed: a wall clock this long
    # never fires first, so the message is the same on a fast machine and a loaded one.
    err = _err(parse_script("loop.sbatch", HEAD + body + LAUNCH, deadline_s=600.0))
    assert what in err


def test_wall_clock_bound_is_the_last_resort():
    # An already-spent deadline stops even a script that no counted bound would.
    err = _err(parse_script("loop.sbatch", HEAD + "for ((;;)); do (( 1 )); done\n" + LAUNCH, deadline_s=0.0))
    assert "took too long" in err


def test_parse_script_never_raises_on_odd_arguments():
    assert parse_script(None).error.startswith("cannot predict")
    assert parse_script("/nonexistent/x.sbatch").error.startswith("cannot predict: cannot read /nonexistent/x.sbatch")


# ------------------------------------------------------------------ hostile directive lines
def test_megabyte_directive_is_skipped_with_a_warning_and_the_rest_is_read():
    long_line = "#SBATCH --comment=" + "x" * (1 << 20) + "\n"
    res = parse_script("long.sbatch", HEAD + long_line + "#SBATCH --time=2:00:00\n" + LAUNCH)
    assert res.error is None or "took too long" not in res.error
    assert any("not read" in w and "long.sbatch:3" in w for w in res.warnings), res.warnings
    assert res.request.time_limit_minutes == 120


def test_directive_words_follow_posix_quoting():
    from slurm_plugin.launch.sbatch import split_directive
    assert split_directive(" --comment='a b' \"c \\\" d\" e\\ f # note") == ["--comment=a b", 'c " d', "e f"]
    assert split_directive(" -J x#y") == ["-J", "x"]
    for bad in (" 'open", ' "open', " trailing\\"):
        with pytest.raises(ValueError):
            split_directive(bad)


@pytest.mark.parametrize("body,what", [
    ("echo " + "a " * 20_000 + "\n", "more than 10000 words"),
    ("X=" + "$((" * 200 + "1" + "))" * 200 + "\n", "nested too deeply"),
])
def test_oversized_shell_shapes_end_with_a_reason(body, what):
    err = _err(parse_script("big.sbatch", HEAD + body + LAUNCH, deadline_s=600.0))
    assert what in err


def test_long_escaped_word_is_read_linearly_and_whole():
    # 50k escaped quotes in one double-quoted word: merged into one literal, not 50k pieces.
    res = parse_script("dq.sbatch", HEAD + 'X="' + 'a\\"' * 50_000 + '"\n' + LAUNCH, deadline_s=600.0)
    assert res.error is None, res.error


def test_directive_of_thousands_of_words_is_skipped_with_a_warning():
    res = parse_script("many.sbatch", HEAD + "#SBATCH" + " -N 1" * 5000 + "\n" + LAUNCH, deadline_s=600.0)
    assert any("10000 words not read" in w and "many.sbatch:3" in w for w in res.warnings), res.warnings


def test_dos_line_breaks_are_named_as_sbatch_names_them(tmp_path):
    """A script saved on Windows: sbatch refuses it; it used to read "unexpected '\\r'" on a
    Megatron launch and predict a NeoX one as if nothing were wrong."""
    p = tmp_path / "win.sbatch"
    p.write_bytes((HEAD + "\n" + LAUNCH).replace("\n", "\r\n").encode())
    err = _err(parse_script(str(p)))
    assert "DOS line breaks" in err and "dos2unix" in err
    assert _where(err) == (str(p), 1)
    # A lone \r inside a line (a quoted argument, say) is not a line break: not refused.
    res = parse_script(None, HEAD + "X='a\rb'\n" + LAUNCH)
    assert res.error is None and res.job is not None
    late = HEAD + "\n" + LAUNCH.replace("\n", "\r\n")
    assert _where(_err(parse_script(None, late)))[1] == 4
