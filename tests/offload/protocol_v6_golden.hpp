// The payloads of the messages protocol version 6 changed (BATCH_READY: the
// daemon's busy fraction after the skipped samples); every other message is
// as versions 5, 4 and 3 recorded it. Hex; test data: never regenerate these
// from newer code.
#pragma once

#include <string_view>
#include <utility>

namespace dlop::offload::protocol {

inline constexpr std::pair<std::string_view, std::string_view> kProtocolV6Changed[] = {
    {"batch_ready",
     "0900000000000000110000000000000002000000100600000000000002000000010000000000000007000000636f7272"
     "7570742c010000000000000e0000007472756e6361746564206a706567000000000000e83f"},
    {"batch_ready_none_skipped", "0a00000000000000120000000000000004000000200c00000000000000000000000000000000f03f"},
};

}  // namespace dlop::offload::protocol
