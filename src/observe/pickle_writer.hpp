// A writer of Python pickles (protocol 2) for the values a memory snapshot holds: dicts, lists,
// tuples, strings, integers and booleans (design.md §11). Python's pickle.load and PyTorch's
// tools read the result; nothing here reads pickles.
#pragma once

#include <cstdint>
#include <string>

namespace arcpool::detail {

/// Appends one value at a time. A dict or list opens with begin_*, takes its items (a dict:
/// key, value, key, value...) and closes with end_*; containers nest.
class pickle_writer {
 public:
  pickle_writer();

  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();
  /// A tuple of the two integers (PyTorch's segment_pool_id).
  void pair(int64_t first, int64_t second);
  void string(const char* text);
  void integer(int64_t value);
  /// An unsigned integer (addresses and handles): a Python int of the same value.
  void unsigned_integer(uint64_t value);
  void boolean(bool value);

  /// The pickle: every container must be closed.
  std::string finish();

 private:
  std::string out_;
};

}  // namespace arcpool::detail
