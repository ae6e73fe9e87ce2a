// `switchml`: the command-line front end. One binary, one subcommand per job.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"

namespace {

const char kUsage[] =
    "usage: switchml <command> [flags]\n"
    "\n"
    "SwitchML: in-network aggregation for distributed machine learning.\n"
    "\n"
    "commands:\n"
    "  run      the main job on this machine: a software switch plus N worker processes on\n"
    "           loopback, results verified, throughput printed\n"
    "  switch   the software switch daemon (UDP data plane, gRPC control plane)\n"
    "  worker   one worker of a job against a switch (one per host)\n"
    "  status   what a running switch is doing now: threads, jobs, rates, refusals\n"
    "  sim      simulate jobs at datacenter scale in virtual time (the real switch and worker\n"
    "           code on simulated links), with ring and halving-doubling baselines\n"
    "\n"
    "`switchml <command> --help` describes each command's flags.\n";

std::string SelfExe(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  return argv0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (cmd == "--version") {
    std::cout << "switchml " SWITCHML_VERSION_STRING "\n";
    return 0;
  }
  if (cmd == "switch") return switchml::tools::SwitchCommand(args);
  if (cmd == "worker") return switchml::tools::WorkerCommand(args);
  if (cmd == "sim") return switchml::tools::SimCommand(args);
  if (cmd == "status") return switchml::tools::StatusCommand(args);
  if (cmd == "run") return switchml::tools::RunCommand(args, SelfExe(argv[0]));
  std::cerr << "switchml: unknown command '" << cmd << "'\n\n" << kUsage;
  return 2;
}
