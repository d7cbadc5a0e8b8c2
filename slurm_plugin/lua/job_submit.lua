--[[
perfcast job_submit.lua (Slurm job_submit/lua, Lua 5.1, needs Debian's lua-socket).

slurmctld runs this while holding its locks, so it does as little as possible: it forwards the job
to perf-predictd over a Unix socket, waits at most `timeout_ms`, and applies the answer (time limit,
AdminComment record, one line to the user).  It never parses the script and never computes
anything from the prediction.  Everything that can go wrong -- lua-socket missing, the daemon down,
slow or answering nonsense -- lets the job through unchanged with one line saying why.  This
script never rejects a job: it always returns slurm.SUCCESS.

Wire format (see slurm_plugin/daemon/protocol.py): request = one line of JSON starting with
{"format":"lines", ... }; answer = key=value lines (status, time_limit, time_min, admin_comment,
message, reason), so no JSON parser is needed here.

Settings: an optional Lua file `perfcast_settings.lua` beside this script (i.e. beside slurm.conf)
returning a table, e.g.  return { socket = "/run/perfcast/predictd.sock", timeout_ms = 300 }
It is read when slurmctld (re)loads this script: after editing it, `touch job_submit.lua`.
--]]

local settings = {
    socket = "/run/perfcast/predictd.sock",
    timeout_ms = 300,                -- the whole round trip; the daemon answers by 250 ms itself
    max_script_bytes = 4194304,      -- larger scripts are not sent (the daemon would refuse them)
    quiet_failures = false,          -- true: say nothing to users when perfcast fails (still logged)
    timing = false,                  -- true: log where each call's time went (benchmarks/bench_sbatch.py)
}

do  -- overrides from perfcast_settings.lua next to this file
    local src = debug.getinfo(1, "S").source or ""
    local dir = src:match("^@(.*)/[^/]*$")
    if dir then
        local chunk = loadfile(dir .. "/perfcast_settings.lua")
        if chunk then
            local ok, t = pcall(chunk)
            if ok and type(t) == "table" then
                for k, v in pairs(t) do settings[k] = v end
            else
                slurm.log_error("perfcast: ignoring %s/perfcast_settings.lua: %s", dir, tostring(t))
            end
        end
    end
end

local have_socket, unix = pcall(require, "socket.unix")
local have_core, socket_core = pcall(require, "socket")
if not have_socket then
    slurm.log_error("perfcast: lua-socket (socket.unix) not available: %s", tostring(unix))
end

-- JSON string escaping by table lookup: one C-level gsub even for a 4 MiB script.
local ESC = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
for i = 0, 31 do
    local c = string.char(i)
    if not ESC[c] then ESC[c] = string.format("\\u%04x", i) end
end
ESC[string.char(127)] = "\\u007f"

local function jstr(s)
    return '"' .. (string.gsub(s, '[%c"\\]', ESC)) .. '"'
end

local function jval(v)
    local t = type(v)
    if t == "string" then return jstr(v) end
    if t == "number" then return string.format("%.0f", v) end
    if t == "boolean" then return tostring(v) end
    return "null"
end

local function request_json(job_desc, part_list, submit_uid)
    local out = { '{"format":"lines"' }
    local function add(key, value)
        if value ~= nil then out[#out + 1] = ',"' .. key .. '":' .. jval(value) end
    end
    add("script", job_desc.script)
    add("work_dir", job_desc.work_dir)
    -- The job's owner (slurmctld has checked it equals the authenticated uid unless root used
    -- --uid): files named by the script are read with this user's rights.
    local uid = job_desc.user_id
    if type(uid) ~= "number" or uid == slurm.NO_VAL then uid = submit_uid end
    add("submit_uid", uid)
    add("submit_gid", job_desc.group_id)
    add("partition", job_desc.partition)
    add("min_nodes", job_desc.min_nodes)
    add("max_nodes", job_desc.max_nodes)
    add("num_tasks", job_desc.num_tasks)
    add("ntasks_per_node", job_desc.ntasks_per_node)
    add("cpus_per_task", job_desc.cpus_per_task)
    add("tres_per_node", job_desc.tres_per_node)
    add("tres_per_job", job_desc.tres_per_job)
    add("tres_per_task", job_desc.tres_per_task)
    add("time_limit", job_desc.time_limit)
    add("time_min", job_desc.time_min)   -- the user's --time-min: a filled limit stays at or above it
    add("name", job_desc.name)
    add("std_out", job_desc.std_out)   -- where the job's log goes: perf-calibrate harvest reads it
    -- --error apart: a log written through Python's logging is there, and sacct (22.05) never says
    add("std_err", job_desc.std_err)
    add("array", job_desc.array_inx)
    -- The job's QOS and account decide the QOS / association MaxWall that caps the limit the
    -- daemon fills.  Without --qos / --account, slurmctld's own defaults for this user (its
    -- association manager's, in memory): job_desc.default_qos / default_account.
    add("qos", job_desc.qos)
    add("account", job_desc.account)
    if job_desc.qos == nil then add("default_qos", job_desc.default_qos) end
    if job_desc.account == nil then add("default_account", job_desc.default_account) end
    -- sbatch's argv: [0] is the script path, then the script's arguments.
    local argv, argc = job_desc.argv, job_desc.argc
    if type(argv) == "table" and type(argc) == "number" then
        local items = {}
        for i = 0, argc - 1 do
            if type(argv[i]) == "string" then items[#items + 1] = jstr(argv[i]) end
        end
        out[#out + 1] = ',"argv":[' .. table.concat(items, ",") .. ']'
    end
    -- MaxTime of every partition the job may use, which is the default, and each one's own QOS
    -- (slurm.conf QOS=, whose MaxWall applies too): the daemon decides.
    if type(part_list) == "table" then
        local parts = {}
        for _, p in pairs(part_list) do
            if type(p.name) == "string" then
                local qos = p.qos
                parts[#parts + 1] = jstr(p.name) .. ':{"max_time":' .. jval(p.max_time)
                    .. ',"default":' .. jval(p.flag_default == 1)
                    .. (type(qos) == "string" and qos ~= "" and (',"qos":' .. jstr(qos)) or "") .. '}'
            end
        end
        out[#out + 1] = ',"partitions":{' .. table.concat(parts, ",") .. '}'
    end
    out[#out + 1] = "}\n"
    return table.concat(out)
end

local clock = have_core and socket_core.gettime or os.time
local marks = {}   -- settings.timing: {name, seconds} of the phases of the current call

local function mark(name)
    if settings.timing then marks[#marks + 1] = { name, clock() } end
end

-- One round trip; returns the raw answer or nil, why.
local function ask(payload)
    if not have_socket then return nil, "lua-socket is not installed on the controller" end
    local now = clock
    local deadline = now() + settings.timeout_ms / 1000
    local c, err = (unix.stream or unix)()
    if not c then return nil, "cannot create a socket: " .. tostring(err) end
    local function left()
        local t = deadline - now()
        if t < 0.001 then t = 0.001 end
        return t
    end
    c:settimeout(left())
    local ok, cerr = c:connect(settings.socket)
    if not ok then
        c:close()
        return nil, "prediction daemon not reachable (" .. tostring(cerr) .. ")"
    end
    mark("connect")
    local sent = 0
    while sent < #payload do
        c:settimeout(left())
        local n, serr, partial = c:send(payload, sent + 1)
        if not n then
            c:close()
            if serr == "timeout" then return nil, "prediction daemon too slow" end
            return nil, "prediction daemon closed the connection (" .. tostring(serr) .. ")"
        end
        sent = n
    end
    mark("send")
    local parts = {}
    while true do
        c:settimeout(left())
        local chunk, rerr, partial = c:receive(65536)
        if chunk then
            parts[#parts + 1] = chunk
        else
            if partial and #partial > 0 then parts[#parts + 1] = partial end
            if rerr == "closed" then break end
            c:close()
            if rerr == "timeout" then
                return nil, "prediction daemon did not answer within " .. settings.timeout_ms .. " ms"
            end
            return nil, "prediction daemon error (" .. tostring(rerr) .. ")"
        end
    end
    c:close()
    mark("answer")
    return table.concat(parts)
end

local function say(msg)
    slurm.log_info("perfcast: %s", msg)
    if not settings.quiet_failures then
        slurm.log_user("perfcast: no time limit suggested (%s); job submitted unchanged", msg)
    end
end

local function submit(job_desc, part_list, submit_uid)
    local script = job_desc.script
    if type(script) ~= "string" or script == "" then
        return  -- srun/salloc: no batch script, nothing to predict, nothing to say
    end
    if #script > settings.max_script_bytes then
        return say("script too large to predict")
    end
    marks = {}
    mark("start")
    local payload = request_json(job_desc, part_list, submit_uid)
    mark("encode")
    local raw, why = ask(payload)
    if not raw then return say(why) end
    local a = {}
    for k, v in string.gmatch(raw, "([%w_]+)=([^\n]*)") do a[k] = v end
    if a.status == nil then return say("unreadable answer from the prediction daemon") end
    if a.status == "ok" then
        local limit = tonumber(a.time_limit)
        if a.time_limit ~= nil and (limit == nil or limit < 1 or limit ~= math.floor(limit)) then
            return say("unusable time limit from the prediction daemon")
        end
        if limit then job_desc.time_limit = limit end
        -- --time-min: backfill may start the job with a limit as low as this (never above it).
        local tmin = tonumber(a.time_min)
        if limit and tmin and tmin >= 1 and tmin == math.floor(tmin) and tmin <= limit then
            job_desc.time_min = tmin
        end
        if a.admin_comment and a.admin_comment ~= "" then
            local old = job_desc.admin_comment
            if type(old) == "string" and old ~= "" then
                job_desc.admin_comment = old .. " " .. a.admin_comment
            else
                job_desc.admin_comment = a.admin_comment
            end
        end
    end
    -- ok: the prediction; skip/error/refused: the daemon's one line of why (or nothing) --
    -- e.g. reason=busy when a burst of submissions is more than it can predict in time: it says
    -- so at once rather than make slurmctld wait for the timeout.
    if a.message and a.message ~= "" then
        if a.status ~= "ok" and settings.quiet_failures then
            slurm.log_info("%s", a.message)
        else
            slurm.log_user("%s", a.message)
        end
    end
    mark("apply")
    slurm.log_info("perfcast: job from uid %s: status=%s reason=%s limit=%s",
                   tostring(submit_uid), tostring(a.status), tostring(a.reason), tostring(a.time_limit))
    if settings.timing and #marks > 1 then
        local out = {}
        for i = 2, #marks do
            out[#out + 1] = string.format("%s=%.3f", marks[i][1], (marks[i][2] - marks[i - 1][2]) * 1e3)
        end
        slurm.log_info("perfcast: timing_ms %s total=%.3f", table.concat(out, " "),
                       (marks[#marks][2] - marks[1][2]) * 1e3)
    end
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    -- Fail open on anything, including bugs in this file: an error here must not reject the job.
    local ok, err = pcall(submit, job_desc, part_list, submit_uid)
    if not ok then
        slurm.log_error("perfcast: job_submit.lua error: %s", tostring(err))
        pcall(slurm.log_user, "perfcast: no time limit suggested (internal error); job submitted unchanged")
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

slurm.log_info("perfcast: job_submit.lua loaded (socket %s, timeout %s ms, lua-socket %s)",
               tostring(settings.socket), tostring(settings.timeout_ms), tostring(have_socket))
return slurm.SUCCESS
