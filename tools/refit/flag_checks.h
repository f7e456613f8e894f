// CLI11 checks for the tool's numeric flags, whose failure messages name a
// range a person can read ("--threads: -1 is not a whole number in
// 0..1024"). CLI11's own NonNegativeNumber and PositiveNumber bound values
// by the largest double and print it, 309 digits long; and an unsigned
// flag given "-1" would otherwise wrap to 2^64 - 1 unchecked.
#ifndef REFIT_TOOLS_REFIT_FLAG_CHECKS_H_
#define REFIT_TOOLS_REFIT_FLAG_CHECKS_H_

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>

namespace refit::cli {

// The most worker threads a -j/--threads flag takes (0 = all cores).
inline constexpr int64_t kMaxThreads = 1024;

// A whole number in [lo, hi].
inline CLI::Validator IntIn(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& input) -> std::string {
        int64_t value = 0;
        const char* end = input.data() + input.size();
        auto [ptr, ec] = std::from_chars(input.data(), end, value);
        if (ec == std::errc() && ptr == end && value >= lo && value <= hi) {
          return "";
        }
        return fmt::format("{} is not a whole number in {}..{}", input, lo,
                           hi);
      },
      fmt::format("{}..{}", lo, hi));
}

// A whole number >= 0 that fits 64 bits (versions, seeds).
inline CLI::Validator Unsigned() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        uint64_t value = 0;
        const char* end = input.data() + input.size();
        auto [ptr, ec] = std::from_chars(input.data(), end, value);
        if (ec == std::errc() && ptr == end) return "";
        return fmt::format("{} is not a whole number >= 0", input);
      },
      ">=0");
}

// A number in (lo, hi].
inline CLI::Validator NumberAbove(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& input) -> std::string {
        double value = 0;
        const char* end = input.data() + input.size();
        auto [ptr, ec] = std::from_chars(input.data(), end, value);
        if (ec == std::errc() && ptr == end && value > lo && value <= hi) {
          return "";
        }
        return fmt::format("{} is not a number in ({:g}, {:g}]", input, lo,
                           hi);
      },
      fmt::format("({:g}..{:g}]", lo, hi));
}

// A number in [lo, hi].
inline CLI::Validator NumberIn(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& input) -> std::string {
        double value = 0;
        const char* end = input.data() + input.size();
        auto [ptr, ec] = std::from_chars(input.data(), end, value);
        if (ec == std::errc() && ptr == end && value >= lo && value <= hi) {
          return "";
        }
        return fmt::format("{} is not a number in [{:g}, {:g}]", input, lo, hi);
      },
      fmt::format("[{:g}..{:g}]", lo, hi));
}

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_FLAG_CHECKS_H_
