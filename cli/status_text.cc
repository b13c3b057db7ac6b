#include "cli/status_text.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "client/client.h"
#include "protocol/status_report.h"

namespace nopfs::cli {
namespace {

struct StatusFlags {
  std::string socket;
  bool json = false;
  bool watch = false;
  double interval = 1.0;  // seconds between refreshes with --watch
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs status: %s\n", msg.c_str());
  return 2;
}

size_t CountLines(const std::string& s) {
  size_t n = 0;
  for (char c : s)
    n += c == '\n' ? 1 : 0;
  return n;
}

// Refreshes until the service goes away (exit 0 once it answered at least once).
int Watch(client::Client& c, const StatusFlags& f) {
  const bool tty = !f.json && ::isatty(STDOUT_FILENO) == 1;
  size_t drawn = 0;  // lines of the previous refresh, overwritten on a terminal
  for (bool first = true;; first = false) {
    Result<report::StatusReport> r = c.Report();
    if (!r.ok()) {
      if (first) return Fail(r.status().message());
      std::fprintf(stderr, "nopfs status: nopfsd has gone away (%s)\n",
                   r.status().message().c_str());
      return 0;
    }
    if (f.json) {
      std::printf("%s\n", report::RenderJson(*r).c_str());
    } else {
      std::string lines = report::RenderProgress(*r, tty);
      if (lines.empty()) lines = "staging: no tier to stage on this node\n";
      if (tty) {
        // Back to the first line of the previous refresh, each line cleared before it is drawn.
        if (drawn > 0) std::printf("\033[%zuA", drawn);
        std::string out;
        size_t start = 0;
        for (size_t nl = lines.find('\n'); nl != std::string::npos;
             start = nl + 1, nl = lines.find('\n', start)) {
          out += "\033[2K";
          out += lines.substr(start, nl + 1 - start);
        }
        std::printf("%s", out.c_str());
        drawn = CountLines(lines);
      } else {
        std::printf("%s", lines.c_str());
      }
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(f.interval));
  }
}

}  // namespace

void RegisterStatus(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<StatusFlags>();
  CLI::App* sub = app->add_subcommand("status", "Show what the local nopfsd is doing");
  sub->add_option("--socket", f->socket, "nopfsd's socket (default: $NOPFS_SOCKET)");
  sub->add_flag("--json", f->json,
                "Print the status as one JSON object (docs/service.md, \"Status\")");
  sub->add_flag("--watch", f->watch,
                "Refresh the staging progress every --interval seconds until nopfsd goes away");
  sub->add_option("--interval", f->interval, "Seconds between refreshes with --watch")
      ->check(CLI::Range(0.05, 3600.0).description("a number of seconds from 0.05 to 3600"));
  sub->callback([f, exit_code] {
    Result<std::unique_ptr<client::Client>> c = client::Client::Connect(f->socket);
    if (!c.ok()) {
      *exit_code = Fail(c.status().message());
      return;
    }
    if (f->watch) {
      *exit_code = Watch(**c, *f);
      return;
    }
    Result<report::StatusReport> r = (*c)->Report();
    if (!r.ok()) {
      *exit_code = Fail(r.status().message());
      return;
    }
    std::printf("%s",
                f->json ? (report::RenderJson(*r) + "\n").c_str() : report::RenderText(*r).c_str());
    *exit_code = 0;
  });
}

}  // namespace nopfs::cli
