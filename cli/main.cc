// nopfs: the command-line front of the clairvoyant burst buffer.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/cmd_admin.h"
#include "cli/cmd_cache.h"
#include "cli/cmd_cat.h"
#include "cli/cmd_config.h"
#include "cli/cmd_gc.h"
#include "cli/cmd_plan.h"
#include "cli/cmd_run.h"
#include "cli/cmd_share.h"
#include "cli/cmd_simulate.h"
#include "cli/cmd_stream.h"
#include "cli/cmd_where.h"
#include "cli/status_text.h"
#include "common/version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "nopfs: a job-scoped burst buffer for deep-learning training that replays the job's shuffle "
      "to stage samples before they are read"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("nopfs ") + nopfs::kVersion);
  int exit_code = 0;
  nopfs::cli::RegisterStream(&app, &exit_code);
  nopfs::cli::RegisterPlan(&app, &exit_code);
  nopfs::cli::RegisterConfig(&app, &exit_code);
  nopfs::cli::RegisterRun(&app, &exit_code);
  nopfs::cli::RegisterCat(&app, &exit_code);
  nopfs::cli::RegisterStatus(&app, &exit_code);
  nopfs::cli::RegisterSimulate(&app, &exit_code);
  nopfs::cli::RegisterCache(&app, &exit_code);
  nopfs::cli::RegisterGc(&app, &exit_code);
  nopfs::cli::RegisterShare(&app, &exit_code);
  nopfs::cli::RegisterAdmin(&app, &exit_code);
  nopfs::cli::RegisterWhere(&app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
