-- The demonstration node of scripts/demo.sh: a 20 GB RAM tier and a 60 GB SSD tier.
-- Bandwidths are those of the documented example (contrib/config/nopfs.conf.lua).
log_level = "info"
pfs = { {1, "250M/s"}, {4, "900M/s"}, {16, "2G/s"}, {64, "2.4G/s"} }
network = "10G/s"
staging = { capacity = "1G", threads = 4 }
classes = {
  ram { capacity = "20G", threads = 4, read = { {1, "8G/s"}, {4, "20G/s"} },
        write = { {1, "5G/s"}, {4, "12G/s"} } },
  ssd { path = "/tmp/nopfs-demo-ssd", capacity = "60G", threads = 4,
        read = { {1, "1.2G/s"}, {8, "3G/s"} }, write = { {1, "900M/s"}, {8, "2G/s"} } },
}
