// Reads the pickles arcpool writes (protocol 2: dicts with string keys, lists, pairs, strings,
// integers, booleans), so that C++ tests can check a memory snapshot's contents. Python's own
// pickle module checks the format in tests/python/test_snapshot.py.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace arcpool::test {

/// One unpickled value.
struct pickled {
  enum class kind { integer, string, boolean, list, tuple, dict };
  kind type = kind::integer;
  uint64_t number = 0;  ///< integer (the low 64 bits), boolean (0 or 1)
  std::string text;
  std::vector<pickled> items;                           ///< list, tuple
  std::vector<std::pair<std::string, pickled>> fields;  ///< dict, in the written order

  /// A dict's field; throws std::runtime_error when absent or not a dict.
  const pickled& operator[](const std::string& key) const;
  /// True when a dict has the field.
  bool has(const std::string& key) const;
};

/// Parses `bytes`; throws std::runtime_error on an opcode outside the subset or a bad stream.
pickled parse_pickle(const std::string& bytes);

}  // namespace arcpool::test
