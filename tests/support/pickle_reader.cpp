#include "support/pickle_reader.hpp"

#include <stdexcept>

namespace arcpool::test {

const pickled& pickled::operator[](const std::string& key) const {
  if (type != kind::dict) throw std::runtime_error("pickle: field '" + key + "' of a non-dict");
  for (const auto& [name, value] : fields) {
    if (name == key) return value;
  }
  throw std::runtime_error("pickle: no field '" + key + "'");
}

bool pickled::has(const std::string& key) const {
  if (type != kind::dict) return false;
  for (const auto& field : fields) {
    if (field.first == key) return true;
  }
  return false;
}

pickled parse_pickle(const std::string& bytes) {
  size_t at = 0;
  auto byte = [&]() -> uint8_t {
    if (at >= bytes.size()) throw std::runtime_error("pickle: truncated");
    return static_cast<uint8_t>(bytes[at++]);
  };
  auto le = [&](size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t b = byte();
      if (i < 8) v |= b << (8 * i);
    }
    return v;
  };
  std::vector<pickled> stack;
  std::vector<size_t> marks;
  auto pop_marked = [&]() {
    if (marks.empty()) throw std::runtime_error("pickle: no mark");
    std::vector<pickled> items(stack.begin() + static_cast<std::ptrdiff_t>(marks.back()),
                               stack.end());
    stack.resize(marks.back());
    marks.pop_back();
    if (stack.empty()) throw std::runtime_error("pickle: no container below the mark");
    return items;
  };
  if (byte() != 0x80 || byte() != 2) throw std::runtime_error("pickle: not protocol 2");
  for (;;) {
    const uint8_t op = byte();
    pickled v;
    switch (op) {
      case '.':
        if (stack.size() != 1 || !marks.empty()) throw std::runtime_error("pickle: bad stop");
        return stack.back();
      case '(':
        marks.push_back(stack.size());
        continue;
      case '}':
        v.type = pickled::kind::dict;
        break;
      case ']':
        v.type = pickled::kind::list;
        break;
      case 'u': {
        std::vector<pickled> items = pop_marked();
        if (items.size() % 2 != 0 || stack.back().type != pickled::kind::dict) {
          throw std::runtime_error("pickle: bad SETITEMS");
        }
        for (size_t i = 0; i < items.size(); i += 2) {
          if (items[i].type != pickled::kind::string) throw std::runtime_error("pickle: key");
          stack.back().fields.emplace_back(items[i].text, std::move(items[i + 1]));
        }
        continue;
      }
      case 'e': {
        std::vector<pickled> items = pop_marked();
        if (stack.back().type != pickled::kind::list) throw std::runtime_error("pickle: APPENDS");
        for (pickled& item : items)
          stack.back().items.push_back(std::move(item));
        continue;
      }
      case 0x86:
        if (stack.size() < 2) throw std::runtime_error("pickle: TUPLE2");
        v.type = pickled::kind::tuple;
        v.items.assign(stack.end() - 2, stack.end());
        stack.resize(stack.size() - 2);
        break;
      case 'X': {
        const size_t n = le(4);
        if (at + n > bytes.size()) throw std::runtime_error("pickle: truncated string");
        v.type = pickled::kind::string;
        v.text = bytes.substr(at, n);
        at += n;
        break;
      }
      case 'J':
        v.number = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(le(4))));
        break;
      case 0x8a:
        v.number = le(byte());
        break;
      case 0x88:
      case 0x89:
        v.type = pickled::kind::boolean;
        v.number = op == 0x88;
        break;
      default:
        throw std::runtime_error("pickle: opcode " + std::to_string(op) + " outside the subset");
    }
    stack.push_back(std::move(v));
  }
}

}  // namespace arcpool::test
