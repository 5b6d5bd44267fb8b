// The allocation log (design.md §11): RMM's CSV columns, one row per allocation and free, and
// one file per allocator when ARCPOOL_LOG names the path. On both drivers.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "observe/allocation_log.hpp"
#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

std::vector<std::string> fields_of(const std::string& row) {
  std::vector<std::string> fields;
  std::stringstream in(row);
  for (std::string field; std::getline(in, field, ',');)
    fields.push_back(field);
  return fields;
}

/// Expects `lines` to be the header, then an allocate row and a free row of `bytes` at `p`, on
/// `stream`.
void expect_allocate_then_free(const std::vector<std::string>& lines, void* p, size_t bytes,
                               arcpool_stream_t stream) {
  ASSERT_EQ(3u, lines.size());
  EXPECT_EQ("Thread,Time,Action,Pointer,Size,Stream", lines[0]);
  char pointer[32] = "0x0";  // a null pointer (a zero-byte allocation): see below
  if (p != nullptr) std::snprintf(pointer, sizeof pointer, "%p", p);
  char stream_column[32];
  std::snprintf(stream_column, sizeof stream_column, "%lx",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(stream)));
  const char* actions[] = {"allocate", "free"};
  for (int i = 0; i < 2; ++i) {
    const std::vector<std::string> row = fields_of(lines[1 + i]);
    ASSERT_EQ(6u, row.size()) << lines[1 + i];
    EXPECT_EQ(actions[i], row[2]);
    EXPECT_EQ(pointer, row[3]);
    // RMM's replay parser (benchmarks/utilities/log_parser.hpp) reads the pointer with
    // std::stoll(s, nullptr, 16), which throws on anything else.
    EXPECT_NO_THROW(std::stoll(row[3], nullptr, 16)) << row[3];
    EXPECT_EQ(std::to_string(bytes), row[4]);
    EXPECT_EQ(stream_column, row[5]);
  }
}

/// A fresh directory, removed with the test.
class scratch_dir {
 public:
  scratch_dir() {
    std::string pattern = (fs::temp_directory_path() / "arcpool-log-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~scratch_dir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

class AllocationLog : public DriverTest {
 protected:
  /// Logs one allocation of `bytes` on `s` and its free there to `file`, then closes the log;
  /// returns the allocation's data pointer.
  void* log_allocate_and_free(const fs::path& file, size_t bytes, arcpool_stream_t s) {
    EXPECT_OK(arcpool_allocator_log_open(alloc_, file.c_str()));
    arcpool_allocation_t* a = allocate(bytes, s);
    void* p = data(a);
    EXPECT_OK(arcpool_deallocate_async(a, s, 0));
    arcpool_allocation_release(a);
    EXPECT_OK(arcpool_allocator_log_close(alloc_));
    return p;
  }
};

TEST_P(AllocationLog, EveryAllocationAndFreeIsOneRowInRmmsColumns) {
  scratch_dir dir;
  const fs::path file = dir.path() / "trace.csv";
  arcpool_stream_t s = make_stream();
  void* p = log_allocate_and_free(file, 12345, s);
  arcpool_allocation_t* unlogged = allocate(64, s);  // after the close: not in the file
  arcpool_allocation_release(unlogged);

  expect_allocate_then_free(lines_of(file), p, 12345, s);
}

// A zero-byte allocation's null pointer is written as 0x0, which RMM's parser reads (as RMM's
// fmt-era writer wrote nullptr). It was "(nil)", glibc's %p of a null pointer, on which RMM's
// parser throws.
TEST_P(AllocationLog, AZeroByteAllocationsNullPointerIsWrittenSoRmmsParserReadsIt) {
  scratch_dir dir;
  const fs::path file = dir.path() / "trace.csv";
  arcpool_stream_t s = make_stream();
  ASSERT_EQ(nullptr, log_allocate_and_free(file, 0, s));
  expect_allocate_then_free(lines_of(file), nullptr, 0, s);
}

// An export hands the memory to the caller: it leaves arcpool as at a free, so the log has its
// free row (before, none: a replay or a plot of the log kept the allocation live for ever).
TEST_P(AllocationLog, AnExportIsTheAllocationsFreeRow) {
  scratch_dir dir;
  const fs::path file = dir.path() / "trace.csv";
  ASSERT_OK(arcpool_allocator_log_open(alloc_, file.c_str()));
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* a = allocate(4096, s);
  void* p = nullptr;
  ASSERT_OK(arcpool_allocation_export(a, &p));
  arcpool_allocation_release(a);
  ASSERT_OK(arcpool_allocator_log_close(alloc_));
  free_exported(p, 4096, s);

  expect_allocate_then_free(lines_of(file), p, 4096, s);  // the free on the current stream
}

TEST_P(AllocationLog, TheEnvironmentGivesEveryAllocatorItsOwnFile) {
  scratch_dir dir;
  const fs::path file = dir.path() / "trace.csv";
  ASSERT_EQ(0, setenv("ARCPOOL_LOG", file.c_str(), 1));
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = GetParam();
  arcpool_allocator_t* first = nullptr;
  arcpool_allocator_t* second = nullptr;
  const arcpool_status_t created_first = arcpool_allocator_create(&options, &first);
  const arcpool_status_t created_second = arcpool_allocator_create(&options, &second);
  unsetenv("ARCPOOL_LOG");
  ASSERT_OK(created_first);
  ASSERT_OK(created_second);
  for (arcpool_allocator_t* a : {first, second}) {
    arcpool_allocation_t* h = nullptr;
    ASSERT_OK(arcpool_allocate_async(a, 4096, 0, nullptr, 0, &h));
    EXPECT_OK(arcpool_deallocate_async(h, nullptr, 0));
    arcpool_allocation_release(h);
    EXPECT_OK(arcpool_stream_synchronize(a, nullptr));
    arcpool_allocator_destroy(a);
  }
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir.path())) {
    names.insert(entry.path().filename().string());
    const std::vector<std::string> lines = lines_of(entry.path());
    ASSERT_EQ(3u, lines.size()) << entry.path() << ": a header, one allocation, one free";
    EXPECT_EQ("allocate", fields_of(lines[1])[2]);
    EXPECT_EQ("free", fields_of(lines[2])[2]);
  }
  EXPECT_EQ(2u, names.size()) << "two allocators, two files";
}

TEST(AllocationLogPath, LaterAllocatorsNumberTheirFilesBeforeTheExtension) {
  EXPECT_EQ("out/trace.csv", detail::numbered_log_path("out/trace.csv", 0));
  EXPECT_EQ("out/trace.1.csv", detail::numbered_log_path("out/trace.csv", 1));
  EXPECT_EQ("out/trace.12.csv", detail::numbered_log_path("out/trace.csv", 12));
  EXPECT_EQ("run.d/trace.2", detail::numbered_log_path("run.d/trace", 2));
  EXPECT_EQ("run.d/.hidden.3", detail::numbered_log_path("run.d/.hidden", 3));
  EXPECT_EQ("trace.3.csv", detail::numbered_log_path("trace.csv", 3));
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(AllocationLog);

}  // namespace
}  // namespace arcpool::test
