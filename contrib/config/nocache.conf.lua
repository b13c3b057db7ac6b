-- A node with no cache tier: every read goes to the PFS. The baseline scripts/demo.sh compares
-- against; bandwidths as in contrib/config/nopfs.conf.lua.
pfs = { {1, "250MB/s"}, {4, "900MB/s"}, {16, "2GB/s"}, {64, "2.4GB/s"} }
network = "10GB/s"
staging = { capacity = "1GB", threads = 4 }
classes = {}
