// libFuzzer target for the offload protocol's parsers: the frame decoder
// (unkeyed and keyed, fed in arbitrary chunks) and every message decoder.
// The only acceptable failure is dlop::Error; anything else (another
// exception, a crash, a sanitizer report, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.hpp"
#include "offload/protocol.hpp"
#include "offload/protocol_messages.hpp"

using namespace dlop::offload::protocol;

namespace {

void drain(FrameDecoder& d) {
  while (auto f = d.next()) decode_any(f->type, f->payload);
}

// Feeds `data` to a decoder in chunks whose sizes come from the data itself,
// so that frames split at every offset are tried.
void feed_chunked(FrameDecoder& d, std::span<const std::uint8_t> data, std::uint8_t step) {
  const std::size_t chunk = static_cast<std::size_t>(step % 61) + 1;
  for (std::size_t off = 0; off < data.size(); off += chunk) {
    d.feed(data.subspan(off, std::min(chunk, data.size() - off)));
    drain(d);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  if (size < 3) return 0;
  const std::span<const std::uint8_t> data(bytes + 3, size - 3);
  try {
    switch (bytes[0] % 4) {
      case 0: {  // raw bytes on a fresh connection
        FrameDecoder d;
        feed_chunked(d, data, bytes[1]);
        break;
      }
      case 1: {  // raw bytes after authentication
        FrameDecoder d;
        Key key{};
        key[0] = 1;
        d.set_key(key);
        feed_chunked(d, data, bytes[1]);
        break;
      }
      case 2: {  // a message parser on its own
        decode_any(MsgType{static_cast<std::uint16_t>(bytes[1] % (kMaxMsgType + 1))}, data);
        break;
      }
      default: {  // a well-sealed frame around arbitrary payload: reaches the message parsers through the decoder
        FrameWriter w;
        FrameDecoder d(kMaxPayload);
        const auto type = MsgType{static_cast<std::uint16_t>(bytes[1] % kMaxMsgType + 1)};
        const auto frame = w.encode(type, data);
        feed_chunked(d, frame, bytes[2]);
        break;
      }
    }
  } catch (const dlop::Error&) {
  }
  return 0;
}
