#include "observe/allocation_log.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "support/status.hpp"

namespace arcpool::detail {

std::string numbered_log_path(const std::string& path, unsigned n) {
  if (n == 0) return path;
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const bool has_extension =
      dot != std::string::npos && dot != 0 && (slash == std::string::npos || dot > slash + 1);
  const std::string number = "." + std::to_string(n);
  return has_extension ? path.substr(0, dot) + number + path.substr(dot) : path + number;
}

arcpool_status_t allocation_log::open(const char* path) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "cannot open the allocation log %s: %s", path,
                std::strerror(errno));
  }
  std::fputs("Thread,Time,Action,Pointer,Size,Stream\n", f);
  std::lock_guard<std::mutex> lock(mutex_);
  if (FILE* old = file_.exchange(f)) std::fclose(old);
  return ARCPOOL_STATUS_SUCCESS;
}

void allocation_log::close() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (FILE* old = file_.exchange(nullptr)) std::fclose(old);
}

void allocation_log::write(const char* action, const void* pointer, size_t size,
                           arcpool_stream_t stream) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const long micros = static_cast<long>(
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000);
  std::tm local{};
  localtime_r(&seconds, &local);
  static thread_local const long thread = static_cast<long>(syscall(SYS_gettid));
  std::lock_guard<std::mutex> lock(mutex_);
  FILE* f = file_.load(std::memory_order_relaxed);
  if (f == nullptr) return;
  // The stream as a hexadecimal handle, as RMM writes it. A null pointer (a zero-byte
  // allocation, a failure) as 0x0, as RMM's fmt-era writer wrote nullptr: RMM's replay parser
  // reads the pointer with std::stoll(s, nullptr, 16), which throws on glibc's "(nil)".
  std::fprintf(f, "%ld,%02d:%02d:%02d.%06ld,%s,", thread, local.tm_hour, local.tm_min, local.tm_sec,
               micros, action);
  if (pointer == nullptr) {
    std::fputs("0x0", f);
  } else {
    std::fprintf(f, "%p", pointer);
  }
  std::fprintf(f, ",%zu,%lx\n", size,
               static_cast<unsigned long>(reinterpret_cast<uintptr_t>(stream)));
}

}  // namespace arcpool::detail
