// ChunkPrefetch: reads and checks a direct version's part chunks ahead of
// the receiver's stepping thread (docs/protocol.md, "Parallel apply").
//
// Once a direct version's manifest is stored, every chunk's key is known
// (the ranks' part objects), so background threads fetch the objects of
// the next chunks in manifest order and run CheckChunk on them (envelope,
// SHA-256 against the manifest, the chunk's own checksum and fields) while
// the stepping thread classifies and hands earlier chunks to the apply
// workers. Only chunks stored at their own key are read ahead (a rank
// whose part is packed is left to the ChunkObjectReader, which reads each
// pack once), and only successes are handed over: a chunk that could not
// be read or fails a check is read again by the stepping thread, whose
// errors, bad-read bookkeeping and retries are then exactly those of a
// receiver without read-ahead.
//
// Holds at most `window` chunks or `max_bytes` of objects that the
// stepping thread has not taken (whichever comes first, one chunk at
// least). Borrows the store, announcement and manifest, which must outlive
// it and not change; the destructor stops and joins its threads. Take is
// called from one thread, in ascending chunk order.
#ifndef REFIT_SYNC_CHUNK_PREFETCH_H_
#define REFIT_SYNC_CHUNK_PREFETCH_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "delta/chunk.h"
#include "refit/store.h"
#include "sync/auth.h"
#include "sync/protocol.h"

namespace refit::internal {

class ChunkPrefetch {
 public:
  struct Checked {
    std::vector<uint8_t> object;   // the sealed object
    ParsedChunk chunk;             // points into `object`
    std::span<const uint8_t> bytes;  // the whole chunk, inside `object`
  };

  // Reads ahead from chunk `from`, except the chunks `skip` marks (read
  // before the manifest: EarlyParts::Held).
  ChunkPrefetch(ObjectStore* store, const Announcement& a, const Manifest& m,
                const Authenticator& auth, uint64_t from, int threads,
                const std::vector<bool>& skip = {}, size_t window = 64,
                uint64_t max_bytes = uint64_t{256} << 20);
  ~ChunkPrefetch();
  ChunkPrefetch(const ChunkPrefetch&) = delete;
  ChunkPrefetch& operator=(const ChunkPrefetch&) = delete;

  // Chunk i read and checked, waiting for it when it is being read;
  // nullopt when it is not read ahead or failed (the caller reads it).
  std::optional<Checked> Take(uint64_t i);

 private:
  enum class State : uint8_t { kNo, kQueued, kReading, kReady, kFailed };
  void Work();

  ObjectStore* store_;
  const Announcement& a_;
  const Manifest& m_;
  const Authenticator auth_;
  const size_t window_;
  const uint64_t max_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;  // per chunk of the manifest
  std::vector<std::optional<Checked>> ready_;
  uint64_t next_ = 0;     // the next chunk a worker may claim
  uint64_t taken_ = 0;    // chunks below this were taken (or passed)
  uint64_t held_bytes_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace refit::internal

#endif  // REFIT_SYNC_CHUNK_PREFETCH_H_
