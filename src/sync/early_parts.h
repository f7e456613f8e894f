// EarlyParts: reads a direct version's part chunks while its trainer ranks
// are still uploading them, before the manifest names them
// (docs/protocol.md, "Versions from many ranks", 4).
//
// A direct version is announced as soon as its coordinator finds any
// object of the ranks' parts stored, and its manifest is stored only once
// every rank's part list is in. Until then a receiver knows no chunk's manifest entry, but
// the store holds the chunk objects the ranks have stored: Scan() lists
// parts/<V>/ and queues every chunk object it has not queued before, and
// background threads read each one, open its envelope, parse it, check it
// against the announcement (CheckParsedChunk with before_manifest) and
// compute its SHA-256. A pack is split into its chunks (the pack stored at
// the rank's part chunk k holds chunks k, k + 1, ...).
//
// Nothing read here is applied before the manifest. Once it is read,
// Take(m, i) hands over chunk i when an object read early has the size and
// SHA-256 of manifest entry i and its header matches the entry
// (MatchesEntry: CheckParsedChunk again, with the manifest). Everything
// else (an object the manifest does not list, one that failed a check or
// could not be read, one beyond the byte bound) is dropped, and the caller
// reads those chunks after the manifest with the checks, retries and
// errors it always has: reading early changes what is read when, never
// what is accepted. A two-phase receiver, which writes nothing when it
// stages, takes the chunks before the manifest instead (TakeReady), stages
// them, and matches them to the manifest when it is read.
//
// Holds at most `max_bytes` of objects read (or being read); the store's
// objects beyond that are not queued and are read after the manifest.
// Borrows the store and the announcement, which must outlive it; the
// destructor stops and joins its threads. Scan, Take, TakeReady and Held
// are called from one thread.
#ifndef REFIT_SYNC_EARLY_PARTS_H_
#define REFIT_SYNC_EARLY_PARTS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "base/hash.h"
#include "refit/store.h"
#include "sync/auth.h"
#include "sync/chunk_prefetch.h"
#include "sync/protocol.h"

namespace refit::internal {

class EarlyParts {
 public:
  using Checked = ChunkPrefetch::Checked;

  EarlyParts(ObjectStore* store, const Announcement& a, const Authenticator& auth,
             int threads, uint64_t max_bytes);
  ~EarlyParts();
  EarlyParts(const EarlyParts&) = delete;
  EarlyParts& operator=(const EarlyParts&) = delete;

  // Lists the version's part chunk objects and queues those not queued
  // before, while the byte bound allows; how many it queued. A listing
  // returns every object stored so far, so a call within four times the
  // last listing's duration of it lists nothing (returns 0): listing takes
  // at most a fifth of a caller that scans on every store change. The
  // store's List errors as they are.
  Result<size_t> Scan();

  // Objects queued so far (read, being read or waiting).
  uint64_t queued() const;

  // With the manifest read: chunk i, read early and matching entry i as
  // above, waiting while the object holding it is being read; nullopt
  // otherwise (the caller reads it). Each chunk is handed over once.
  std::optional<Checked> Take(const Manifest& m, uint64_t i);

  // Per manifest chunk: whether Take(m, i) may hand it over (its object
  // was queued here), so that a read-ahead after the manifest skips it.
  std::vector<bool> Held(const Manifest& m) const;

  // Before the manifest: every chunk read and checked so far, handed over
  // (not to Take any more), each with its rank, part chunk index and
  // SHA-256. A two-phase receiver stages them at once and matches them to
  // the manifest's entries when it is read (MatchesEntry).
  struct Ready {
    uint32_t rank = 0;
    uint64_t k = 0;
    Sha256 sha{};
    Checked chunk;
  };
  std::vector<Ready> TakeReady();

  // Whether a chunk (object `size` bytes with SHA-256 `sha`, header `h`)
  // of `rank`'s part, index k, read before manifest `m`, is its entry i.
  static bool MatchesEntry(const Announcement& a, const Manifest& m, uint64_t i, uint32_t rank,
                           uint64_t k, uint64_t size, const Sha256& sha, const ParsedChunk& c);

 private:
  using Id = std::pair<uint32_t, uint64_t>;  // rank, part chunk index
  enum class State : uint8_t { kQueued, kReading, kDone };
  struct Chunk {
    std::vector<uint8_t> object;
    ParsedChunk chunk;
    std::span<const uint8_t> bytes;
    Sha256 sha;
  };
  // The part chunk object that holds manifest chunk `e` (its pack's first
  // chunk when packed); nullopt for a chunk not in a part.
  static std::optional<Id> ObjectOf(const ManifestChunk& e);
  void Work();
  // Reads the object at `key` (a chunk or a pack of them) and checks
  // each chunk in it; those that pass, by chunk id.
  std::vector<std::pair<Id, Chunk>> Read(Id key) const;

  ObjectStore* store_;
  const Announcement& a_;
  const Authenticator auth_;
  const int threads_;
  const uint64_t max_bytes_;
  std::chrono::steady_clock::time_point next_scan_{};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Id, State> objects_;   // by the key's id: every object queued
  std::deque<Id> queue_;
  std::map<Id, Chunk> chunks_;    // read and checked, not taken
  uint64_t held_bytes_ = 0;       // listed sizes of the objects queued
  bool stop_ = false;
  std::vector<std::thread> workers_;  // started by the first Scan that queues
};

}  // namespace refit::internal

#endif  // REFIT_SYNC_EARLY_PARTS_H_
