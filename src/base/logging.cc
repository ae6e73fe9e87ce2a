#include "base/logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace switchml {
namespace {

std::mutex& SinkMutex() {
  static std::mutex m;
  return m;
}
LogSink& Sink() {
  static LogSink sink;
  return sink;
}
std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LogLevel::kWarning)};
  return level;
}

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "?";
}

const char* SubsystemName(LogSubsystem s) {
  switch (s) {
    case LogSubsystem::kGeneral:
      return "general";
    case LogSubsystem::kControl:
      return "control";
    case LogSubsystem::kDataplane:
      return "dataplane";
    case LogSubsystem::kWorker:
      return "worker";
    case LogSubsystem::kTransport:
      return "transport";
    case LogSubsystem::kRuntime:
      return "runtime";
  }
  return "?";
}

}  // namespace

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(Level().load()); }

bool ParseLogLevel(const std::string& text, LogLevel* out) {
  for (LogLevel l :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError, LogLevel::kOff}) {
    if (text == LevelName(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

namespace internal {
void EmitLog(LogLevel level, LogSubsystem subsystem, const std::string& message) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(level, subsystem, message);
    return;
  }
  std::fprintf(stderr, "switchml [%s/%s] %s\n", LevelName(level), SubsystemName(subsystem),
               message.c_str());
}
}  // namespace internal

}  // namespace switchml
