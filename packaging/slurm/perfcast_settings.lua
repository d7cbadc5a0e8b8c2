-- perfcast_settings.lua: beside slurm.conf (and so beside job_submit.lua / cli_filter.lua).
-- Read when slurmctld (or sbatch, for cli_filter.lua) loads the script; after editing it,
-- `touch job_submit.lua` so that slurmctld reloads (it watches the script's mtime).
return {
    -- must match [daemon] socket in /etc/perfcast/perfcast.toml
    -- (on login nodes with cli_filter.lua: [daemon] user_socket)
    socket = "/run/perfcast/predictd.sock",
    -- the whole round trip; perf-predictd answers by its own deadline_ms (250) first
    timeout_ms = 300,
    -- true: do not tell users when perfcast could not predict (still in slurmctld.log)
    quiet_failures = false,
}
