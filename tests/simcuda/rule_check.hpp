// Shared by the rule-breaking checks (arcpool_rule_check in tests/simcuda/CMakeLists.txt): a
// status check that prints arcpool's last error, and simcuda's violation report.
#pragma once

#include <arcpool/arcpool.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <vector>

/// Returns 2 from the calling function, naming the call and arcpool's last error, when `call`
/// returns nonzero (an arcpool or CUDA failure).
#define CHECK(call)                                                         \
  do {                                                                      \
    if ((call) != 0) {                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #call, arcpool_last_error()); \
      return 2;                                                             \
    }                                                                       \
  } while (0)

namespace rule_check {

/// simcuda_take_violations (tests/simcuda/simcuda.h): copies simcuda's report into the buffer
/// and clears it; returns how many violations it held. Null (saying why) when not on simcuda.
using take_fn = uint64_t (*)(char*, size_t);
inline take_fn violations() {
  const auto take = reinterpret_cast<take_fn>(dlsym(RTLD_DEFAULT, "simcuda_take_violations"));
  if (take == nullptr) {
    std::fprintf(stderr, "not on simcuda: this check needs simcuda's race checker\n");
  }
  return take;
}

/// Takes simcuda's report now: how many violations, and their text.
inline uint64_t take_report(take_fn take, std::vector<char>* report) {
  report->assign(1 << 16, '\0');
  return take(report->data(), report->size());
}

/// Prints the verdict the ctest checks read: "violations: none<note>" or
/// "violations<note>:" and the report.
inline void print_verdict(uint64_t found, const std::vector<char>& report, const char* note) {
  if (found == 0) {
    std::printf("violations: none%s\n", note);
  } else {
    std::printf("violations%s:\n%s", note, report.data());
  }
}

}  // namespace rule_check
