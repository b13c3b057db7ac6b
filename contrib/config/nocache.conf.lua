-- A node with no cache tier: every read goes to the PFS. The baseline scripts/demo.sh compares
-- against; bandwidths as in contrib/config/nopfs.conf.lua.
pfs = { {1, "250M/s"}, {4, "900M/s"}, {16, "2G/s"}, {64, "2.4G/s"} }
network = "10G/s"
staging = { capacity = "1G", threads = 4 }
classes = {}
