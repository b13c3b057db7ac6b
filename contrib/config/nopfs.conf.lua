-- nopfs node configuration: the documented example (docs/config.md has every field).
--
-- This file is Lua 5.4, run in a sandbox (no io, no os.execute, bounded memory and time). It
-- sets globals; sizes are written as Slurm's --mem: a number is MiB, a string takes the units
-- K, M, G, T (powers of 1024; "GB" is the same as "G"), e.g. "20G" or "512M"; bandwidths are
-- MiB/s or strings like "1.5G/s". A bandwidth "table" is one bandwidth, or a list of {threads, bandwidth}
-- points measured on this node, interpolated linearly between points and flat outside them.
-- Check a config with:  nopfs config /etc/nopfs/nopfs.conf.lua

-- spdlog level of nopfsd's log (in the job's run directory).
log_level = "info"

-- When RAM tier hits are checked against the checksum taken at fill: "on_fill" (the tier is
-- sealed and only nopfsd writes it) or "always" (every hit hashed again, at a CPU cost; SSD and
-- peer reads are always checked). docs/tiers.md has the trade-off.
verify = "on_fill"

-- Where scanned dataset catalogs are kept for later jobs (one subdirectory per user, 0700, made
-- by the job prolog). Owned by root, mode 0755. Leave it out to rescan the dataset in every job.
catalog_cache = "/var/cache/nopfs"

-- The parallel file system: aggregate read bandwidth against the number of concurrent readers
-- across the whole job (measure it, e.g. with fio, at 1, 4, 16 and 64 readers).
pfs = { {1, "250M/s"}, {4, "900M/s"}, {16, "2G/s"}, {64, "2.4G/s"} }

-- Node-to-node bandwidth one peer read can expect (0 or absent: never read from peers).
network = "10G/s"

-- The staging buffer: per-rank rings in shared memory that hold each rank's next samples.
staging = { capacity = "2G", threads = 4 }

-- Cache tiers, fastest first. A job gets at most the capacity the admission policy grants it
-- (contrib/config/policy.lua), never more than written here.
classes = {
  ram {
    capacity = "25%",                          -- of this node's memory, or a size like "64G"
    threads = 4,                               -- prefetch threads filling this tier
    read = { {1, "8G/s"}, {4, "20G/s"} },
    write = { {1, "5G/s"}, {4, "12G/s"} },
  },
  ssd {
    path = "/local/scratch",                   -- root's, 0755; each job gets a 0700 directory below
    capacity = "800G",
    threads = 8,
    read = { {1, "1.2G/s"}, {8, "3G/s"} },
    write = { {1, "900M/s"}, {8, "2G/s"} },
  },
}

-- Caps on every job, whatever the policy says (0 or absent: none).
limits = { jobs_per_node = 8, ram_per_job = "50%", ssd_per_job = "800G",
           streams_per_rank = 32 }               -- open streams per rank: one per DataLoader worker
