#include "observe/pickle_writer.hpp"

#include <cstring>
#include <utility>

namespace arcpool::detail {
namespace {

// The opcodes of pickle protocol 2 used here (CPython's Lib/pickletools.py documents each).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kTuple2 = '\x86';
constexpr char kBinUnicode = 'X';  // 4-byte little-endian length, then UTF-8
constexpr char kBinInt = 'J';      // 4-byte little-endian signed
constexpr char kLong1 = '\x8a';    // 1-byte length, then little-endian two's complement
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';

void put_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

pickle_writer::pickle_writer() {
  out_.push_back(kProto);
  out_.push_back('\x02');
}

void pickle_writer::begin_dict() {
  out_.push_back(kEmptyDict);
  out_.push_back(kMark);
}

void pickle_writer::end_dict() {
  out_.push_back(kSetItems);
}

void pickle_writer::begin_list() {
  out_.push_back(kEmptyList);
  out_.push_back(kMark);
}

void pickle_writer::end_list() {
  out_.push_back(kAppends);
}

void pickle_writer::pair(int64_t first, int64_t second) {
  integer(first);
  integer(second);
  out_.push_back(kTuple2);
}

void pickle_writer::string(const char* text) {
  const size_t n = std::strlen(text);
  out_.push_back(kBinUnicode);
  put_le32(out_, static_cast<uint32_t>(n));
  out_.append(text, n);
}

void pickle_writer::integer(int64_t value) {
  if (value >= INT32_MIN && value <= INT32_MAX) {
    out_.push_back(kBinInt);
    put_le32(out_, static_cast<uint32_t>(static_cast<int32_t>(value)));
    return;
  }
  // Eight bytes of two's complement hold every int64_t.
  out_.push_back(kLong1);
  out_.push_back('\x08');
  const auto bits = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i)
    out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void pickle_writer::unsigned_integer(uint64_t value) {
  if (value <= static_cast<uint64_t>(INT64_MAX)) {
    integer(static_cast<int64_t>(value));
    return;
  }
  // Nine bytes: the value's eight, then a zero byte that keeps the sign positive.
  out_.push_back(kLong1);
  out_.push_back('\x09');
  for (int i = 0; i < 8; ++i)
    out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  out_.push_back('\0');
}

void pickle_writer::boolean(bool value) {
  out_.push_back(value ? kNewTrue : kNewFalse);
}

std::string pickle_writer::finish() {
  out_.push_back(kStop);
  return std::move(out_);
}

}  // namespace arcpool::detail
