"""The daemon's redaction keeps perfcast's own words and the user's misspelt key, and still removes
what a file says."""
from slurm_plugin.daemon import engine


def test_misspelt_key_and_own_words_kept_file_values_removed():
    files = ["# you should tune this, GPT-NeoX docs say so\ntrain_micro_batch_sise_per_gpu: 4\n"
             "wandb_project: hunter22\nnum_layers: zz-top-secret\n"]
    msg = ("'train_micro_batch_sise_per_gpu' is not a GPT-NeoX key; did you mean "
           "'train_micro_batch_size_per_gpu'? (without it the job would be a different one) (/h/u/n.yml:2)")
    assert engine.redact(msg, files, "python deepy.py train.py /h/u/n.yml") == msg
    out = engine.redact("num_layers is 'zz-top-secret'; wandb_project hunter22 (you)", files, "")
    assert "zz-top-secret" not in out and "hunter22" not in out
    assert out.count(engine.REDACTED) == 2 and "(you)" in out


def test_a_value_far_from_the_suggestion_is_still_removed():
    files = ["password_of_bob: 1\n"]
    msg = "'password_of_bob' is not a GPT-NeoX key; did you mean 'pos_emb'?"
    assert "password_of_bob" not in engine.redact(msg, files, "")
