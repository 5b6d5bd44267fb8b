// The model-checked property test: the fuzzer's harness (tests/model/harness.cpp) driven by a
// seeded PRNG, so that it runs under GoogleTest in every build (and under the sanitizers)
// without libFuzzer. Each seed is a random program of C API calls, valid and invalid.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "model/harness.hpp"

namespace arcpool::test {
namespace {

std::vector<uint8_t> program_of(uint64_t seed, size_t length) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(length);
  for (auto& b : bytes)
    b = static_cast<uint8_t>(rng());
  return bytes;
}

TEST(Property, RandomProgramsAgreeWithTheModelAndTheHappensBeforeChecker) {
  const char* env = std::getenv("ARCPOOL_PROPERTY_SEEDS");
  const uint64_t seeds = env != nullptr ? std::strtoull(env, nullptr, 10) : 300;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    const std::vector<uint8_t> program = program_of(seed, 1200);
    const std::string failure = model::run_harness(program.data(), program.size());
    ASSERT_EQ("", failure) << "seed " << seed << " (rerun: ARCPOOL_PROPERTY_SEEDS)";
  }
}

}  // namespace
}  // namespace arcpool::test
