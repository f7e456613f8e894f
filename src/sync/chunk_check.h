// Whether a version's objects may be used: a chunk, or an overwrite
// re-send of one, against its announcement and (once seen) its manifest;
// a manifest against its announcement (docs/protocol.md, "Versions and
// objects", "Receiver" step 2, "Catch-up by folding" steps 1 and 3). One
// set of checks serves a version applied as it lands, its re-sends, and
// the versions of a fold.
//
// Pure functions of their arguments (CheckChunk opens the envelope with
// the given Authenticator); thread-safe.
#ifndef REFIT_SYNC_CHUNK_CHECK_H_
#define REFIT_SYNC_CHUNK_CHECK_H_

#include <cstdint>
#include <span>
#include <vector>

#include "delta/chunk.h"
#include "refit/status.h"
#include "sync/auth.h"
#include "sync/protocol.h"

namespace refit::internal {

// A status from fetching and checking a chunk that says the chunk fails
// its checks (DATA_LOSS, UNAUTHENTICATED), as opposed to one that could
// not be read (NOT_FOUND, UNAVAILABLE, ...).
bool FailsItsChecks(const Status& s);

// x and y describe the same tensor: name, dtype, width and shape (not
// hashes).
bool SameTensor(const TensorEntry& x, const TensorEntry& y);

// [start, start + count), count > 0, lies inside tensor `tensor` of
// `tensors`.
bool RangeInside(const std::vector<TensorEntry>& tensors, uint64_t tensor, uint64_t start,
                 uint64_t count);

// The manifest carries its announcement's base, members and tensor table
// (SameTensor and the "before" hashes, in order). Its version and chunk
// list are the caller's to check.
bool ManifestMatches(const Announcement& a, const Manifest& m);

// What a chunk object must be.
struct ChunkSpec {
  const Announcement* version = nullptr;  // required
  uint64_t index = 0;                     // the chunk's index in the version
  // The version's manifest once seen; nullptr before (the chunk is then
  // checked against the announcement alone).
  const Manifest* manifest = nullptr;
  // false: the stored chunk object. true: an overwrite re-send of its
  // range (v/<V>/resend/<member>/<i>-a or -b), whose bytes and kind are
  // not the manifest's.
  bool resend = false;
  // A direct version's part chunk read before the manifest (EarlyParts),
  // held until the manifest is read and checked against it again: a
  // strided region is not refused for want of a manifest entry (2).
  bool before_manifest = false;
};

// Opens `object` with `auth`, parses it as a chunk (docs/format.md §3) and
// checks it against `spec`. Returns the chunk, whose payload points into
// `object`; *chunk_bytes (when given) receives the whole chunk's bytes
// there.
//
// Errors: those of Authenticator::Open and ParseChunk as they are, and
// DATA_LOSS naming the chunk ("chunk <i> of version <V>", or "the re-send
// of chunk ...") when:
//   1. a stored chunk's size or SHA-256 is not the manifest's entry
//      <i>'s, or the manifest has no entry <i> (checked before the
//      envelope is opened);
//   2. it is a strided region that the manifest (seen) does not list as
//      one (only versions published by several ranks carry them);
//   3. its range is empty, outside the announced tensors, or of another
//      element width;
//   4. it names another version or base;
//   5. with the manifest seen, its tensor or region (a stored chunk: or
//      its kind) is not entry <i>'s;
//   6. a re-send is not an overwrite (sparse-overwrite or raw).
Result<ParsedChunk> CheckChunk(std::span<const uint8_t> object,
                               const ChunkSpec& spec, const Authenticator& auth,
                               std::span<const uint8_t>* chunk_bytes = nullptr);

// Checks 2-6 above of a chunk already opened and parsed: what CheckChunk
// checks after the envelope, for a chunk checked once before the manifest
// was read and again, with it, after (EarlyParts).
Status CheckParsedChunk(const ParsedChunk& c, const ChunkSpec& spec);

}  // namespace refit::internal

#endif  // REFIT_SYNC_CHUNK_CHECK_H_
