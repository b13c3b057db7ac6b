-- nopfs admission policy: the documented example (docs/config.md, "Admission policy").
--
-- nopfs asks admit(job, node) on every node of an allocation when a job submitted with
-- --nopfs starts. `job` (id, uid, gid, user, account, partition, qos, dataset, nodes, ram, ssd)
-- and `node` (name, ram_total, ssd_total, ram_reserved, ssd_reserved, ram_free, ssd_free, jobs)
-- are read-only; sizes are numbers of MiB, as Slurm's --mem (size("8G") is 8192); job.ram/job.ssd
-- are 0 when the user asked for no size.
-- Return { ram = SIZE, ssd = SIZE } to admit, or nil, "reason" to refuse. Whatever is returned
-- is then clamped to the request, the config's limits and what is free on the node.

local interactive = { debug = true, interactive = true }

function admit(job, node)
  if interactive[job.partition] then
    return nil, "nopfs is not offered on the " .. job.partition .. " partition"
  end
  -- A fair share: no job takes more than half of what is free when it starts.
  local grant = { ram = node.ram_free // 2, ssd = node.ssd_free // 2 }
  -- Accounts that paid for it may take everything that is free.
  if job.account == "ml-priority" then
    grant = { ram = node.ram_free, ssd = node.ssd_free }
  end
  -- Small requests are always served in full.
  if job.ram ~= 0 and job.ram <= size("8G") then grant.ram = job.ram end
  return grant
end

-- Keeping: how much of a user's SSD tier may stay on a node after the job for the user's next
-- job on the same dataset (docs/admin.md, "Kept datasets"). Return { quota = SIZE, lifetime =
-- SECONDS or "7d" }, or nil to keep nothing (a job then leaves nothing on the node). Shipped off:
-- set keep_share to let every user keep that share of the node's SSD for a week (10: a tenth).
local keep_share = nil
function keep(user, node)
  if not keep_share then return nil end
  return { quota = node.ssd_total // keep_share, lifetime = "7d" }
end
