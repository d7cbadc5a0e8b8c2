"""Values no launch script means, answered as the user's error and never as "internal parser error"
(issue 32): integers past Python's 4,300-digit conversion limit and lone surrogates (a JSON escape
of no character) in text that the shell writes to a file and a config reader then parses."""
from __future__ import annotations

import pytest

from slurm_plugin.launch import parse_script

BIG = "9" * 5000          # int(BIG) raises ValueError: Python refuses more than 4,300 digits
LAUNCH = ("srun python pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 2 "
          "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
          "--train-iters 10\n")


def _answer(script: str):
    res = parse_script("job.sh", script)
    assert res.error is None or ("internal" not in res.error and res.error.startswith("cannot predict: ")), \
        res.error
    return res


@pytest.mark.parametrize("script", [
    f"#!/bin/bash\nset -- a b\nsrun python pretrain_gpt.py --num-layers ${{{BIG}}}\n",
    f"#!/bin/bash\nA=([{BIG}]=x)\n" + LAUNCH,
    f"#!/bin/bash\nA=([1]=x [{BIG}]=y z)\necho ${{A[@]}}\n" + LAUNCH,
    f"#!/bin/bash\nA=(x y)\nA+=(z)\nA[{BIG}]=w\nA+=(v)\necho ${{A[-1]}}\n" + LAUNCH,
    f"#!/bin/bash\nif [ {BIG} -gt 1 ]; then X=1; fi\n" + LAUNCH,
    f"#!/bin/bash\nshift {BIG}\n" + LAUNCH,
], ids=["positional", "array-key", "array-next-index", "array-append", "test", "shift"])
def test_huge_integers_are_user_errors_or_ignored(script):
    _answer(script)


def test_huge_positional_names_nothing():
    res = _answer(f"#!/bin/bash\nL=${{{BIG}}}\n" + LAUNCH.replace("--num-layers 2", "--num-layers 2$L"))
    assert res.job is not None and res.job.model.layers == 2


def test_lone_surrogate_in_a_heredoc_written_json_is_replaced_not_a_crash():
    script = ('#!/bin/bash\ncat > ds.json <<EOF\n{"train_batch_size": "\udcff", "zero_optimization": '
              '{"stage": 1}}\nEOF\nsrun deepspeed pretrain_gpt.py --deepspeed --deepspeed_config ds.json '
              + LAUNCH.split("pretrain_gpt.py ", 1)[1])
    res = _answer(script)
    # The value is what a file would hold for an undecodable byte (U+FFFD): named, never a crash;
    # a word as a batch size stops DeepSpeed at start, so the prediction stops with it.
    assert res.job is None and "train_batch_size" in res.error and "\ufffd" in res.error, res.error


def test_lone_surrogate_in_the_script_and_its_environment():
    res = parse_script("job.sh", "#!/bin/bash\n# \udcff\nX=\"\udcff\"\n" + LAUNCH, env={"Y": "\ud800"})
    assert res.job is not None, res.error


@pytest.mark.parametrize("script", [
    f"#!/bin/bash\n#SBATCH --time={BIG}\n" + LAUNCH,
    f"#!/bin/bash\n#SBATCH --time=1-{BIG}\n" + LAUNCH,
    f"#!/bin/bash\n#SBATCH --nodes={BIG}\n" + LAUNCH,
    f"#!/bin/bash\n#SBATCH --gpus-per-node={BIG}\n" + LAUNCH,
    f"#!/bin/bash\ncat > t.toml <<EOF\n[training]\nsteps = {BIG}\nEOF\n"
    "torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file t.toml\n",
], ids=["time", "time-days", "nodes", "gpus-per-node", "torchtitan-steps"])
def test_huge_integers_in_sbatch_lines_and_configs_are_user_errors(script):
    _answer(script)


# ---- values found by a hostile-input QA round: each an answer, not an internal error, and none
# built in full before the limit that refuses it
from .helpers import parse_in  # noqa: E402

HEAD = "#!/bin/bash\n#SBATCH -N 1\n#SBATCH --gpus-per-node 8\n"
NEOX = ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 2\nseq_length: 128\nmax_position_embeddings: 128\n"
        "train_micro_batch_size_per_gpu: 1\n")
TT = "srun torchrun --nnodes 1 --nproc_per_node 8 -m torchtitan.train --job.config_file c.toml {}\n"
TOML = ("[model]\nname = \"llama3\"\nflavor = \"8B\"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\nsteps = 10\n"
        "[parallelism]\ndata_parallel_replicate_degree = 1\ndata_parallel_shard_degree = -1\n"
        "tensor_parallel_degree = 1\n")


@pytest.mark.parametrize("neox_line", ['"save-interval": .nan\n', '"save-interval": -.inf\n',
                                       "expansion_factor: .nan\n", "expansion_factor: -.inf\n"])
def test_yaml_special_floats_are_no_settings(tmp_path, neox_line):
    res = parse_in(tmp_path, HEAD + "python deepy.py train.py c.yml\n", {"c.yml": NEOX + neox_line})
    assert res.error is None or "internal" not in res.error, res.error


@pytest.mark.parametrize("script, files, said", [
    (HEAD + "python deepy.py train.py c.yml\n", {"c.yml": NEOX.replace("hidden_size: 64", "hidden_size: 1e308")},
     "hidden_size is '1e308'"),
    (HEAD + LAUNCH.replace("--hidden-size 64", "--hidden-size 1e308"), {}, "--hidden-size is '1e308', too large for any job"),
    (HEAD + TT.format("--parallelism.tensor_parallel_degree=0"), {"c.toml": TOML},
     "tensor_parallel_degree 0 must be at least 1"),
    (HEAD + TT.format(""), {"c.toml": TOML.replace("replicate_degree = 1", "replicate_degree = 0")},
     "data_parallel_replicate_degree 0 must be at least 1"),
    (HEAD + TT.format(""), {"c.toml": TOML.replace("shard_degree = -1", "shard_degree = 0")},
     "data_parallel_shard_degree 0 must be -1 or at least 1"),
])
def test_impossible_numbers_stop_with_the_users_error(tmp_path, script, files, said):
    res = parse_in(tmp_path, script, files)
    assert res.job is None and said in res.error and "internal" not in res.error, res.error


def test_a_printf_width_past_the_value_limit_is_refused_without_building_it():
    from slurm_plugin.launch.limits import MAX_VALUE_CHARS
    from slurm_plugin.launch.shell import _clamped_spec, _printf
    assert _clamped_spec("%0999999999d") == f"%0{MAX_VALUE_CHARS + 1}d"
    assert _clamped_spec("%-5.999999999f") == f"%-5.{MAX_VALUE_CHARS + 1}f"
    assert _printf("%05d|%-4s|%.2f|%x", ["42", "ab", "3.14159", "255"]) == "00042|ab  |3.14|ff"
    res = parse_script("job.sh", HEAD + "printf -v X '%0999999999d' 1\necho $X\n" + LAUNCH)
    assert res.job is None and "grows beyond 256 KiB" in res.error, res.error


def test_a_long_base_60_yaml_number_stays_text():
    from slurm_plugin.launch.configs import load_config
    data = load_config("a: 1:30\nb: 1:2:3:4:5:6\nc: " + "1:" * 1000 + "1\n", "x.yml").data
    assert data["a"] == 90 and data["b"] == "1:2:3:4:5:6" and data["c"].startswith("1:1:1")


def test_neox_config_files_are_bounded_in_number(tmp_path):
    from slurm_plugin.launch.limits import MAX_SOURCED_FILES
    res = parse_in(tmp_path, HEAD + "python deepy.py train.py " + "c.yml " * (MAX_SOURCED_FILES + 1) + "\n",
                   {"c.yml": NEOX})
    assert res.job is None and f"config files (more than {MAX_SOURCED_FILES})" in res.error, res.error


def test_torchtitan_unknown_keys_past_the_bound_are_counted_not_looked_up(tmp_path):
    from slurm_plugin.launch.limits import MAX_KEY_SUGGESTIONS
    extra = "".join(f"[sectx{i}]\na = 1\n" for i in range(MAX_KEY_SUGGESTIONS + 50))
    res = parse_in(tmp_path, HEAD + TT.format(""), {"c.toml": TOML + extra})
    assert res.error is None or "sectx" not in res.error, res.error
    said = [w for w in (res.warnings or []) if "more keys that are not TorchTitan config keys" in w]
    # the sections' look-ups used the bound up: each of their keys is counted
    assert said and said[0].endswith(f": {MAX_KEY_SUGGESTIONS + 50} more keys that are not TorchTitan config keys "
                                     "(not looked at)"), said


def test_key_suggestion_lists_are_cached_by_value_and_bounded():
    from slurm_plugin.launch.neox_keys import _by_length, suggest
    _by_length.cache_clear()
    for i in range(500):                 # a fresh set per call, as a config's own keys are
        suggest("enabld", frozenset({"enabled", f"other{i}"}))
    assert _by_length.cache_info().currsize <= 64
    assert suggest("enabld", frozenset({"enabled"})) == "enabled"


def test_shell_patterns_with_many_stars_match_without_backtracking():
    # (a greedy regex per star retried every split: 5 stars on 200 characters took 4.6 s; these
    # 8 stars on 5,000 would not end) case, [[ == ]], [[ != ]] and ${X##…}/${X%%…} as bash reads them
    a = "a" * 5000
    stars = "*a*a*a*a*a*a*a*b"
    body = (f"X={a}\nL=2\n"
            f'case "$X" in {stars}) L=3;; *a) L=4;; esac\n'
            f"if [[ $X == {stars} ]]; then L=5; fi\n"
            f"[[ $X != {stars} ]] || L=6\n"
            f'P="${{X##{stars}}}"; S="${{X%%a*}}"\n'
            '[[ ${#P} == 5000 && -z $S ]] || L=7\n')
    res = _answer("#!/bin/bash\n" + body + LAUNCH.replace("--num-layers 2", "--num-layers $L"))
    assert res.job is not None and res.job.model.layers == 4, (res.error, res.job)


def test_shell_pattern_matching_is_fnmatchs():
    import fnmatch
    import random
    import re

    from slurm_plugin.launch.shell import _glob_tokens, _whole
    rng = random.Random(7)
    for _ in range(5000):
        pat = "".join(rng.choice("ab?*") for _ in range(rng.randint(0, 7))) + rng.choice(["", "[ab]", "[!a]"])
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 9)))
        assert (re.fullmatch(_whole(_glob_tokens(pat)), text, re.S) is not None) == \
            fnmatch.fnmatchcase(text, pat), (pat, text)


def test_prefix_and_suffix_removal_is_bashs_on_a_megabyte():
    # ${X#…} ${X##…} ${X%…} ${X%%…} in one match each (each end used to be tried in turn: a
    # 20,000-character value took 0.2 s, a megabyte minutes)
    from slurm_plugin.launch.shell import _glob_tokens, _strip_prefix, _strip_suffix
    a = "a" * 1_000_000
    assert _strip_prefix(a, _glob_tokens("*b"), True) == a and _strip_suffix(a, _glob_tokens("b*"), True) == a
    assert _strip_prefix(a + "b", _glob_tokens("*a*a"), False) == a[2:] + "b"
    assert _strip_suffix("x/y/z.sh", _glob_tokens("/*"), False) == "x/y"
    assert _strip_suffix("x/y/z.sh", _glob_tokens("/*"), True) == "x"
    assert _strip_prefix("x/y/z.sh", _glob_tokens("*/"), True) == "z.sh"


def test_prefix_and_suffix_removal_matches_fnmatch_end_by_end():
    import fnmatch
    import random

    from slurm_plugin.launch.shell import _glob_tokens, _strip_prefix, _strip_suffix

    def by_ends(text, pat, longest, suffix):
        cuts = range(len(text) + 1)
        for c in (reversed(cuts) if longest != suffix else cuts):
            if fnmatch.fnmatchcase(text[c:] if suffix else text[:c], pat):
                return text[:c] if suffix else text[c:]
        return text
    rng = random.Random(3)
    for _ in range(5000):
        pat = "".join(rng.choice("ab?*") for _ in range(rng.randint(0, 6))) + rng.choice(["", "[ab]", "[!a]", "c"])
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 9)))
        for longest in (False, True):
            t = _glob_tokens(pat)
            assert _strip_prefix(text, t, longest) == by_ends(text, pat, longest, False), (pat, text, longest)
            assert _strip_suffix(text, t, longest) == by_ends(text, pat, longest, True), (pat, text, longest)


def test_a_torchtitan_name_dotted_past_the_depth_limit_is_refused_at_its_line(tmp_path):
    from .test_torchtitan import HEAD, LAUNCH as TT, TOML
    deep = "[" + ".".join(["a"] * 20000) + "]\nx = 1\n"
    res = parse_in(tmp_path, HEAD + TT + "\n", {"cfg.toml": TOML + deep})
    assert res.job is None and "nested more than 64 levels deep" in res.error, res.error
    assert res.error.endswith(f"cfg.toml:{TOML.count(chr(10)) + 1})"), res.error
    # a dotted section name of real depth, and dots in values, pass
    res = parse_in(tmp_path, HEAD + TT + "\n", {"cfg.toml": TOML + "[a.b.c]\nurl = '" + "x." * 100 + "'\n"})
    assert res.job is not None, res.error


def test_a_command_of_many_words_reads_the_clock():
    # (the clock was read every 64th command only: 20 × `echo $X` of 130,000 words took 6 s past
    # an 80 ms deadline) an already-spent deadline stops at the first command of over 256 words
    words = " ".join(["w"] * 300)
    script = f'#!/bin/bash\nX="{words}"\necho $X\n' + LAUNCH
    res = parse_script("job.sh", script, deadline_s=0.0)
    assert res.job is None and res.error == "cannot predict: the script took too long to evaluate (job.sh:3)", res.error
    res = parse_script("job.sh", script.replace("echo $X", "echo ${X:0:20}"), deadline_s=0.0)
    assert res.error is None or "took too long" not in res.error, res.error


def test_an_ansi_c_quoted_word_is_decoded_in_runs_and_bounded():
    # $'...' decodes as bash does: escapes, \xHH, runs of plain text, a quote escaped inside
    res = _answer("#!/bin/bash\nL=$'\\x32'$'4'\nN=$'a\\'b\\tc\\q'\n[[ $N == \"a'b\tc\\\\q\" ]] || L=3\n"
                  + LAUNCH.replace("--num-layers 2", "--num-layers $L"))
    assert res.job is not None and res.job.model.layers == 24, res.error
    # a word longer than any word may be is said so at its line, before any decoding (2 MB of
    # escapes decoded char by char had run past the deadline)
    res = parse_script("job.sh", "#!/bin/bash\nX=$'" + "\\x41" * 500_000 + "'\n" + LAUNCH)
    assert res.job is None and res.error == "cannot predict: word too long (job.sh:2)", res.error
    # the decoding reads the clock: an already-spent deadline stops it
    res = parse_script("job.sh", "#!/bin/bash\nX=$'" + "\\t" * 300 + "'\n" + LAUNCH, deadline_s=0.0)
    assert res.job is None and "took too long" in res.error, res.error
    res = parse_script("job.sh", "#!/bin/bash\nX=$'" + "\\t" * 100 + "'\n" + LAUNCH, deadline_s=0.0)
    assert res.error is None or "took too long" not in res.error, res.error
