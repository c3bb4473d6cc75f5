// comm-run: the local, single-machine launcher. Starts N ranks with torchrun's environment,
// pins them to cores as mpirun does, tags their output with the rank, forwards Ctrl-C, and
// when one rank fails stops the rest, so a broken job never hangs the terminal.
//
// options.cc: the command line; job_environment.cc: what each rank is started with;
// launcher.cc: starting and supervising the ranks, the exit status; rank_output.cc: passing
// the ranks' output on, line by line, with "[rank] " prefixes.
#include <cstdio>

#include "launcher.h"
#include "options.h"
#include "params.h"

int main(int argc, char** argv) {
  comm_run::Options opt;
  if (int code = comm_run::parse_options(argc, argv, &opt); code >= 0) return code;
  if (opt.print_params) {
    std::fputs(comm::params::describe_all().c_str(), stdout);
    return 0;
  }
  comm_run::Launcher launcher(opt);
  return launcher.run();
}
