// Logging by level and subsystem with an injectable sink.
//
//   LOG(kInfo, kControl) << "session " << id << " created";
//
// The data path never logs per packet: it reports through counters. The sink is process-wide
// (a logging sink, not protocol state); SetLogSink/SetLogLevel are thread-safe.
#pragma once

#include <functional>
#include <sstream>
#include <string>

namespace switchml {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };
enum class LogSubsystem { kGeneral, kControl, kDataplane, kWorker, kTransport, kRuntime };

using LogSink = std::function<void(LogLevel, LogSubsystem, const std::string&)>;

// Replaces the sink (default: stderr, one line per message with level and subsystem).
void SetLogSink(LogSink sink);
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning", "error", "off".
bool ParseLogLevel(const std::string& text, LogLevel* out);

namespace internal {
void EmitLog(LogLevel level, LogSubsystem subsystem, const std::string& message);

class LogMessage {
 public:
  LogMessage(LogLevel level, LogSubsystem subsystem) : level_(level), subsystem_(subsystem) {}
  ~LogMessage() { EmitLog(level_, subsystem_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  LogSubsystem subsystem_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace switchml

#define LOG(level, subsystem)                                             \
  if (::switchml::LogLevel::level < ::switchml::GetLogLevel()) {          \
  } else                                                                  \
    ::switchml::internal::LogMessage(::switchml::LogLevel::level,         \
                                     ::switchml::LogSubsystem::subsystem) \
        .stream()
