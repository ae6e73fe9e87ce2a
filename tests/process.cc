#include "process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace switchml::testing {

std::string SwitchmlBinary() { return SWITCHML_BINARY; }

// Everything the child needs is prepared before fork(): the test process has other threads (a
// switch daemon, gRPC), so the child may only call async-signal-safe functions until execv. A
// malloc there could wait forever on an allocator lock another thread held at the fork (seen in
// CI's ASan build: one of eight workers never started and printed nothing).
Process::Process(const std::vector<std::string>& argv) {
  char tmpl[] = "/tmp/switchml-test-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) {
    start_error_ = std::string("test process: mkstemp: ") + strerror(errno) + "\n";
    exit_code_ = 127;
    return;
  }
  path_ = tmpl;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  static const char kExecFailed[] = "test process: execv failed\n";
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
    execv(args[0], args.data());
    (void)!write(STDERR_FILENO, kExecFailed, sizeof kExecFailed - 1);
    _exit(127);
  }
  if (pid_ < 0) {
    // No child: it counts as ended at once. (pid -1 must never reach waitpid or kill: -1 means
    // any child to waitpid, and every process we may signal to kill.)
    start_error_ = std::string("test process: fork: ") + strerror(errno) + "\n";
    exit_code_ = 127;
  }
  close(fd);
}

Process::~Process() {
  if (running()) {
    Kill(SIGKILL);
    Wait(std::chrono::seconds(5));
  }
  if (!path_.empty()) unlink(path_.c_str());
}

bool Process::running() {
  if (exit_code_ >= 0 || pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

bool Process::Wait(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void Process::Kill(int signal) {
  if (exit_code_ < 0 && pid_ > 0) kill(pid_, signal);
}

std::string Process::output() const {
  if (!start_error_.empty()) return start_error_;
  std::ifstream f(path_);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool Process::WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (output().find(text) != std::string::npos) return true;
    if (!running()) return output().find(text) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::vector<std::string> WorkerArgv(const WorkerCommand& w) {
  std::vector<std::string> argv = {SwitchmlBinary(), "worker",
                                   "--switch",       w.control,
                                   "--rank",         std::to_string(w.rank),
                                   "--workers",      std::to_string(w.workers),
                                   "--size",         w.size,
                                   "--dtype",        w.dtype,
                                   "--iterations",   w.iterations,
                                   "--warmup",       "0",
                                   "--report",       "--setup-timeout-ms",
                                   "20000"};
  argv.insert(argv.end(), w.extra.begin(), w.extra.end());
  return argv;
}

std::unique_ptr<Process> StartWorkerProcess(const WorkerCommand& w) {
  return std::make_unique<Process>(WorkerArgv(w));
}

SwitchProcess StartSwitchProcess(const std::vector<std::string>& extra,
                                 const std::vector<std::string>& prefix) {
  std::vector<std::string> argv = prefix;
  for (const char* a : {"switch", "--bind", "127.0.0.1", "--data-port", "0", "--control-port", "0",
                        "--log-level", "warning"}) {
    if (argv.size() == prefix.size()) argv.push_back(SwitchmlBinary());
    argv.push_back(a);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  SwitchProcess s;
  s.process = std::make_unique<Process>(argv);
  s.process->WaitForOutput("(gRPC)", std::chrono::seconds(20));
  std::smatch m;
  const std::string out = s.process->output();
  if (std::regex_search(out, m, std::regex("control port ([0-9]+) \\(gRPC\\)"))) {
    s.control = "127.0.0.1:" + m[1].str();
  }
  return s;
}

}  // namespace switchml::testing
