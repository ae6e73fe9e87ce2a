#include "flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/check.h"
#include "base/status_macros.h"

namespace switchml::tools {

bool ParseSize(const std::string& text, uint64_t* out) {
  if (text.empty()) return false;
  size_t pos = 0;
  uint64_t v = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(text[pos] - '0');
    ++pos;
  }
  if (pos == 0) return false;
  int shift = 0;
  if (pos < text.size()) {
    if (pos + 1 != text.size()) return false;
    switch (text[pos]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      default:
        return false;
    }
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

Status CheckOutputPath(const std::string& flag, const std::string& path, bool allow_stdout) {
  if (path == "-" && allow_stdout) return Status();
  const std::string what = "--" + flag + " " + path + ": ";
  if (path.empty() || path.back() == '/') {
    return InvalidArgumentError(what + "give a file name");
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return InvalidArgumentError(what + "is a directory, not a file");
    if (access(path.c_str(), W_OK) != 0) {
      return InvalidArgumentError(what + "cannot be written: " + std::strerror(errno));
    }
    return Status();
  }
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(what + "there is no directory " + dir);
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return InvalidArgumentError(what + "cannot create a file in " + dir + ": " +
                                std::strerror(errno));
  }
  return Status();
}

void Flags::Declare(const std::string& name, Bound bound, std::string def, std::string help) {
  CHECK(flags_.count(name) == 0) << name;
  order_.push_back(name);
  flags_[name] = Flag{bound, std::move(help), std::move(def)};
}

void Flags::Add(const std::string& name, std::string* bound, std::string help) {
  Declare(name, bound, *bound, std::move(help));
}
void Flags::Add(const std::string& name, int64_t* bound, std::string help) {
  Declare(name, bound, std::to_string(*bound), std::move(help));
}
void Flags::Add(const std::string& name, double* bound, std::string help) {
  std::ostringstream s;
  s << *bound;
  Declare(name, bound, s.str(), std::move(help));
}
void Flags::Add(const std::string& name, bool* bound, std::string help) {
  CHECK(!*bound) << "--" << name << ": a switch is off unless given";
  Declare(name, bound, "false", std::move(help));
}
void Flags::Add(const std::string& name, Size* bound, std::string help) {
  Declare(name, bound, std::to_string(bound->value), std::move(help));
}

Status Flags::Assign(const std::string& name, const std::string& value, Flag* f) {
  char* end = nullptr;
  if (auto* s = std::get_if<std::string*>(&f->bound)) {
    **s = value;
  } else if (auto* i = std::get_if<int64_t*>(&f->bound)) {
    errno = 0;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0') {
      return InvalidArgumentError("--" + name + " wants a whole number, not '" + value + "'");
    }
    if (errno == ERANGE) {  // strtoll clamps: the flag would read as another number
      return InvalidArgumentError("--" + name + " " + value + " is out of range");
    }
    **i = v;
  } else if (auto* d = std::get_if<double*>(&f->bound)) {
    errno = 0;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0') {
      return InvalidArgumentError("--" + name + " wants a number, not '" + value + "'");
    }
    // strtod also takes nan, inf and overflows to inf: no flag means any of them.
    if (!std::isfinite(v) || (errno == ERANGE && std::fabs(v) > 1)) {
      return InvalidArgumentError("--" + name + " wants a finite number, not '" + value + "'");
    }
    **d = v;
  } else if (auto* z = std::get_if<Size*>(&f->bound)) {
    if (!ParseSize(value, &(*z)->value)) {
      return InvalidArgumentError("--" + name + " wants a count like 1000, 64K, 64M or 1G, not '" +
                                  value + "'");
    }
  }
  f->set = true;
  return Status();
}

Status Flags::Parse(const std::vector<std::string>& args, bool* help_requested) {
  *help_requested = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      *help_requested = true;
      return Status();
    }
    if (arg.rfind("--", 0) != 0) {
      return InvalidArgumentError("unexpected argument '" + arg + "' (flags start with --; see " +
                                  Invocation() + " --help)");
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return InvalidArgumentError("unknown flag --" + name + " (see " + Invocation() + " --help)");
    }
    Flag& f = it->second;
    if (auto* b = std::get_if<bool*>(&f.bound)) {
      if (has_value && value != "true" && value != "false") {
        return InvalidArgumentError("--" + name + " takes no value (or =true/=false)");
      }
      **b = !has_value || value == "true";
      f.set = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return InvalidArgumentError("--" + name + " needs a value");
      value = args[++i];
    }
    RETURN_IF_ERROR(Assign(name, value, &f));
  }
  return Status();
}

std::string Flags::Invocation() const {
  return program_.empty() ? command_ : program_ + " " + command_;
}

std::string Flags::Usage() const {
  std::ostringstream s;
  s << "usage: " << Invocation() << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    const bool is_switch = std::holds_alternative<bool*>(f.bound);
    std::string left = "  --" + name;
    if (!is_switch) {
      left += std::holds_alternative<std::string*>(f.bound) ? " S" : " N";
    }
    s << left;
    if (left.size() < 26)
      s << std::string(26 - left.size(), ' ');
    else
      s << "\n" << std::string(26, ' ');
    s << f.help;
    if (!is_switch && !f.def.empty()) s << " (default " << f.def << ")";
    s << "\n";
  }
  s << "  --help                  this text\n";
  return s.str();
}

bool Flags::WasSet(const void* bound) const {
  for (const auto& [name, f] : flags_) {
    if (std::visit([bound](auto* p) { return static_cast<const void*>(p) == bound; }, f.bound)) {
      return f.set;
    }
  }
  CHECK(false) << "WasSet: no flag is bound to this variable";
  return false;
}

}  // namespace switchml::tools
