// Bad input gets an std::invalid_argument whose message names the argument (docs/STANDARDS.md): the
// tests' checks of that.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace attn::test {

// The message of the std::invalid_argument that call() throws; "" when it returns.
template <class F>
std::string invalid_argument_message(F&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Expects call() to throw an std::invalid_argument whose message contains `needle`, or, for an empty
// needle (a valid call, as a control), to return.
template <class F>
void expect_invalid_argument(F&& call, const std::string& needle) {
  if (needle.empty()) {
    EXPECT_NO_THROW(call());
    return;
  }
  try {
    call();
    ADD_FAILURE() << "accepted: expected an std::invalid_argument naming " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace attn::test
