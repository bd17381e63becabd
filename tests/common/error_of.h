// The fsdp::Error a call throws, for tests that assert its kind and text.
#pragma once

#include <gtest/gtest.h>

#include <functional>

#include "fsdp/common/check.h"

namespace fsdp_test {

/// The fsdp::Error fn throws (a copy); adds a test failure and returns a kState placeholder when
/// fn throws none. Another exception type propagates.
inline fsdp::Error error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fsdp::Error& e) {
    return e;
  }
  ADD_FAILURE() << "no fsdp::Error thrown";
  return fsdp::Error(fsdp::ErrorKind::kState, {}, "none");
}

}  // namespace fsdp_test
