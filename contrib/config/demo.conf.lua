-- The demonstration node of scripts/demo.sh: a 20 GB RAM tier and a 60 GB SSD tier.
-- Bandwidths are those of the documented example (contrib/config/nopfs.conf.lua).
log_level = "info"
pfs = { {1, "250MB/s"}, {4, "900MB/s"}, {16, "2GB/s"}, {64, "2.4GB/s"} }
network = "10GB/s"
staging = { capacity = "1GB", threads = 4 }
classes = {
  ram { capacity = "20GB", threads = 4, read = { {1, "8GB/s"}, {4, "20GB/s"} },
        write = { {1, "5GB/s"}, {4, "12GB/s"} } },
  ssd { path = "/tmp/nopfs-demo-ssd", capacity = "60GB", threads = 4,
        read = { {1, "1.2GB/s"}, {8, "3GB/s"} }, write = { {1, "900MB/s"}, {8, "2GB/s"} } },
}
