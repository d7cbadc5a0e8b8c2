"""Batch scripts + launch configs -> TrainingJob, without executing anything.

    from slurm_plugin.launch import parse_script, SlurmRequest
    parsed = parse_script("run.sbatch", request=SlurmRequest(nodes=4), default_gpus_per_node=4)
    parsed.job          # predictor.TrainingJob, or None with parsed.error = "cannot predict: … (file:line)"
    parsed.provenance   # "model.layers" -> "configs/20B.yml:19", "request.nodes" -> "run.sbatch:3"

Modules: sbatch (directives), shell_parse/shell/arith (the safe evaluator), launchers (wrappers and
launchers), configs (bounded YAML/JSON), neox / deepspeed / megatron (framework keys), derive
(world size, batch, iterations, vocabulary), parse (the orchestration).
"""
from .parse import parse_script
from .result import ParsedScript, SlurmRequest

__all__ = ["parse_script", "ParsedScript", "SlurmRequest"]
