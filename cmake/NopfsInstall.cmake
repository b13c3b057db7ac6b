# `cmake --install`: where every part of nopfs goes (GNUInstallDirs), and the man pages, generated
# from docs/ and the programs' --help at build time. With CMAKE_INSTALL_PREFIX=/usr (the package,
# cmake/NopfsPackage.cmake) the layout is Debian's:
#
#   /usr/bin/nopfs                               the user's command
#   /usr/sbin/nopfsd                             the per-job cache service
#   /usr/libexec/nopfs/nopfs-job                 the launcher the plugin runs as root
#   /usr/lib/<multiarch>/slurm-wlm/spank_nopfs.so  the SPANK plugin, in Slurm's plugin directory
#   /usr/lib/python3/dist-packages/nopfs/        the Python package (python/CMakeLists.txt)
#   /etc/nopfs/{nopfs.conf.lua,policy.lua}       the node config and the admission policy
#   /usr/share/nopfs/plugstack.conf              the plugin's line, where Slurm does not read it:
#                                                `nopfs admin enable` copies it to
#                                                /etc/slurm/plugstack.conf.d/nopfs.conf (Debian's
#                                                plugstack.conf includes plugstack.conf.d/*.conf)
#   /usr/lib/systemd/system/nopfs-gc.{service,timer}  `nopfs gc` hourly, disabled until enabled
#   /usr/lib/systemd/system/nopfs-placement.{service,timer}  the node's placement marks every 30 s,
#                                                likewise
#   /usr/lib/systemd/system/nopfs-node-exporter.service  the metrics for Prometheus, likewise
#   /usr/lib/systemd/system/nopfs-share.service  the node's share service from boot, likewise
#   /usr/share/man/man1/nopfs.1, man8/nopfsd.8, man8/nopfs-spank.8
#   /usr/share/doc/nopfs/                        README, docs/, the example job scripts
#
# /etc stays /etc under /usr (GNUInstallDirs' rule), and under any other prefix it is <prefix>/etc.
# GNUInstallDirs is included at the top, before the targets: the programs are built knowing where
# their partners are installed (NOPFS_INSTALLED_* below).

# Slurm's plugin directory: Debian's packages use <libdir>/slurm-wlm, upstream's <libdir>/slurm.
if(EXISTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/slurm-wlm AND CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(_nopfs_slurm_plugin_default ${CMAKE_INSTALL_LIBDIR}/slurm-wlm)
else()
  set(_nopfs_slurm_plugin_default ${CMAKE_INSTALL_LIBDIR}/slurm)
endif()
set(NOPFS_SLURM_PLUGIN_DIR ${_nopfs_slurm_plugin_default}
    CACHE STRING "Where the SPANK plugin is installed (relative: under the prefix)")
set(NOPFS_SLURM_SYSCONFDIR ${CMAKE_INSTALL_FULL_SYSCONFDIR}/slurm
    CACHE STRING "Slurm's configuration directory (its plugstack.conf.d gets nopfs.conf)")
set(NOPFS_SYSCONFDIR ${CMAKE_INSTALL_FULL_SYSCONFDIR}/nopfs)

foreach(v NOPFS_SLURM_PLUGIN_DIR NOPFS_SLURM_SYSCONFDIR NOPFS_SYSCONFDIR)
  if(IS_ABSOLUTE ${${v}})
    set(${v}_FULL ${${v}})
  else()
    set(${v}_FULL ${CMAKE_INSTALL_PREFIX}/${${v}})
  endif()
endforeach()
# `nopfs admin` (cli/cmd_admin.h): where the package's line is and where enabling puts it.
target_compile_definitions(nopfs PRIVATE
  NOPFS_INSTALLED_PLUGSTACK_LINE="${CMAKE_INSTALL_FULL_DATADIR}/nopfs/plugstack.conf"
  NOPFS_INSTALLED_PLUGSTACK_DIR="${NOPFS_SLURM_SYSCONFDIR_FULL}/plugstack.conf.d")

install(TARGETS nopfs RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS nopfsd RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR})
if(TARGET spank_nopfs)
  install(TARGETS nopfs-job RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/nopfs)
  install(TARGETS spank_nopfs LIBRARY DESTINATION ${NOPFS_SLURM_PLUGIN_DIR})
  # The plugin's line, with the installed paths; the plugin finds the launcher, and the launcher
  # nopfsd, at their installed places without arguments.
  configure_file(${PROJECT_SOURCE_DIR}/contrib/slurm/plugstack.conf.in
                 ${PROJECT_BINARY_DIR}/contrib/plugstack.conf @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/contrib/plugstack.conf
          DESTINATION ${CMAKE_INSTALL_DATADIR}/nopfs)
  install(FILES ${PROJECT_SOURCE_DIR}/contrib/slurm/nopfs.conf.lua
                ${PROJECT_SOURCE_DIR}/contrib/slurm/policy.lua
          DESTINATION ${NOPFS_SYSCONFDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/contrib/slurm/slurm.conf.fragment
                ${PROJECT_SOURCE_DIR}/contrib/slurm/examples/train.sbatch
                ${PROJECT_SOURCE_DIR}/contrib/slurm/examples/verify.sbatch
                ${PROJECT_SOURCE_DIR}/contrib/slurm/examples/epoch_task.py
                ${PROJECT_SOURCE_DIR}/contrib/slurm/job_submit.lua
          DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
  # The node's placement marks every 30 s (docs/admin.md, "Placement"), disabled until enabled.
  configure_file(${PROJECT_SOURCE_DIR}/contrib/systemd/nopfs-placement.service.in
                 ${PROJECT_BINARY_DIR}/contrib/nopfs-placement.service @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/contrib/nopfs-placement.service
                ${PROJECT_SOURCE_DIR}/contrib/systemd/nopfs-placement.timer
          DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)
  # The node's share service from boot (docs/admin.md, "Shared datasets"), disabled until enabled.
  configure_file(${PROJECT_SOURCE_DIR}/contrib/systemd/nopfs-share.service.in
                 ${PROJECT_BINARY_DIR}/contrib/nopfs-share.service @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/contrib/nopfs-share.service
          DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)
endif()
# `nopfs gc` every hour, as a systemd timer that stays disabled until the admin enables it.
configure_file(${PROJECT_SOURCE_DIR}/contrib/systemd/nopfs-gc.service.in
               ${PROJECT_BINARY_DIR}/contrib/nopfs-gc.service @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/contrib/nopfs-gc.service
              ${PROJECT_SOURCE_DIR}/contrib/systemd/nopfs-gc.timer
              ${PROJECT_SOURCE_DIR}/contrib/systemd/nopfs-node-exporter.service
        DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        FILES_MATCHING PATTERN "*.md" PATTERN "*.png")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        FILES_MATCHING PATTERN "*.py")

# Man pages: the docs' sections and the programs' own --help, so that they cannot drift; gzipped
# as Debian installs them (gzip -n: no name or time stamp, reproducible).
set(_nopfs_man_dir ${PROJECT_BINARY_DIR}/man)
set(_docs ${PROJECT_SOURCE_DIR}/docs)
set(_nopfs_man_gz)
# nopfs_man_page(NAME SECTION DEPENDS files/targets... ARGS md2man arguments...)
function(nopfs_man_page name section)
  cmake_parse_arguments(PARSE_ARGV 2 M "" "" "DEPENDS;ARGS")
  set(page ${_nopfs_man_dir}/${name}.${section})
  add_custom_command(OUTPUT ${page}.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_nopfs_man_dir}
    COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/scripts/md2man.py --version ${PROJECT_VERSION}
            --docdir ${CMAKE_INSTALL_FULL_DOCDIR}/docs
            --name ${name} --section ${section} --out ${page} ${M_ARGS}
    COMMAND gzip -9 -n -c ${page} > ${page}.gz
    DEPENDS ${PROJECT_SOURCE_DIR}/scripts/md2man.py ${M_DEPENDS}
    COMMENT "man page ${name}(${section})" VERBATIM)
  install(FILES ${page}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
  set(_nopfs_man_gz ${_nopfs_man_gz} ${page}.gz PARENT_SCOPE)
endfunction()

nopfs_man_page(nopfs 1 DEPENDS nopfs ${_docs}/user.md ARGS
  --summary "read a training job's samples through nopfs, plan and simulate its cache"
  --synopsis "`nopfs` *COMMAND* [*OPTIONS*]"
  --md ${_docs}/user.md
  --help-cmd "COMMANDS=$<TARGET_FILE:nopfs> --help"
  --help-cmd "+nopfs run=$<TARGET_FILE:nopfs> run --help"
  --help-cmd "+nopfs cat=$<TARGET_FILE:nopfs> cat --help"
  --help-cmd "+nopfs status=$<TARGET_FILE:nopfs> status --help"
  --help-cmd "+nopfs stream=$<TARGET_FILE:nopfs> stream --help"
  --help-cmd "+nopfs plan=$<TARGET_FILE:nopfs> plan --help"
  --help-cmd "+nopfs simulate=$<TARGET_FILE:nopfs> simulate --help"
  --help-cmd "+nopfs config=$<TARGET_FILE:nopfs> config --help"
  --help-cmd "+nopfs cache ls=$<TARGET_FILE:nopfs> cache ls --help"
  --help-cmd "+nopfs cache rm=$<TARGET_FILE:nopfs> cache rm --help"
  --help-cmd "+nopfs gc=$<TARGET_FILE:nopfs> gc --help"
  --help-cmd "+nopfs where=$<TARGET_FILE:nopfs> where --help"
  --help-cmd "+nopfs admin enable=$<TARGET_FILE:nopfs> admin enable --help"
  --help-cmd "+nopfs admin disable=$<TARGET_FILE:nopfs> admin disable --help"
  --help-cmd "+nopfs admin status=$<TARGET_FILE:nopfs> admin status --help"
  --help-cmd "+nopfs admin state=$<TARGET_FILE:nopfs> admin state --help"
  --see-also "**nopfsd**(8), **nopfs-spank**(8), **sbatch**(1); /usr/share/doc/nopfs/docs")
nopfs_man_page(nopfsd 8 DEPENDS nopfsd ${_docs}/service.md ARGS
  --summary "the cache service of one nopfs job on one node"
  --synopsis "`nopfsd` `--dataset` *DIR* `--run-dir` *DIR* [*OPTIONS*]"
  --md ${_docs}/service.md
  --help-cmd "OPTIONS=$<TARGET_FILE:nopfsd> --help"
  --see-also "**nopfs**(1), **nopfs-spank**(8)")
nopfs_man_page(nopfs-spank 8 DEPENDS ${_docs}/user.md ${_docs}/admin.md ARGS
  --summary "the nopfs SPANK plugin: sbatch options, plugstack.conf arguments, what a job gets"
  --synopsis "`optional` *PLUGINDIR*`/spank_nopfs.so` [*KEY*`=`*VALUE* ...]  (plugstack.conf)"
  --synopsis "`sbatch --nopfs=`*DATASET* [`--nopfs-`*OPTION*`=`*VALUE* ...] *SCRIPT*"
  --md "${_docs}/user.md:The options,What your tasks see,Ranks,When your job gets no cache,Kept datasets,Where your next job runs"
  --md "${_docs}/admin.md:plugstack.conf,Peers,The node config and the policy,Reservations,Kept datasets,Placement,What happens to a job,Logs,Troubleshooting"
  --see-also "**nopfs**(1), **nopfsd**(8), **spank**(8), **slurm.conf**(5)")
add_custom_target(nopfs_man ALL DEPENDS ${_nopfs_man_gz})
