// libFuzzer target: any input is a program of C API calls (tests/model/harness.cpp), run on the
// deterministic host driver against the reference model and the happens-before checker, under
// ASan and UBSan. A disagreement aborts with the failing operation and the ones before it.
//
//   cmake --workflow --preset fuzz
//   ./build-fuzz/fuzz/arcpool_fuzz fuzz/corpus -max_total_time=60      (CI runs this)
//   ./build-fuzz/fuzz/arcpool_fuzz fuzz/corpus -max_total_time=3600 -jobs=2   (a longer run)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string failure = arcpool::model::run_harness(data, size);
  if (!failure.empty()) {
    std::fprintf(stderr, "arcpool model violation:\n%s", failure.c_str());
    std::abort();
  }
  return 0;
}
