// The io model's argument errors, shared by its closed forms (io_model.cpp) and the planning figures
// built on them (planning.cpp): std::invalid_argument "<where>: <rule>".
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace attn::io::detail {

[[noreturn]] inline void fail(const char* where, const std::string& what) {
  throw std::invalid_argument(std::string(where) + ": " + what);
}

inline void require_positive(const char* where, const char* name, std::int64_t v) {
  if (v < 1) fail(where, std::string(name) + " must be >= 1, got " + std::to_string(v));
}

}  // namespace attn::io::detail
