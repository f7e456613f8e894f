// The delta API: diff two versions of a checkpoint into a delta file, apply
// a delta in place, verify a checkpoint against a delta, and inspect one.
//
// Paths name a .safetensors file or a checkpoint directory (a Hugging Face
// sharded checkpoint with model.safetensors.index.json, or a directory with
// one model.safetensors). Tensors are matched by name; both sides must have
// the same names, dtypes and shapes. The format is docs/format.md.
//
// All functions are thread-safe with respect to each other as long as they
// do not write the same files; each may use several threads internally
// (`threads`, 0 = all cores). Errors:
//   kInvalidArgument     malformed arguments or mismatched tensor sets
//   kNotFound            a path does not exist
//   kDataLoss            the delta or a checkpoint is corrupt or truncated
//   kFailedPrecondition  the checkpoint is not the delta's base (nothing is
//                        written), or is partly applied in a way the
//                        at-most-once rule cannot resolve
#ifndef REFIT_DELTA_H_
#define REFIT_DELTA_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit {

// Called from the calling thread as work proceeds: `stage` names the phase
// ("diff", "check", "apply", "verify"), done/total count bytes.
using ProgressFn =
    std::function<void(std::string_view stage, uint64_t done, uint64_t total)>;

// A tensor in host memory, in canonical coordinates. `data` holds
// num_elements * width bytes; refit reads (or, for MutableTensorView,
// writes) it in place and never copies it.
struct TensorView {
  std::string name;
  std::string dtype;  // safetensors dtype string, e.g. "BF16"
  int width = 0;      // bytes per element: 1, 2, 4 or 8
  std::vector<uint64_t> shape;
  const uint8_t* data = nullptr;
};

struct MutableTensorView {
  std::string name;
  std::string dtype;
  int width = 0;
  std::vector<uint64_t> shape;
  uint8_t* data = nullptr;
};

class Checkpoint;

// Views of every tensor of an open checkpoint (in its canonical order),
// pointing into its mapping: valid while `ckpt` is open. The mutable form
// needs a read-write checkpoint.
std::vector<TensorView> CheckpointViews(const Checkpoint& ckpt);
std::vector<MutableTensorView> MutableCheckpointViews(Checkpoint& ckpt);

struct DiffOptions {
  uint64_t version = 1;
  uint64_t base_version = 0;
  // Bytes of a tensor per chunk; a multiple of 64 KiB (docs/format.md §3).
  uint64_t chunk_bytes = 8 << 20;
  int threads = 0;
  // Records per rANS lane; fewer means more parallel lanes for GPU decoders
  // at a few bytes each.
  uint32_t records_per_lane = 1024;
  int zstd_level = 3;
  // false: only overwrite kinds (sparse overwrite, raw), which are
  // idempotent and do not need the base's bits to decode.
  bool allow_xor = true;
  // Also try conditional XOR chunks (docs/format.md §4.3: BF16-width
  // changes coded given the base the receiver holds), where they are
  // smaller. Off by default: decoders of format revisions before kind 5 and
  // GPU receivers do not take them. In a publisher's options it is the
  // opt-in for versions with such chunks (docs/protocol.md, "Conditional
  // XOR chunks"), which CPU receivers apply; a publisher whose baseline is
  // in device memory refuses it.
  bool allow_conditional = false;
  ProgressFn progress;
};

struct DiffReport {
  uint64_t tensors = 0;
  uint64_t changed_tensors = 0;
  uint64_t total_elements = 0;
  uint64_t changed_elements = 0;
  uint64_t full_bytes = 0;      // bytes of all tensors of the target
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;   // entropy-coded payloads (incl. models)
  uint64_t chunk_bytes = 0;     // whole chunks: payloads + framing
  uint64_t file_bytes = 0;      // the delta file: chunks + header + trailer
  std::map<std::string, uint64_t> chunks_by_kind;
  double seconds = 0;
  // Where the CPU encoder's time went, for benchmarks (zero where an
  // encoder does not measure it): the workers' CPU seconds, summed over
  // threads, and the wall seconds of the ordered sink.
  int threads = 0;            // worker threads
  double scan_seconds = 0;    // the pass over base and target: detection,
                              // changed values, segment hashes
  double code_seconds = 0;    // entropy coding and chunk framing
  double sink_seconds = 0;    // the sink taking chunks in order (calling
                              // thread, wall; includes its waits)
};

// Writes the delta that takes `base_path` to `target_path` into `out_path`
// (atomically: a partial file is never left under that name). Chunks are
// written as they are encoded; memory stays bounded by a few chunks per
// thread.
// Note 1: fails with kInvalidArgument, before writing anything, when
// `out_path` names a file of either checkpoint (by any path: compared by
// device and inode, so symbolic and hard links count) or lies inside a
// checkpoint directory; the delta would replace that input.
Result<DiffReport> Diff(const std::string& base_path,
                        const std::string& target_path,
                        const std::string& out_path, const DiffOptions& options);

// The same for tensors in host memory.
Result<DiffReport> DiffTensors(const std::vector<TensorView>& base,
                               const std::vector<TensorView>& target,
                               const std::string& out_path,
                               const DiffOptions& options);

struct ApplyOptions {
  int threads = 0;
  // msync + fsync the touched files before returning; Apply() also makes
  // each journal record durable before the chunk's stores.
  bool sync = true;
  ProgressFn progress;
  // Read before each chunk; once true, the apply stops at a chunk boundary
  // with kCancelled (a signal handler may set it).
  const std::atomic<bool>* cancel = nullptr;
};

struct ApplyReport {
  uint64_t chunks = 0;
  uint64_t chunks_applied = 0;
  uint64_t chunks_skipped = 0;  // already at "after" (applied before)
  // Chunks of an interrupted earlier apply that were restored to the base
  // from its journal before this apply (or rollback) ran.
  uint64_t chunks_restored = 0;
  uint64_t changed_elements = 0;
  uint64_t checkpoint_bytes = 0;
  uint64_t pages_written = 0;   // distinct pages the apply stored into
  uint64_t page_size = 4096;
  double seconds = 0;
  // Safetensors headers (docs/format.md §8), when the delta carries the
  // target's (format version 2, diffed from files) and the checkpoint is on
  // disk: files whose header was rewritten to the target's, files whose
  // header already was the target's, and one "<file>: <why>" note per file
  // left with its own header (the tensors are the target's all the same).
  uint64_t headers_written = 0;
  uint64_t headers_unchanged = 0;
  std::vector<std::string> headers_not_carried;
};

// Applies the delta in place: checks every tensor against the delta's base
// first (nothing is written unless every tensor is the base or already the
// target), applies each chunk at most once, verifies every tensor against
// the target hashes, then syncs; any failure rolls back what was stored.
// Then, when the delta carries the target's safetensors headers, rewrites
// each file's header to the target's where it fits the file's header area
// (docs/format.md §8), so the file becomes byte-identical to the target's;
// a header that does not fit is reported in headers_not_carried, not as an
// error. A header write interrupted by a crash is finished by the next
// Apply on the same checkpoint.
//
// Interruptions (docs/format.md §9): before a chunk's first store, its
// pre-image goes to a journal beside the checkpoint (a file
// CHECKPOINT.refit-apply, or DIR/.refit-apply), removed when the apply is
// done. A run that finds a journal of the same delta restores its
// pre-images first (the checkpoint is then the base again) and applies the
// delta; so after a kill at any point, or a cancel, running Apply again
// completes the delta. Errors beyond those listed at the top:
//   kCancelled           options.cancel was set: the chunks applied so far
//                        stay, recorded in the journal
//   kFailedPrecondition  also: a journal of another delta is present
//   kResourceExhausted   the file system cannot hold the checkpoint's
//                        unallocated blocks (a sparse file); nothing written
Result<ApplyReport> Apply(const std::string& delta_path,
                          const std::string& checkpoint_path,
                          const ApplyOptions& options);

// Undoes an interrupted Apply of this delta: restores the journal's
// pre-images, checks that every tensor is the delta's base again, syncs and
// removes the journal. With no journal: OK when the checkpoint already is
// the base, kFailedPrecondition otherwise (a completed apply keeps no
// pre-images). The report counts chunks_restored.
Result<ApplyReport> Rollback(const std::string& delta_path,
                             const std::string& checkpoint_path,
                             const ApplyOptions& options);

// The same as Apply for tensors in host memory, with no journal: a cancel
// rolls every stored chunk back before returning kCancelled.
Result<ApplyReport> ApplyToTensors(const std::string& delta_path,
                                   const std::vector<MutableTensorView>& tensors,
                                   const ApplyOptions& options);

struct VerifyReport {
  bool matches_target = false;  // every tensor hashes to the delta's "after"
  bool matches_base = false;    // every tensor hashes to the delta's "before"
  uint64_t tensors = 0;
  std::vector<std::string> mismatched;  // tensors matching neither... target
  // Only when the delta carries the target's safetensors headers: whether
  // they were compared, and "<file>: <why>" for each file whose header
  // differs from the target's (trailing padding ignored). A header-only
  // difference leaves matches_target true and `mismatched` empty.
  bool headers_checked = false;
  std::vector<std::string> header_differs;
};

// Is `checkpoint_path` exactly the delta's target?
Result<VerifyReport> Verify(const std::string& checkpoint_path,
                            const std::string& delta_path, int threads = 0);

struct TensorInspect {
  std::string name;
  std::string dtype;
  uint64_t elements = 0;
  uint64_t changed = 0;
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;
  uint64_t chunk_bytes = 0;
  std::map<std::string, uint64_t> kinds;  // chunk kind -> chunks
  // Order-0 bound for this tensor alone: positions as a uniform random
  // subset plus the empirical entropy of its XOR values (XOR kinds only).
  double bound_bytes = 0;
};

struct InspectReport {
  uint64_t format_version = 0;
  uint64_t version = 0;
  uint64_t base_version = 0;
  uint64_t file_bytes = 0;
  uint64_t total_elements = 0;
  uint64_t changed_elements = 0;
  uint64_t full_bytes = 0;
  uint64_t chunks = 0;
  uint64_t payload_bytes = 0;
  uint64_t chunk_bytes = 0;
  std::map<std::string, uint64_t> kinds;
  // The order-0 entropy bound of the whole delta: log2 C(N, K) bits for the
  // positions as a uniform random subset of all N elements, plus K times
  // the empirical entropy of the element-wide XOR values. Valid when every
  // chunk is an XOR kind (`bound_valid`).
  double bound_bytes = 0;
  bool bound_valid = false;
  std::vector<TensorInspect> tensors;
};

// Reads and decodes every chunk (checking it), and reports statistics.
Result<InspectReport> Inspect(const std::string& delta_path);

}  // namespace refit

#endif  // REFIT_DELTA_H_
