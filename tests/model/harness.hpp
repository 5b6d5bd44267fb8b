// Drives random sequences of C API calls — valid and invalid — against arcpool on the
// deterministic host driver and against the reference model, checking every returned status,
// every queried value and, through the happens-before checker, every declared access.
// Shared by the libFuzzer target (fuzz/arcpool_fuzz.cpp) and the property test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace arcpool::model {

/// Runs the operations encoded in `data` (any bytes are a valid program). Returns "" when
/// arcpool and the model agreed throughout and the checker found nothing; otherwise a report
/// naming the failing operation, with the operations that led to it.
std::string run_harness(const uint8_t* data, size_t size);

}  // namespace arcpool::model
