// Internal to the relay transport: the frame that carries every message on
// a relay link (docs/protocol.md, "Relay tree", "Frames"). Pure functions
// with no I/O, so tests can build valid and corrupt frames byte by byte.
//
//   u32 magic | u8 type | u32 key_len | u64 body_len | key | body | u32 crc
//
// Little-endian. crc is the low 32 bits of XXH3-64 over type..body (every
// byte after the magic and before the crc). Thread-safe (no state).
#ifndef REFIT_TRANSPORT_RELAY_FRAME_H_
#define REFIT_TRANSPORT_RELAY_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit::internal {

inline constexpr uint32_t kRelayMagic = 0x4C524652;  // "RFRL" on the wire
inline constexpr size_t kRelayHeaderBytes = 17;
inline constexpr size_t kRelayTrailerBytes = 4;
inline constexpr uint32_t kRelayMaxKeyBytes = 1024;
// The version a node announces in its hello; a parent refuses others.
inline constexpr uint32_t kRelayProtocolVersion = 1;

enum class RelayFrameType : uint8_t {
  kHello = 1,  // child -> parent, first frame: key = member, body = u32 version
  kPut = 2,    // an object written with Put: replaces an earlier one
  kPutOnce = 3,    // an object written with PutIfAbsent: never replaced
  kHeartbeat = 4,  // empty key and body
};

struct RelayFrameHeader {
  RelayFrameType type = RelayFrameType::kHeartbeat;
  uint32_t key_len = 0;
  uint64_t body_len = 0;
};

// Writes the 17-byte header.
void EncodeRelayHeader(RelayFrameType type, uint32_t key_len, uint64_t body_len,
                       uint8_t out[kRelayHeaderBytes]);

// Parses and checks a header before anything is allocated for the frame:
// magic, a known type, key_len <= kRelayMaxKeyBytes, body_len <= max_body.
// kDataLoss names the first check that failed.
Result<RelayFrameHeader> ParseRelayHeader(const uint8_t in[kRelayHeaderBytes],
                                          uint64_t max_body);

// The frame's crc: low 32 bits of XXH3-64 over header bytes 4..16 (type,
// key_len, body_len), then key, then body.
uint32_t RelayFrameCrc(const uint8_t header[kRelayHeaderBytes],
                       std::string_view key, std::span<const uint8_t> body);

// A whole frame (tests, and small control frames).
std::vector<uint8_t> EncodeRelayFrame(RelayFrameType type, std::string_view key,
                                      std::span<const uint8_t> body);

inline void StoreLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace refit::internal

#endif  // REFIT_TRANSPORT_RELAY_FRAME_H_
