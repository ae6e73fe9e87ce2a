// Test support: run the `switchml` binary as child processes and collect exit codes and output.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace switchml::testing {

// A child process whose stdout and stderr go to one temporary file. A child that cannot be
// started (fork or the file failed) counts as ended with exit code 127, and output() says why.
class Process {
 public:
  explicit Process(const std::vector<std::string>& argv);
  ~Process();  // kills the child if it still runs
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Waits up to `timeout`; returns false when the child still runs then.
  bool Wait(std::chrono::milliseconds timeout);
  void Kill(int signal);
  bool running();
  // Exit code, or 128 + signal; -1 while running.
  int exit_code() const { return exit_code_; }
  std::string output() const;
  // Waits until output() contains `text` or the child ends; false on timeout or end without it.
  bool WaitForOutput(const std::string& text, std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;  // -1: the child was never started (start_error_ says why)
  int exit_code_ = -1;
  std::string path_;
  std::string start_error_;
};

// The path of the switchml binary under test.
std::string SwitchmlBinary();

// One `switchml worker` of a test job: it verifies its results and reports them (--report:
// "status=ok verified=1"), runs `iterations` all-reduces without warm-up and allows 20 s for
// the session setup; `extra` flags are appended (--session, --job-secret, --transport, ...).
struct WorkerCommand {
  std::string control;  // the switch's control plane, "host:port"
  uint32_t rank = 0;
  uint32_t workers = 2;
  std::string size = "1000";
  std::string dtype = "float32";
  std::string iterations = "2";
  std::vector<std::string> extra;
};
std::vector<std::string> WorkerArgv(const WorkerCommand& w);
std::unique_ptr<Process> StartWorkerProcess(const WorkerCommand& w);

// A `switchml switch` process on 127.0.0.1 with ports picked by the kernel.
struct SwitchProcess {
  std::unique_ptr<Process> process;
  std::string control;  // "127.0.0.1:port", empty when the switch did not start
};
// Starts one with `extra` flags and waits (up to 20 s) until it prints its control port.
// `prefix`: a command to run it under (e.g. {"/bin/bash", "-c", "ulimit -n 1024 && exec \"$0\"
// \"$@\""}: the switch's own argv follows).
SwitchProcess StartSwitchProcess(const std::vector<std::string>& extra,
                                 const std::vector<std::string>& prefix = {});

}  // namespace switchml::testing
