"""QA (admin), findings 2, 3 and 8: perfcast.toml mistakes that passed silently, or without a hint.

2. ``[daemon] log_level`` must be one of debug, info, warning, error (a typo used to run at info,
   silently, and ``--check`` passed it).
3. ``[daemon] slurm_user`` naming no local user fails ``perf-predictd --check`` (rc 2): slurmctld
   connects as the SlurmUser, whom the daemon would not serve, so every job would go through
   unchanged.  A start or reload logs it at ERROR (``slurm_user_unknown``).
8. An unknown section or key gets a did-you-mean.
"""
from __future__ import annotations

import logging
import pwd
import textwrap

import pytest

from slurm_plugin import siteconfig
from slurm_plugin.daemon import cli, server
from slurm_plugin.siteconfig import SiteConfigError, load_site_config, parse_site_config, slurm_user_problem

USERS = ("root", "daemon", "slurm", "munge", "alice")


@pytest.fixture
def users(monkeypatch):
    """This host's users, as pwd sees them (the test machine's own may lack a ``slurm``)."""
    def getpwnam(name):
        if name not in USERS:
            raise KeyError(f"getpwnam(): name not found: {name!r}")
        return pwd.struct_passwd((name, "x", 1000 + USERS.index(name), 1000, "", "/", "/bin/sh"))
    monkeypatch.setattr(siteconfig.pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(siteconfig.pwd, "getpwall", lambda: [getpwnam(n) for n in USERS])


def _refused(data) -> str:
    return str(pytest.raises(SiteConfigError, parse_site_config, data, "/etc/perfcast/perfcast.toml").value)


# --- 2: log_level ------------------------------------------------------------------------------------

@pytest.mark.parametrize("level, hint", [("verbose", ""), ("debgu", " (did you mean 'debug'?)"),
                                         ("warn", " (did you mean 'warning'?)"), ("critical", "")])
def test_a_log_level_that_is_none_is_refused(level, hint):
    assert _refused({"daemon": {"log_level": level}}) == (
        f"/etc/perfcast/perfcast.toml: daemon.log_level: {level!r} is not one of debug, info, warning, "
        f"error{hint}")


def test_log_levels_are_read_in_any_case():
    assert parse_site_config({"daemon": {"log_level": "WARNING"}}).daemon.log_level == "warning"
    assert parse_site_config({}).daemon.log_level == "info"


def _check(tmp_path, capsys, monkeypatch, text: str) -> tuple[int, str]:
    """``perf-predictd --config FILE --check`` (in this process: the config is refused before any
    platform loads)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    path = tmp_path / "perfcast.toml"
    path.write_text(textwrap.dedent(text))
    rc = cli.main(["--config", str(path), "--check"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_check_fails_a_log_level_typo(tmp_path, capsys, monkeypatch, users):
    rc, said = _check(tmp_path, capsys, monkeypatch, '[daemon]\nlog_level = "debgu"\n')
    assert rc == 2
    assert said.strip() == (f"perf-predictd: {tmp_path}/perfcast.toml:2: daemon.log_level: 'debgu' is not one "
                            "of debug, info, warning, error (did you mean 'debug'?)")


def test_the_log_level_option_takes_only_levels(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--log-level", "verbose", "--check"])
    assert e.value.code == 2 and "invalid choice: 'verbose'" in capsys.readouterr().err


# --- 3: slurm_user -------------------------------------------------------------------------------------

def test_check_fails_an_unknown_slurm_user(tmp_path, capsys, monkeypatch, users):
    rc, said = _check(tmp_path, capsys, monkeypatch, '[daemon]\nslurm_user = "slurmm"\n')
    assert rc == 2
    assert said.strip() == (f"perf-predictd: {tmp_path}/perfcast.toml: daemon.slurm_user: no such user "
                            "'slurmm' (did you mean 'slurm'?); slurmctld connects as slurm.conf's SlurmUser, "
                            "which the daemon would not serve")


def test_the_default_slurm_user_missing_is_said_not_failed(tmp_path, capsys, monkeypatch, users):
    """A host without a "slurm" user whose config leaves slurm_user at its default (a SlurmUser of
    root needs none): --check warns and goes on to the platforms."""
    monkeypatch.setattr(siteconfig.pwd, "getpwall", lambda: [])

    def getpwnam(name):
        raise KeyError(name)
    monkeypatch.setattr(siteconfig.pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(cli, "setup_logging", lambda *a, **k: None)   # (the tests' log capture stays)
    rc, said = _check(tmp_path, capsys, monkeypatch, '[partitions.gpu]\nplatform = "dgx-h100"\n')
    assert rc != 2 and "platform dgx-h100: ok" in said, said
    assert "warning: " in said and "daemon.slurm_user: no such user 'slurm' (the default)" in said


def test_known_and_numeric_slurm_users_pass(users):
    for user in ("slurm", "alice", "64030"):
        assert slurm_user_problem(parse_site_config({"daemon": {"slurm_user": user}}).daemon) == ""
    far = parse_site_config({"daemon": {"slurm_user": "xyzzy"}}).daemon
    assert slurm_user_problem(far) == "daemon.slurm_user: no such user 'xyzzy'"


def test_a_start_or_reload_logs_an_unknown_slurm_user_as_an_error(users, caplog):
    settings = parse_site_config({"daemon": {"slurm_user": "slurmm"}}).daemon
    with caplog.at_level(logging.INFO, logger="perfcast"):
        uids = server.trusted_uids(settings)
    assert 1002 not in uids
    (rec,) = [r for r in caplog.records if "event=slurm_user_unknown" in r.getMessage()]
    assert rec.levelno == logging.ERROR
    assert "error=\"daemon.slurm_user: no such user 'slurmm' (did you mean 'slurm'?)\"" in rec.getMessage()


# --- 8: unknown sections and keys ------------------------------------------------------------------------

@pytest.mark.parametrize("section, said", [
    ("wacth", "unknown section [wacth] (did you mean [watch]?)"),
    ("partition", "unknown section [partition] (did you mean [partitions]?)"),
    ("harvst", "unknown section [harvst]: perfcast.toml has no [harvest]; the harvest reads its store from "
               "[daemon] records and takes the rest on its command line (perf-calibrate harvest --help)"),
    ("extra", "unknown section [extra] (perfcast.toml has [daemon], [defaults], [partitions.NAME] and [watch])"),
])
def test_an_unknown_section_gets_a_hint(section, said):
    assert _refused({section: {}}) == f"/etc/perfcast/perfcast.toml: {said}"


@pytest.mark.parametrize("data, said", [
    ({"daemon": {"sokcet": "/x"}}, "daemon.sokcet: unknown key (did you mean 'socket'?)"),
    ({"defaults": {"margn": 0.1}}, "defaults.margn: unknown key (did you mean 'margin'?)"),
    ({"partitions": {"gpu": {"platfrom": "x"}}}, "partitions.gpu.platfrom: unknown key (did you mean 'platform'?)"),
    ({"partitions": {"gpu": {"platform": "x", "name": "g"}}}, "partitions.gpu.name: unknown key"),
    ({"watch": {"enabeld": True}}, "watch.enabeld: unknown key (did you mean 'enabled'?)"),
    ({"daemon": {"zzz": 1}}, "daemon.zzz: unknown key"),
])
def test_an_unknown_key_gets_a_did_you_mean(data, said):
    assert _refused(data) == f"/etc/perfcast/perfcast.toml: {said}"


def test_sections_are_checked_before_their_keys(tmp_path):
    path = tmp_path / "perfcast.toml"
    path.write_text('[daemon]\nlog_level = "verbose"\n[harvst]\nsince = "7d"\n')
    with pytest.raises(SiteConfigError, match=r"unknown section \[harvst\]"):
        load_site_config(str(path))


@pytest.mark.parametrize("text,where", [
    ('[daemon]\nsocket = "/run/p.sock"\nworkrs = 3\n', ":3: daemon.workrs: unknown key"),
    ('[daemon]\nsocket = "/run/p.sock"\n\n[partitions.gpu]\nplatform = "dgx-a100"\nmargin = "x"\n',
     ":6: partitions.gpu.margin: must be a number"),
    ('[daemon]\nsocket = "/run/p.sock"\n\n[partitons.gpu]\nplatform = "x"\n', ":4: unknown section [partitons]"),
    ('# site config\n[partitions."gpu"]\npolicy = "fill"\n', ":2: partitions.gpu.platform: required"),
    ('daemon.workrs = 3\n', ":1: daemon.workrs: unknown key"),
])
def test_errors_name_the_line_of_the_key(tmp_path, text, where):
    # tomllib gives no positions; the admin is pointed at the line all the same (or at the
    # header of the table that lacks a required key).
    path, said = _refusal(tmp_path, text)
    assert said.startswith(f"{path}{where}")


def test_a_key_in_an_inline_table_is_found_on_its_line(tmp_path):
    path, said = _refusal(tmp_path, '[partitions]\ngpu = { platform = "dgx-a100", margin = "x" }\n')
    assert said.startswith(f"{path}:2: partitions.gpu.margin: must be a number")


def _refusal(tmp_path, text: str) -> "tuple[object, str]":
    """(the config's path, the one line load_site_config refuses it with)."""
    path = tmp_path / "perfcast.toml"
    path.write_text(text)
    with pytest.raises(siteconfig.SiteConfigError) as e:
        siteconfig.load_site_config(str(path))
    return path, str(e.value)


def test_a_message_that_names_no_key_keeps_its_form():
    text = '[daemon]\nsocket = "/run/p.sock"\n'
    assert siteconfig._with_line("/x.toml: [watch] must be a table", "/x.toml", text) == \
        "/x.toml: [watch] must be a table"
    assert siteconfig._with_line("/x.toml: daemon.nothere: required", "/x.toml", text) == \
        "/x.toml:1: daemon.nothere: required"
    assert siteconfig._with_line("/x.toml: other.key: bad", "/x.toml", text) == "/x.toml: other.key: bad"
