// The payloads of the messages protocol version 4 changed (CONFIGURE gained
// piece_bytes, appended); every other message is as version 3 recorded it
// (protocol_v3_golden.hpp). Hex; test data: never regenerate these from newer
// code.
#pragma once

#include <string_view>
#include <utility>

namespace dlop::offload::protocol {

inline constexpr std::pair<std::string_view, std::string_view> kProtocolV4Changed[] = {
    {"configure_direct",
     "05000000010203040510000000686f73742d612f626f6f742d313233340b0000002f646174612f747261696e0b000000"
     "7b226f7073223a205b5d7d00000000efcdab89674523014000000092100000efbe0000ff7f00000000040000000000"},
    {"configure_python",
     "010000000906000000686f73742d62000000000000000003000000800495070000000000000001000000000000000000"
     "0000000000000000000000000000"},
};

}  // namespace dlop::offload::protocol
