#include "sync/object_reader.h"

#include "sync/keys.h"

namespace refit {
namespace {

void Set(ObjectReader::Step* step, ObjectReader::Step value) {
  if (step != nullptr) *step = value;
}

template <typename T>
Status CheckVersion(const T& object, uint64_t version, const char* what) {
  if (object.version != version) {
    return DataLossError(std::string(what) + " names another version");
  }
  return Status();
}

}  // namespace

Result<std::optional<std::vector<uint8_t>>> ObjectReader::Open(
    const std::string& key, bool member, Sha256* sha, Step* step) const {
  Set(step, Step::kFetch);
  Result<std::vector<uint8_t>> bytes = store_->Get(key);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return std::optional<std::vector<uint8_t>>();
    }
    return bytes.status();
  }
  if (sha != nullptr) *sha = ComputeSha256(*bytes);
  Set(step, Step::kOpen);
  REFIT_ASSIGN_OR_RETURN(
      std::span<const uint8_t> body,
      member ? auth_.OpenMember(*bytes) : auth_.Open(*bytes));
  Set(step, Step::kDecode);
  return std::optional<std::vector<uint8_t>>(
      std::vector<uint8_t>(body.begin(), body.end()));
}

Result<std::optional<uint64_t>> ObjectReader::ReadHead(Step* step) const {
  REFIT_ASSIGN_OR_RETURN(auto body, Open(kHeadKey, false, nullptr, step));
  if (!body) return std::optional<uint64_t>();
  REFIT_ASSIGN_OR_RETURN(uint64_t head, DecodeHead(*body));
  return std::optional<uint64_t>(head);
}

Result<std::vector<uint64_t>> ObjectReader::ListVersions() const {
  REFIT_ASSIGN_OR_RETURN(std::vector<ObjectInfo> index,
                         store_->List(kIndexPrefix));
  return VersionsOf(index);
}

Result<Announcement> ObjectReader::ReadAnnouncement(uint64_t version,
                                                    Sha256* sha,
                                                    Step* step) const {
  Set(step, Step::kFetch);
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                         store_->Get(IndexKey(version)));
  if (sha != nullptr) *sha = ComputeSha256(bytes);
  Set(step, Step::kOpen);
  REFIT_ASSIGN_OR_RETURN(std::span<const uint8_t> body, auth_.Open(bytes));
  Set(step, Step::kDecode);
  REFIT_ASSIGN_OR_RETURN(Announcement a, DecodeAnnouncement(body));
  REFIT_RETURN_IF_ERROR(CheckVersion(a, version, "announcement"));
  return a;
}

Result<std::optional<Manifest>> ObjectReader::ReadManifest(uint64_t version,
                                                           Sha256* sha,
                                                           Step* step) const {
  REFIT_ASSIGN_OR_RETURN(auto body,
                         Open(ManifestKey(version), false, sha, step));
  if (!body) return std::optional<Manifest>();
  REFIT_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(*body));
  REFIT_RETURN_IF_ERROR(CheckVersion(m, version, "manifest"));
  return std::optional<Manifest>(std::move(m));
}

Result<std::optional<Decision>> ObjectReader::ReadDecision(uint64_t version,
                                                           Step* step) const {
  REFIT_ASSIGN_OR_RETURN(auto body,
                         Open(DecisionKey(version), false, nullptr, step));
  if (!body) return std::optional<Decision>();
  REFIT_ASSIGN_OR_RETURN(Decision d, DecodeDecision(*body));
  REFIT_RETURN_IF_ERROR(CheckVersion(d, version, "decision"));
  return std::optional<Decision>(std::move(d));
}

Result<std::optional<Vote>> ObjectReader::ReadVote(uint64_t version,
                                                   const std::string& member,
                                                   Step* step) const {
  REFIT_ASSIGN_OR_RETURN(auto body,
                         Open(VoteKey(version, member), true, nullptr, step));
  if (!body) return std::optional<Vote>();
  REFIT_ASSIGN_OR_RETURN(Vote v, DecodeVote(*body));
  return std::optional<Vote>(std::move(v));
}

}  // namespace refit
