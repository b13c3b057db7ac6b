-- nopfs's job_submit.lua (Slurm's job_submit/lua plugin, run by slurmctld at every submission):
-- a job submitted with --nopfs=DATASET prefers the nodes that hold its user's kept copy of the
-- dataset (docs/admin.md, "Placement"). Each such node carries the copy's mark, a node feature
-- that root on the node sets while the copy is there (nopfs-job placement); this script computes
-- the same name from the job's uid, its dataset and the site's placement key, and adds it to the
-- job's --prefer (Slurm 22.05's soft constraint: the job runs elsewhere when no node carrying it
-- is free). With --nopfs-placement=require it adds it to the job's --constraint instead (the job
-- waits for such a node), with --nopfs-placement=off nothing. A job that names its nodes
-- (--nodelist) is left alone. A job on a dataset the nodes share (docs/admin.md, "Shared
-- datasets"; listed in nopfs_shared_datasets below) prefers the nodes that carry its user's mark
-- or the dataset's shared mark, the same for every user, which a node carries while its shared
-- copy holds at least half of the dataset's quota: "mark|shared" (each node of the job carries
-- one or the other).
--
-- Install (docs/admin.md): copy to slurm.conf's directory as job_submit.lua (or call
-- nopfs_where(job_desc) and nopfs_job_submit(job_desc) from the site's own script), set JobSubmitPlugins=lua and
-- SchedulerParameters=ignore_prefer_validation in slurm.conf, and give slurmctld's host the
-- nodes' placement key (readable by SlurmUser) at the path below.
--
-- Runs in Slurm 22.05's Lua 5.1 (no bit operators): HMAC-SHA256 is computed with arithmetic on
-- 32-bit words held in Lua numbers, nibble by nibble through two 16x16 tables.

nopfs_placement_key_file = nopfs_placement_key_file or "/etc/nopfs/placement.key"
-- The datasets the nodes' configs declare shared (their `shared` paths, as jobs name them with
-- --nopfs=), e.g. { "/pfs/datasets/imagenet", "/pfs/datasets/coco" }.
nopfs_shared_datasets = nopfs_shared_datasets or {}

local TWO32 = 4294967296

-- bxor and band of two nibbles, as tables indexed [a * 16 + b].
local XOR4, AND4 = {}, {}
for a = 0, 15 do
  for b = 0, 15 do
    local x, y, bit = 0, 0, 1
    local i, j = a, b
    for _ = 1, 4 do
      local p, q = i % 2, j % 2
      if p ~= q then x = x + bit end
      if p == 1 and q == 1 then y = y + bit end
      i, j, bit = (i - p) / 2, (j - q) / 2, bit * 2
    end
    XOR4[a * 16 + b] = x
    AND4[a * 16 + b] = y
  end
end

local function op32(t, a, b)
  local r, bit = 0, 1
  for _ = 1, 8 do
    local p, q = a % 16, b % 16
    r = r + t[p * 16 + q] * bit
    a, b, bit = (a - p) / 16, (b - q) / 16, bit * 16
  end
  return r
end
local function bxor(a, b) return op32(XOR4, a, b) end
local function band(a, b) return op32(AND4, a, b) end
local function bnot(a) return TWO32 - 1 - a end
local function shr(a, n)
  local d = 2 ^ n
  return (a - a % d) / d
end
local function rotr(a, n)
  local d = 2 ^ n
  local low = a % d
  return (a - low) / d + low * 2 ^ (32 - n)
end

local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

local function sha256(msg)
  local len = #msg
  msg = msg .. "\128" .. string.rep("\0", (55 - len) % 64)
  local bits = len * 8
  local tail = {}
  for i = 8, 1, -1 do
    local b = bits % 256
    tail[i] = string.char(b)
    bits = (bits - b) / 256
  end
  msg = msg .. table.concat(tail)
  local H = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 }
  local w = {}
  for chunk = 1, #msg, 64 do
    for j = 1, 16 do
      local b1, b2, b3, b4 = msg:byte(chunk + (j - 1) * 4, chunk + (j - 1) * 4 + 3)
      w[j] = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
    end
    for j = 17, 64 do
      local v = w[j - 15]
      local s0 = bxor(bxor(rotr(v, 7), rotr(v, 18)), shr(v, 3))
      v = w[j - 2]
      local s1 = bxor(bxor(rotr(v, 17), rotr(v, 19)), shr(v, 10))
      w[j] = (w[j - 16] + s0 + w[j - 7] + s1) % TWO32
    end
    local a, b, c, d, e, f, g, h = H[1], H[2], H[3], H[4], H[5], H[6], H[7], H[8]
    for j = 1, 64 do
      local S1 = bxor(bxor(rotr(e, 6), rotr(e, 11)), rotr(e, 25))
      local ch = bxor(band(e, f), band(bnot(e), g))
      local t1 = (h + S1 + ch + K[j] + w[j]) % TWO32
      local S0 = bxor(bxor(rotr(a, 2), rotr(a, 13)), rotr(a, 22))
      local maj = bxor(bxor(band(a, b), band(a, c)), band(b, c))
      local t2 = (S0 + maj) % TWO32
      h, g, f, e, d, c, b, a = g, f, e, (d + t1) % TWO32, c, b, a, (t1 + t2) % TWO32
    end
    H[1], H[2], H[3], H[4] = (H[1] + a) % TWO32, (H[2] + b) % TWO32, (H[3] + c) % TWO32,
                             (H[4] + d) % TWO32
    H[5], H[6], H[7], H[8] = (H[5] + e) % TWO32, (H[6] + f) % TWO32, (H[7] + g) % TWO32,
                             (H[8] + h) % TWO32
  end
  local out = {}
  for i = 1, 8 do
    local v = H[i]
    for k = 4, 1, -1 do
      local byte = v % 256
      out[(i - 1) * 4 + k] = string.char(byte)
      v = (v - byte) / 256
    end
  end
  return table.concat(out)
end

local function xor_bytes(s, pad)
  local out = {}
  for i = 1, #s do out[i] = string.char(bxor(s:byte(i), pad)) end
  return table.concat(out)
end

function nopfs_hmac_sha256(key, msg)
  if #key > 64 then key = sha256(key) end
  key = key .. string.rep("\0", 64 - #key)
  return sha256(xor_bytes(key, 0x5c) .. sha256(xor_bytes(key, 0x36) .. msg))
end

-- The dataset path as a mark names it (spank/placement.h MarkPath).
function nopfs_mark_path(dataset)
  local parts = {}
  for part in dataset:gmatch("[^/]+") do
    if part ~= "." then parts[#parts + 1] = part end
  end
  return "/" .. table.concat(parts, "/")
end

-- The mark of a shared dataset's copy, every user's (spank/placement.h SharedMark).
function nopfs_shared_mark(key, dataset)
  local digest = nopfs_hmac_sha256(key, "nopfs placement v1:shared:" .. nopfs_mark_path(dataset))
  local hex = {}
  for i = 1, 8 do hex[i] = string.format("%02x", digest:byte(i)) end
  return "nopfs_" .. table.concat(hex)
end

-- Whether the job's dataset is one the nodes share (as MarkPath names both).
local function is_shared(dataset)
  if type(nopfs_shared_datasets) ~= "table" then return false end
  local path = nopfs_mark_path(dataset)
  for _, d in pairs(nopfs_shared_datasets) do
    if type(d) == "string" and d:sub(1, 1) == "/" and nopfs_mark_path(d) == path then
      return true
    end
  end
  return false
end

-- The mark of `uid`'s copies of `dataset` (spank/placement.h PlacementMark).
function nopfs_placement_mark(key, uid, dataset)
  local digest = nopfs_hmac_sha256(key, "nopfs placement v1:" .. string.format("%d", uid) .. ":" ..
                                        nopfs_mark_path(dataset))
  local hex = {}
  for i = 1, 8 do hex[i] = string.format("%02x", digest:byte(i)) end
  return "nopfs_" .. table.concat(hex)
end

local cached_key, cached_key_time = nil, -1
local marks = {}  -- "uid:dataset" -> mark, while the key stays the same
local function placement_key()
  -- Read again at most once a minute, so that a new key reaches running slurmctld.
  local now = os.time()
  if cached_key and now - cached_key_time < 60 then return cached_key end
  local f = io.open(nopfs_placement_key_file, "rb")
  local key = f and f:read("*a")
  if f then f:close() end
  if not key or #key < 16 then
    cached_key, cached_key_time = nil, now
    return nil
  end
  if key ~= cached_key then marks = {} end
  cached_key, cached_key_time = key, now
  return key
end

-- The job's nopfs options, as sbatch/salloc/srun pass them (spank_job_env).
local function spank_option(job_desc, name)
  local env = job_desc.spank_job_env
  if type(env) ~= "table" then return nil end
  local prefix = "_SLURM_SPANK_OPTION_nopfs_" .. name .. "="
  for _, v in pairs(env) do
    if type(v) == "string" and v:sub(1, #prefix) == prefix then return v:sub(#prefix + 1) end
  end
  return nil
end

-- Notes in the job's AdminComment that the job asked for its warm nodes: once the job runs,
-- Slurm reports its --prefer only when it could meet it, and the prolog tells a job that asked
-- from one that did not (placement not set up here). Users cannot set an AdminComment.
function nopfs_note_asked(job_desc, mode)
  local note = "nopfs_placement=" .. mode
  local own = job_desc.admin_comment
  if own and own ~= "" then
    job_desc.admin_comment = own .. "," .. note
  else
    job_desc.admin_comment = note
  end
end

-- Adds the mark of the job's user and dataset to the job's --prefer (or --constraint). Returns
-- what it did, for slurmctld's log: nil when the job is not a nopfs job.
function nopfs_job_submit(job_desc)
  local dataset = spank_option(job_desc, "nopfs")
  if not dataset or dataset:sub(1, 1) ~= "/" then return nil end
  local mode = spank_option(job_desc, "nopfs_placement") or "prefer"
  if mode == "off" then return "off" end
  if mode ~= "prefer" and mode ~= "require" then return nil end  -- the plugin refuses it
  if job_desc.req_nodes and job_desc.req_nodes ~= "" then return "nodelist given" end
  local key = placement_key()
  if not key then return "no placement key at " .. nopfs_placement_key_file end
  local uid = job_desc.user_id
  local id = string.format("%d", uid) .. ":" .. dataset
  local mark = marks[id]
  if not mark then
    mark = nopfs_placement_mark(key, uid, dataset)
    marks[id] = mark
  end
  if is_shared(dataset) then
    local sid = "shared:" .. dataset
    if not marks[sid] then marks[sid] = nopfs_shared_mark(key, dataset) end
    mark = mark .. "|" .. marks[sid]
  end
  local field = mode == "require" and "features" or "prefer"
  local own = job_desc[field]
  if own and own ~= "" then
    if mark:find("|", 1, true) then mark = "(" .. mark .. ")" end
    job_desc[field] = "(" .. own .. ")&" .. mark
  else
    job_desc[field] = mark
  end
  nopfs_note_asked(job_desc, mode)
  return mode
end

-- `nopfs where DATASET` (docs/user.md) asks for the user's mark with a test job (sbatch
-- --test-only, which slurmctld runs through this script as any submission, and which it takes
-- only for the user who sends it) whose comment is "nopfs where:DATASET". The answer goes to that
-- user alone (slurm.user_msg): "nopfs where: mark <mark>", followed by "; shared <mark>" (the
-- dataset's shared mark, every user's: it names no user) when the dataset is one the nodes
-- share, or "nopfs where: error: <why>".
local WHERE = "nopfs where:"
function nopfs_where(job_desc)
  local comment = job_desc.comment
  if type(comment) ~= "string" or comment:sub(1, #WHERE) ~= WHERE then return nil end
  local dataset = comment:sub(#WHERE + 1)
  if dataset:sub(1, 1) ~= "/" then
    slurm.user_msg("nopfs where: error: the dataset is not an absolute path")
    return "where"
  end
  local key = placement_key()
  if not key then
    slurm.user_msg("nopfs where: error: slurmctld's host has no placement key at " ..
                   nopfs_placement_key_file)
    return "where"
  end
  local answer = "nopfs where: mark " .. nopfs_placement_mark(key, job_desc.user_id, dataset)
  if is_shared(dataset) then answer = answer .. "; shared " .. nopfs_shared_mark(key, dataset) end
  slurm.user_msg(answer)
  return "where"
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  -- Placement never refuses a job: an error here leaves the job as it was submitted.
  for _, hook in ipairs({ nopfs_where, nopfs_job_submit }) do
    local ok, err = pcall(hook, job_desc)
    if not ok then slurm.log_error("nopfs: placement: %s", tostring(err)) end
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
