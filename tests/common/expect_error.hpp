// The check that a call fails as the user is told it will: a dlop::Error of
// the right code, whose message names the problem.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "core/error.hpp"

namespace dlop::test {

// Runs op; expects a dlop::Error with `code` whose message contains `says`
// (unless empty). `if_none` is the failure when op returns. Returns the
// error, or one with `code` and no message when none was thrown.
template <typename Op>
Error expect_error(Op&& op, Errc code, std::string_view says = {},
                   std::string_view if_none = "no dlop::Error thrown") {
  try {
    op();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    if (!says.empty()) {
      EXPECT_NE(std::string_view(e.what()).find(says), std::string_view::npos) << e.what();
    }
    return e;
  }
  ADD_FAILURE() << if_none;
  return Error(code, "");
}

}  // namespace dlop::test
