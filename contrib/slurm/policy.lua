-- nopfs admission policy for a Slurm cluster (docs/admin.md, "The policy").
--
-- admit(job, node) runs as root in a sandbox on every node of the allocation at job start.
-- job:  id, uid, gid, user, account, partition, qos, dataset, nodes,
--       ram, ssd (what the user asked for per node with --nopfs-ram/--nopfs-ssd; 0: nothing),
--       memory (the job's own memory allocation on this node, from --mem or --mem-per-cpu;
--               0 when the job has no memory limit)
-- Every size is a number of MiB, as Slurm's --mem (job.memory is 4096 for --mem=4G), and
-- size("512M") converts a string to MiB (512); a returned number is MiB too.
-- node: name, ram_total, ssd_total, ram_reserved, ssd_reserved, ram_free, ssd_free, jobs
-- Return { ram = SIZE, ssd = SIZE } to admit, or nil, "reason" to refuse (the user sees it).
-- Whatever is returned is then clamped to the request, the job's memory allocation, the
-- config's limits{} and what is free on the node, so a policy cannot oversubscribe a node.

-- Partitions without a cache, and per-partition caps per node.
local no_cache = { interactive = true }
local partition_cap = {
  debug = { ram = size("256M"), ssd = size("512M") },
  batch = { ram = size("512M"), ssd = size("1G") },
}

-- Users who may not use the cache, and per-user caps per node.
local banned = { ["nopfs-mallory"] = true }
local user_cap = { ["nopfs-bob"] = { ram = size("128M"), ssd = size("256M") } }

local function min(a, b) if a < b then return a end return b end

function admit(job, node)
  if no_cache[job.partition] then
    return nil, "nopfs is not offered on partition " .. job.partition
  end
  if banned[job.user] then
    return nil, "user " .. job.user .. " may not use nopfs; ask the admins"
  end

  -- The RAM tier comes out of the job's own memory: by default a quarter of its allocation,
  -- never the host's total, so that training keeps its memory. Without --mem, fall back to a
  -- fair share of what is free.
  local ram
  if job.ram ~= 0 then
    ram = job.ram
  elseif job.memory ~= 0 then
    ram = job.memory // 4
  else
    ram = node.ram_free // 2
  end
  local ssd = job.ssd ~= 0 and job.ssd or node.ssd_free // 2

  for _, cap in pairs({ partition_cap[job.partition] or false, user_cap[job.user] or false }) do
    if cap then
      ram = min(ram, cap.ram)
      ssd = min(ssd, cap.ssd)
    end
  end
  return { ram = ram, ssd = ssd }
end
