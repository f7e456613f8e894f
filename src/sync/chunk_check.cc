#include "sync/chunk_check.h"

#include <string>

namespace refit::internal {

bool FailsItsChecks(const Status& s) {
  return s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kUnauthenticated;
}

bool SameTensor(const TensorEntry& x, const TensorEntry& y) {
  return x.name == y.name && x.dtype == y.dtype && x.width == y.width && x.shape == y.shape;
}

bool RangeInside(const std::vector<TensorEntry>& tensors, uint64_t tensor, uint64_t start,
                 uint64_t count) {
  return tensor < tensors.size() && count > 0 && start <= tensors[tensor].num_elements &&
         count <= tensors[tensor].num_elements - start;
}

bool ManifestMatches(const Announcement& a, const Manifest& m) {
  bool same = m.base_version == a.base_version && m.members == a.members &&
              m.tensors.size() == a.tensors.size();
  for (size_t t = 0; same && t < m.tensors.size(); ++t) {
    same = SameTensor(m.tensors[t], a.tensors[t]) && m.tensors[t].before == a.tensors[t].before;
  }
  return same;
}

Result<ParsedChunk> CheckChunk(std::span<const uint8_t> object,
                               const ChunkSpec& spec, const Authenticator& auth,
                               std::span<const uint8_t>* chunk_bytes) {
  const Announcement& a = *spec.version;
  const uint64_t i = spec.index;
  const std::string name = std::string(spec.resend ? "the re-send of " : "") + "chunk " +
                           std::to_string(i) + " of version " + std::to_string(a.version);
  const ManifestChunk* entry = spec.manifest != nullptr && i < spec.manifest->chunks.size()
                                   ? &spec.manifest->chunks[i]
                                   : nullptr;
  if (!spec.resend && spec.manifest != nullptr &&
      (entry == nullptr || object.size() != entry->size ||
       ComputeSha256(object) != entry->sha256)) {
    return DataLossError(name + " does not match its manifest hash");
  }
  REFIT_ASSIGN_OR_RETURN(auto body, auth.Open(object));
  REFIT_ASSIGN_OR_RETURN(ParsedChunk c, ParseChunk(body));
  const ChunkHeader& h = c.header;
  if (h.IsStrided() && (entry == nullptr || entry->run == 0)) {
    // A strided region (a rank's block of a matrix) is taken only where
    // the manifest lists one: receivers fetch those chunks after it.
    return DataLossError(name + " is a strided region its manifest does not list");
  }
  // ParseChunk checked the region's form; End() is its last element + 1.
  if (!RangeInside(a.tensors, h.tensor_id, h.start, h.End() - h.start) ||
      h.width != a.tensors[h.tensor_id].width) {
    return DataLossError(name + " names a range outside the announced tensors");
  }
  if (h.version != a.version || h.base_version != a.base_version) {
    return DataLossError(name + " belongs to another version");
  }
  if (entry != nullptr &&
      (h.tensor_id != entry->tensor_id || h.start != entry->start || h.count != entry->count ||
       h.run != entry->run || (h.run != 0 && h.stride != entry->stride) ||
       (!spec.resend && h.kind != static_cast<codec::ChunkKind>(entry->kind)))) {
    return DataLossError(name + " does not match its manifest entry");
  }
  if (spec.resend && h.kind != codec::ChunkKind::kSparseOverwrite &&
      h.kind != codec::ChunkKind::kRaw) {
    return DataLossError(name + " is not an overwrite");
  }
  if (chunk_bytes != nullptr) *chunk_bytes = body.first(c.size);
  return c;
}

}  // namespace refit::internal
