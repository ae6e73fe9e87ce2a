// A small command-line flag parser for the `switchml` subcommands: "--name value",
// "--name=value" and boolean "--name"; every flag has a default and a help line; --help prints
// the usage. Errors name the flag and say what is expected.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "switchml/status.h"

namespace switchml::tools {

class Flags {
 public:
  Flags(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  void AddString(const std::string& name, std::string def, std::string help);
  void AddInt(const std::string& name, int64_t def, std::string help);
  void AddDouble(const std::string& name, double def, std::string help);
  void AddBool(const std::string& name, std::string help);
  // A size: plain number, or with suffix K, M, G (x 2^10, 2^20, 2^30), e.g. 64M.
  void AddSize(const std::string& name, uint64_t def, std::string help);

  // Parses args (without the program and command names). help_requested is set on --help.
  Status Parse(const std::vector<std::string>& args, bool* help_requested);
  std::string Usage() const;

  std::string GetString(const std::string& name) const;
  int64_t GetInt(const std::string& name) const;
  double GetDouble(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  uint64_t GetSize(const std::string& name) const;
  bool WasSet(const std::string& name) const;
  // A string flag's default (as given to AddString).
  std::string DefaultString(const std::string& name) const;

 private:
  enum class Kind { kString, kInt, kDouble, kBool, kSize };
  struct Flag {
    Kind kind;
    std::string value;
    std::string help;
    std::string def;
    bool set = false;
  };
  void Add(const std::string& name, Kind kind, std::string def, std::string help);
  const Flag& Get(const std::string& name, Kind kind) const;

  std::string command_, summary_;
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
