// A small command-line flag parser for the `switchml` subcommands: "--name value",
// "--name=value" and boolean "--name"; --help prints the usage. Errors name the flag and say what
// is expected.
//
// Every flag is bound to a typed variable when it is declared: the variable's value then is the
// flag's default (shown by --help), and Parse writes what the command line gives into it, so
// that a command reads its flags as the fields of its own struct, never by name:
//
//   struct DemoFlags { int64_t workers = 2; Size size{1 << 20}; bool quiet = false; };
//   DemoFlags d;
//   Flags flags("demo", "Does a demo.");
//   flags.Add("workers", &d.workers, "number of workers");
//   ...
//   RETURN_IF_ERROR(flags.Parse(args, &help));  // then d.workers holds --workers
//
// The bound variables must outlive the Flags (and stay where they are: Flags keeps pointers).
// Range checks stay with the command that knows the range and says it in its own words; the
// parser refuses only what its kind cannot hold (a malformed or out-of-64-bit-range whole
// number, a non-finite number, a malformed size). Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "switchml/status.h"

namespace switchml::tools {

// A count given as a plain number or with a binary suffix K, M, G (x 2^10, 2^20, 2^30), e.g.
// 64M: the kind of a size flag.
struct Size {
  uint64_t value = 0;
};

class Flags {
 public:
  // --help's first line is "usage: PROGRAM COMMAND [flags]" (a program of its own: program "").
  Flags(std::string command, std::string summary, std::string program = "switchml")
      : command_(std::move(command)), summary_(std::move(summary)), program_(std::move(program)) {}

  // Declares --`name`, bound to *bound (whose current value is the default). The kind follows
  // the type: a string, a whole number (int64_t: the commands check their ranges before they
  // narrow), a finite number, a switch (bool: false unless given; "--name" or "--name=true"
  // sets it) or a Size. Each name once (a second declaration aborts: a programming error).
  void Add(const std::string& name, std::string* bound, std::string help);
  void Add(const std::string& name, int64_t* bound, std::string help);
  void Add(const std::string& name, double* bound, std::string help);
  void Add(const std::string& name, bool* bound, std::string help);
  void Add(const std::string& name, Size* bound, std::string help);

  // Parses args (without the program and command names) into the bound variables.
  // help_requested is set on --help (or -h), which ends the parse.
  Status Parse(const std::vector<std::string>& args, bool* help_requested);
  std::string Usage() const;

  // Whether Parse has been given the flag bound to `bound` (for flags whose presence matters
  // beyond their value). `bound` must be a variable given to Add (else a programming error:
  // aborts).
  bool WasSet(const void* bound) const;

 private:
  using Bound = std::variant<std::string*, int64_t*, double*, bool*, Size*>;
  struct Flag {
    Bound bound;
    std::string help;
    std::string def;  // the default as --help shows it
    bool set = false;
  };
  void Declare(const std::string& name, Bound bound, std::string def, std::string help);
  // How the command is run: "PROGRAM COMMAND" (COMMAND for a program of its own).
  std::string Invocation() const;
  // Parses `value` into f's variable; an error names --`name`.
  static Status Assign(const std::string& name, const std::string& value, Flag* f);

  std::string command_, summary_, program_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
};

// Parses "64", "64K", "3M", "1G" (binary multiples). False on anything else.
bool ParseSize(const std::string& text, uint64_t* out);

// Whether a command can later write the output file `path` named by --`flag` (an existing
// writable file, or a new one in an existing writable directory; "-" is stdout where
// allow_stdout): checked before the work starts, so that a typo does not cost the whole run.
// Creates nothing. kInvalidArgument naming the flag and what is wrong otherwise.
Status CheckOutputPath(const std::string& flag, const std::string& path, bool allow_stdout);

}  // namespace switchml::tools
