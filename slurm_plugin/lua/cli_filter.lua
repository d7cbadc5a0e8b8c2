--[[
perfcast cli_filter.lua (Slurm cli_filter/lua, Lua 5.1, needs lua-socket on the login node).

The alternative to job_submit.lua for sites whose controller cannot see users' files (home and
project file systems not mounted on the slurmctld host).  It runs inside sbatch on the login
node, as the user: it reads the batch script (options.argv[1]) itself, sends it to a
perf-predictd running on the same login node (its `user_socket`, which serves every local user as
themselves: the daemon takes the uid from the kernel, not from the request), and sets --time from
the answer when the user gave none.  Like job_submit.lua it never parses or computes, and fails
open: any problem leaves the options unchanged with one line on stderr.

Trade-offs against job_submit.lua (see packaging/INSTALL.md):
  + files are read where they live, with the user's own rights, no root involved;
  + nothing runs inside slurmctld, so a slow prediction cannot stall the controller;
  - advisory only: users can bypass it (another SLURM_CONF, the REST API, `sbatch < script`,
    --wrap), so it cannot enforce a policy;
  - it cannot write the AdminComment record (users may not set it); enable job_submit.lua as well
    if you want the record (it will then see --time as given and only warn);
  - one perf-predictd per login node (platforms loaded on each).

Settings: optional `perfcast_settings.lua` beside this script returning a table, e.g.
    return { socket = "/run/perfcast/predictd-user.sock", timeout_ms = 1000 }
--]]

local settings = {
    socket = "/run/perfcast/predictd-user.sock",
    timeout_ms = 1000,           -- a person waits for sbatch, not the controller: more slack
    max_script_bytes = 4194304,
    quiet_failures = false,
    -- true: only warm the daemon up for job_submit.lua (packaging/INSTALL.md §5): the prediction
    -- of this submission is computed while sbatch talks to slurmctld, so that job_submit.lua's
    -- request finds it ready.  Sets nothing, says nothing, waits for no answer.
    prewarm = false,
}

do
    local src = debug.getinfo(1, "S").source or ""
    local dir = src:match("^@(.*)/[^/]*$")
    if dir then
        local chunk = loadfile(dir .. "/perfcast_settings.lua")
        if chunk then
            local ok, t = pcall(chunk)
            if ok and type(t) == "table" then
                for k, v in pairs(t) do settings[k] = v end
            end
        end
    end
end

local have_socket, unix = pcall(require, "socket.unix")

local ESC = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
for i = 0, 31 do
    local c = string.char(i)
    if not ESC[c] then ESC[c] = string.format("\\u%04x", i) end
end
ESC[string.char(127)] = "\\u007f"

local function jstr(s)
    return '"' .. (string.gsub(tostring(s), '[%c"\\]', ESC)) .. '"'
end

local function tell(msg)
    io.stderr:write("sbatch: perfcast: " .. msg .. "\n")
end

local function fail(msg)
    if not settings.quiet_failures then
        tell("no time limit suggested (" .. msg .. "); job submitted unchanged")
    end
end

-- Write all of payload to c, each write within timeout() seconds; true, or nil and why.
local function send_all(c, payload, timeout)
    local sent = 0
    while sent < #payload do
        c:settimeout(timeout())
        local n, err = c:send(payload, sent + 1)
        if not n then return nil, err end
        sent = n
    end
    return true
end

local function ask(payload)
    if not have_socket then return nil, "lua-socket is not installed on this node" end
    -- (required here, not at load: the warm-up, run in every sbatch, needs no clock)
    local have_core, socket_core = pcall(require, "socket")
    local now = have_core and socket_core.gettime or os.time
    local deadline = now() + settings.timeout_ms / 1000
    local function left()
        local t = deadline - now()
        if t < 0.001 then t = 0.001 end
        return t
    end
    local c = (unix.stream or unix)()
    c:settimeout(left())
    local ok, err = c:connect(settings.socket)
    if not ok then c:close(); return nil, "prediction daemon not reachable (" .. tostring(err) .. ")" end
    local sent, serr = send_all(c, payload, left)
    if not sent then c:close(); return nil, "prediction daemon error (" .. tostring(serr) .. ")" end
    c:settimeout(left())
    local data, rerr, partial = c:receive("*a")
    c:close()
    if not data then
        if rerr == "timeout" then
            return nil, "prediction daemon did not answer within " .. settings.timeout_ms .. " ms"
        end
        return nil, "prediction daemon error (" .. tostring(rerr) .. ")"
    end
    return data
end

-- Hand the request over and go: the daemon computes while sbatch goes on (prewarm).
local function send_only(payload)
    if not have_socket then return end
    local timeout = settings.timeout_ms / 1000
    local c = (unix.stream or unix)()
    c:settimeout(timeout)
    if c:connect(settings.socket) then
        send_all(c, payload, function() return timeout end)
    end
    c:close()
end

local function pre_submit(options, offset)
    local argv = options["argv"]
    local path = type(argv) == "table" and argv[1] or nil
    if type(path) ~= "string" or path == "" then
        return  -- --wrap or `sbatch < file`: no script file to read here; nothing to say
    end
    local f = io.open(path, "rb")
    if not f then return fail("cannot read " .. path) end
    local script = f:read(settings.max_script_bytes + 1) or ""
    f:close()
    if #script > settings.max_script_bytes then return fail("script too large to predict") end

    -- Unset options read as defaults (ntasks "1", a huge time), so the daemon gets Slurm's own
    -- dump of what was really set (null = unset) and picks what it needs: no parsing here.
    local out = { '{"format":"lines","script":', jstr(script),
                  ',"cli_options":', slurm.json_cli_options(options),
                  ',"submit_uid":-1' }   -- ignored: the daemon uses the kernel's word
    if settings.prewarm then
        -- No work_dir: the daemon takes sbatch's own (/proc/PID/cwd, symlinks resolved, as
        -- sbatch's getcwd() gives it to job_submit.lua); --chdir still wins.
        -- What job_submit.lua will send for this job: sbatch names an unnamed job after its script.
        if options["job-name"] == nil then
            out[#out + 1] = ',"name":' .. jstr(path:match("([^/]*)$"))
        end
        out[#out + 1] = ',"warm":true}\n'
        return send_only(table.concat(out))
    end
    out[#out + 1] = ',"work_dir":' .. jstr(os.getenv("PWD") or "/") .. '}\n'
    local raw, why = ask(table.concat(out))
    if not raw then return fail(why) end
    local a = {}
    for k, v in string.gmatch(raw, "([%w_]+)=([^\n]*)") do a[k] = v end
    if a.status == nil then return fail("unreadable answer from the prediction daemon") end
    if a.status == "ok" and a.time_limit then   -- only sent when the user gave no --time
        local limit = tonumber(a.time_limit)
        if limit and limit >= 1 and limit == math.floor(limit) then
            options["time"] = a.time_limit
            local tmin = tonumber(a.time_min)
            if tmin and tmin >= 1 and tmin == math.floor(tmin) and tmin <= limit then
                options["time-min"] = a.time_min
            end
        end
    end
    if a.message and a.message ~= "" and (a.status == "ok" or not settings.quiet_failures) then
        io.stderr:write("sbatch: " .. a.message .. "\n")
    end
end

function slurm_cli_setup_defaults(options, early_pass)
    return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, offset)
    local ok, err = pcall(pre_submit, options, offset)
    if not ok then
        pcall(fail, "internal error: " .. tostring(err))
    end
    return slurm.SUCCESS   -- never reject a job because of perfcast
end

function slurm_cli_post_submit(offset, jobid, stepid)
    return slurm.SUCCESS
end
