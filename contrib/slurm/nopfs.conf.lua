-- /etc/nopfs/nopfs.conf.lua on a Slurm node (docs/config.md has every field).
-- nopfs-job (as root, in the job prolog) and nopfsd (as the job's user) both read it: keep it
-- root-owned and world-readable. Check it with: nopfs config /etc/nopfs/nopfs.conf.lua

log_level = "info"

-- The parallel file system as measured from this node: readers -> aggregate bytes/s.
pfs = { {1, "250M/s"}, {4, "900M/s"}, {16, "2G/s"} }
network = "10G/s"
staging = { capacity = "2G", threads = 4 }

classes = {
  -- The most any job may take of this node's memory for its RAM tier. What a job gets is
  -- decided per job by the policy, out of the job's own --mem allocation.
  ram { capacity = "25%", threads = 4 },
  -- Only on nodes with a local SSD (Features=nvme in slurm.conf). Each job gets
  -- <path>/nopfs-<uid>/<jobid>.<node>/, removed by the epilog.
  ssd { path = "/local/nvme", capacity = "1500G", threads = 8 },
}

-- Hard caps whatever the policy says.
limits = { jobs_per_node = 4, ram_per_job = "128G", ssd_per_job = "1T" }

-- Each job's nopfsd log, kept by the epilog for the admin and the job's user, for 14 days.
job_logs = { dir = "/var/log/nopfs", days = 14 }
