from slurm_plugin.launch.files import default_read_file
from slurm_plugin.launch.limits import Budget
from slurm_plugin.launch.shell import Shell
from slurm_plugin.launch.values import Unknowns


def run_shell(text: str, env=None, cwd="/work", read_file=default_read_file) -> Shell:
    warnings: list = []
    sh = Shell(budget=Budget(seconds=5.0), unknowns=Unknowns(), read_file=read_file,
               env={k: (v, "env") for k, v in (env or {}).items()}, cwd=cwd, warnings=warnings)
    sh.run(text, "t.sh", positional=[])
    return sh


def array(sh: Shell, name: str) -> list:
    v = sh.vars[name]
    keys = sorted(v.array, key=int)
    return ["".join(s[0] for s in v.array[k]) for k in keys]


def parse_in(tmp_path, script: str, files=None):
    """Write ``files`` ({relative path: text}) and ``script`` (as job.sbatch) into ``tmp_path``
    and parse the script there, with a wall clock so generous that only the counted limits and
    the script itself decide the outcome (no flakiness on a busy machine)."""
    from slurm_plugin.launch import parse_script
    for name, text in (files or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    p = tmp_path / "job.sbatch"
    p.write_text(script)
    return parse_script(str(p), deadline_s=10.0)
