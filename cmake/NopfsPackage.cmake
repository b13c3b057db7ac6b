# CPack: `cpack -G DEB` in the build tree makes nopfs_<version>_<arch>.deb from what
# `cmake --install` installs (cmake/NopfsInstall.cmake). Configure the tree with
# -DCMAKE_INSTALL_PREFIX=/usr for a package (tests/package/package_test.sh does).
#
# Depends: the shared libraries' packages come from dpkg-shlibdeps (RocksDB, Lua,
# libslurm, OpenSSL, ...). The SPANK plugin is built against one Slurm release: slurmd and sbatch
# refuse a plugin of another major.minor, so the package needs the Slurm plugins of the same
# release (slurm-wlm-basic-plugins, which both slurmd and slurm-client depend on, at exactly their
# version). python3 for the Python package; python3-torch only recommended (nopfs.torch).
set(CPACK_PACKAGE_NAME nopfs)
set(CPACK_PACKAGE_VENDOR "the nopfs developers")
set(CPACK_PACKAGE_CONTACT "nopfs developers <nopfs@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "job-scoped burst buffer for deep-learning training on Slurm")
set(CPACK_PACKAGE_DESCRIPTION
    "nopfs starts one cache service per node of a Slurm job submitted with --nopfs=DATASET, replays\
 the job's shuffle, stages the samples each node will read most into RAM and SSD tiers and\
 serves every training process its samples in exact order, from its own tiers, a peer's, or\
 the parallel file system. Includes the SPANK plugin, nopfsd, the nopfs command and the\
 Python/PyTorch client.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)

# libfabric is loaded at run time (dlopen), so dpkg-shlibdeps does not see it.
set(_nopfs_deb_depends "python3 (>= 3.9), libfabric1 (>= 1.11)")
if(EXISTS /usr/include/slurm/slurm_version.h)
  file(STRINGS /usr/include/slurm/slurm_version.h _v REGEX "^#define SLURM_VERSION_NUMBER")
  string(REGEX MATCH "0x([0-9a-fA-F][0-9a-fA-F])([0-9a-fA-F][0-9a-fA-F])" _ "${_v}")
  math(EXPR _major "0x${CMAKE_MATCH_1}")
  math(EXPR _minor "0x${CMAKE_MATCH_2}")
  math(EXPR _next "${_minor} + 1")
  if(_minor LESS 10)
    set(_minor "0${_minor}")
  endif()
  if(_next LESS 10)
    set(_next "0${_next}")
  endif()
  string(APPEND _nopfs_deb_depends ", slurm-wlm-basic-plugins (>= ${_major}.${_minor})"
         ", slurm-wlm-basic-plugins (<< ${_major}.${_next})")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS ${_nopfs_deb_depends})
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-torch, python3-numpy")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torchvision")

# What lives under /etc is the admin's to edit: conffiles, kept on upgrade and on `dpkg -r`. The
# plugin's line is not among them: the package ships it under /usr/share/nopfs, where Slurm does
# not read it, and `nopfs admin enable` writes /etc/slurm/plugstack.conf.d/nopfs.conf
# (cli/cmd_admin.h), so that installing changes nothing until the admin enables it.
set(_nopfs_conffiles
    ${NOPFS_SYSCONFDIR}/nopfs.conf.lua
    ${NOPFS_SYSCONFDIR}/policy.lua)
list(JOIN _nopfs_conffiles "\n" _nopfs_conffiles)
file(WRITE ${PROJECT_BINARY_DIR}/debian/conffiles "${_nopfs_conffiles}\n")
# Python writes __pycache__ beside the modules when root imports them; dpkg -r removes only what
# the package shipped, so prerm removes the bytecode (what dh_python3's py3clean does) of each
# package directory: nopfs and nopfs.torch.
if(IS_ABSOLUTE ${NOPFS_PYTHON_INSTALL_DIR_USED})
  set(_nopfs_pydir ${NOPFS_PYTHON_INSTALL_DIR_USED}/nopfs)
else()
  set(_nopfs_pydir ${CMAKE_INSTALL_PREFIX}/${NOPFS_PYTHON_INSTALL_DIR_USED}/nopfs)
endif()
set(_nopfs_plugstack ${NOPFS_SLURM_SYSCONFDIR_FULL}/plugstack.conf.d/nopfs.conf)
set(_nopfs_varlib /var/lib/nopfs)
# prerm: on removal (not on an upgrade, which keeps the plugin enabled for the next job), the
# plugin's line goes aside, so that sbatch, srun and slurmd never load a plugin that is gone; and
# what the package's purge will remove is written down while nopfs can still read its config.
configure_file(${PROJECT_SOURCE_DIR}/cmake/deb/prerm.in ${PROJECT_BINARY_DIR}/debian/prerm @ONLY)
# postrm: on purge, the plugin's line and every piece of nopfs's state written down by prerm
# (the run directory, the SSD's nopfs-<uid> trees, the catalog cache, the metrics files).
configure_file(${PROJECT_SOURCE_DIR}/cmake/deb/postrm.in ${PROJECT_BINARY_DIR}/debian/postrm @ONLY)
foreach(script prerm postrm)
  file(CHMOD ${PROJECT_BINARY_DIR}/debian/${script}
       PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ
                   WORLD_EXECUTE)
endforeach()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/conffiles
    ${PROJECT_BINARY_DIR}/debian/prerm ${PROJECT_BINARY_DIR}/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
