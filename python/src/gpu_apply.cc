// refit._native.apply_cuda: applies a delta file to tensors resident in
// CUDA memory, in place, with the GPU receiver (src/cuda/pipeline.h). Built
// only when the CUDA module is (REFIT_CUDA_ENABLED).
//
// The tensors arrive as DLPack capsules of device memory and are written
// where they live: chunk payloads are copied to the GPU, decoded and applied
// there. Same contract as ApplyToTensors: every tensor must hash to the
// delta's "before" or "after" first (otherwise nothing is written), each
// chunk applies at most once, and every tensor must hash to "after" at the
// end.
#include "gpu_apply.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "base/file.h"
#include "borrow.h"
#include "cuda/device_baseline.h"
#include "cuda/device_rank_encoder.h"
#include "cuda/device_target.h"
#include "cuda/layout_placement.h"
#include "cuda/pipeline.h"
#include "cuda/placement.h"
#include "delta/delta_file.h"
#include "refit/layout.h"

namespace py = pybind11;

namespace refit::python {
namespace {

struct DeviceTensor {
  const TensorEntry* entry;
  const BorrowedTensor* tensor;
};

Result<cuda::GpuApplyReport> ApplyCudaImpl(const std::string& delta_path,
                                           const std::vector<const BorrowedTensor*>& tensors,
                                           uint64_t staging_bytes) {
  REFIT_ASSIGN_OR_RETURN(DeltaReader reader, DeltaReader::Open(delta_path));
  REFIT_ASSIGN_OR_RETURN(MappedFile file,
                         MappedFile::Open(delta_path, MappedFile::Mode::kReadOnly));
  std::map<std::string, const BorrowedTensor*> by_name;
  int device = -1;
  for (const BorrowedTensor* t : tensors) {
    if (!t->on_cuda()) {
      return InvalidArgumentError("tensor '" + t->name() + "' is not in CUDA memory");
    }
    if (device >= 0 && t->device_id() != device) {
      return InvalidArgumentError("tensors are on CUDA devices " + std::to_string(device) +
                                  " and " + std::to_string(t->device_id()) +
                                  "; apply to one device at a time");
    }
    device = t->device_id();
    by_name[t->name()] = t;
  }
  if (by_name.size() != reader.tensors().size()) {
    return InvalidArgumentError("the delta has " + std::to_string(reader.tensors().size()) +
                                " tensors but " + std::to_string(by_name.size()) +
                                " were given");
  }
  std::vector<DeviceTensor> table;
  std::vector<std::string> names;
  cuda::PlacementPlan plan;
  for (const TensorEntry& e : reader.tensors()) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      return InvalidArgumentError("tensor '" + e.name + "' of the delta was not given");
    }
    const BorrowedTensor* t = it->second;
    if (t->dtype() != e.dtype || t->shape() != e.shape || t->width() != e.width) {
      return FailedPreconditionError("tensor '" + e.name +
                                     "' has a different dtype or shape than in the delta; "
                                     "it is not the delta's base");
    }
    table.push_back({&e, t});
    names.push_back(e.name);
    if (e.num_elements > 0) {
      REFIT_RETURN_IF_ERROR(plan.Add(cuda::WholePlacement(
          e.name, e.width, e.num_elements, 1, reinterpret_cast<uint64_t>(t->data()))));
    }
  }
  // Every tensor at "before" or "after", or nothing is written.
  for (const DeviceTensor& d : table) {
    if (d.tensor->byte_size() == 0) continue;
    REFIT_ASSIGN_OR_RETURN(Hash128 h, cuda::RangeHashDevice(d.tensor->data(),
                                                            d.tensor->byte_size()));
    if (h != d.entry->before && h != d.entry->after) {
      return FailedPreconditionError("tensor '" + d.entry->name +
                                     "' is neither the delta's base nor its target; "
                                     "nothing was written");
    }
  }
  std::vector<cuda::ChunkSpan> spans;
  for (const IndexEntry& i : reader.index()) spans.push_back({i.offset, i.size});
  cuda::ReceiverOptions options;
  options.device = device < 0 ? 0 : device;
  options.staging_bytes = staging_bytes;
  REFIT_ASSIGN_OR_RETURN(auto receiver,
                         cuda::Receiver::Create(std::move(plan), names, options));
  REFIT_ASSIGN_OR_RETURN(cuda::PreparedDelta prepared,
                         receiver->Prepare(file.bytes(), spans));
  REFIT_ASSIGN_OR_RETURN(std::vector<uint8_t> states,
                         receiver->Classify(file.bytes(), prepared));
  REFIT_ASSIGN_OR_RETURN(cuda::GpuApplyReport report,
                         receiver->Apply(file.bytes(), prepared, &states));
  for (const DeviceTensor& d : table) {
    if (d.tensor->byte_size() == 0) continue;
    REFIT_ASSIGN_OR_RETURN(Hash128 h, cuda::RangeHashDevice(d.tensor->data(),
                                                            d.tensor->byte_size()));
    if (h != d.entry->after) {
      return DataLossError("tensor '" + d.entry->name +
                           "' does not hash to the delta's target after the apply");
    }
  }
  return report;
}

}  // namespace

Result<DeviceBaselineMade> MakeDeviceBaseline(const std::vector<TensorView>& initial, int device,
                                              bool pinned_host, const std::string& durable_path) {
  cuda::DeviceBaselineOptions options;
  options.device = device;
  options.pinned_host = pinned_host;
  options.durable_path = durable_path;
  REFIT_ASSIGN_OR_RETURN(auto baseline, cuda::DeviceBaseline::Create(initial, options));
  cuda::DeviceBaseline* raw = baseline.get();
  DeviceBaselineMade made;
  made.durable = [raw] {
    const cuda::DurableState s = raw->durable();
    return DurableInfo{s.loaded, s.loaded_version, s.written_version, s.writes,
                       s.last_write_ms, s.error};
  };
  made.flush = [raw] { return raw->FlushDurable(); };
  made.baseline = std::move(baseline);
  return made;
}

Result<std::unique_ptr<trainer::RankEncoderInterface>> MakeDeviceRankEncoder(
    const layout::Layout& layout, uint32_t rank, const trainer::RankEncoderOptions& options,
    int device, const std::vector<TensorView>& initial_local,
    const std::vector<TensorView>& initial_canonical) {
  cuda::DeviceRankEncoderOptions d;
  d.device = device;
  REFIT_ASSIGN_OR_RETURN(auto encoder, cuda::DeviceRankEncoder::Create(layout, rank, options, d));
  if (!initial_local.empty()) {
    REFIT_RETURN_IF_ERROR(encoder->SetBaselineFromLocal(initial_local));
  } else {
    REFIT_RETURN_IF_ERROR(encoder->SetBaseline(initial_canonical));
  }
  return std::unique_ptr<trainer::RankEncoderInterface>(std::move(encoder));
}

Result<std::shared_ptr<StagedTarget>> MakeDeviceTarget(
    const std::vector<const BorrowedTensor*>& tensors,
    const std::string& layout_json, uint32_t rank,
    const DeviceStaging& staging) {
  int device = -1;
  for (const BorrowedTensor* t : tensors) {
    if (!t->on_cuda()) {
      return InvalidArgumentError("tensor '" + t->name() +
                                  "' is not in CUDA memory");
    }
    if (device >= 0 && t->device_id() != device) {
      return InvalidArgumentError(
          "tensors are on CUDA devices " + std::to_string(device) + " and " +
          std::to_string(t->device_id()) +
          "; a GPU receiver holds tensors of one device");
    }
    device = t->device_id();
  }
  std::vector<cuda::CanonicalTensor> canonical;
  cuda::PlacementPlan plan;
  if (layout_json.empty()) {
    for (const BorrowedTensor* t : tensors) {
      canonical.push_back({t->name(), t->dtype(), t->width(), t->shape()});
      const uint64_t n = t->byte_size() / static_cast<uint64_t>(t->width());
      if (n == 0) continue;
      REFIT_RETURN_IF_ERROR(plan.Add(cuda::WholePlacement(
          t->name(), t->width(), n, 1, reinterpret_cast<uint64_t>(t->data()))));
    }
  } else {
    REFIT_ASSIGN_OR_RETURN(layout::Layout l, layout::ParseLayout(layout_json));
    REFIT_RETURN_IF_ERROR(layout::ValidateLayout(l));
    const layout::RankLayout* r = nullptr;
    for (const layout::RankLayout& x : l.ranks) {
      if (x.rank == rank) r = &x;
    }
    if (r == nullptr)
      return InvalidArgumentError("the layout has no rank " +
                                  std::to_string(rank));
    std::map<std::string, const BorrowedTensor*> by_name;
    for (const BorrowedTensor* t : tensors) by_name[t->name()] = t;
    std::map<std::string, uint64_t> address;
    for (const layout::LocalTensor& lt : r->tensors) {
      auto it = by_name.find(lt.name);
      if (it == by_name.end()) {
        return InvalidArgumentError("local tensor '" + lt.name +
                                    "' of the layout's rank " +
                                    std::to_string(rank) + " was not given");
      }
      if (it->second->dtype() != lt.dtype || it->second->shape() != lt.shape) {
        return InvalidArgumentError(
            "tensor '" + lt.name +
            "' has another dtype or shape than the layout says");
      }
      address[lt.name] = reinterpret_cast<uint64_t>(it->second->data());
    }
    if (by_name.size() != r->tensors.size()) {
      return InvalidArgumentError(
          "the layout's rank " + std::to_string(rank) + " has " +
          std::to_string(r->tensors.size()) + " tensors but " +
          std::to_string(by_name.size()) + " were given");
    }
    REFIT_ASSIGN_OR_RETURN(plan, cuda::PlanFromLayout(l, rank, address));
    DTypeRegistry dtypes;
    for (const layout::CanonicalTensor& c : l.canonical) {
      REFIT_ASSIGN_OR_RETURN(int width, dtypes.ElementWidth(c.dtype));
      canonical.push_back({c.name, c.dtype, width, c.shape});
    }
  }
  cuda::DeviceTargetOptions o;
  o.device = device < 0 ? 0 : device;
  o.device_staging_bytes = staging.device_bytes;
  o.host_staging_bytes = staging.host_bytes;
  o.apply_staging_bytes = staging.apply_bytes;
  REFIT_ASSIGN_OR_RETURN(
      auto target,
      cuda::DeviceTarget::Create(std::move(canonical), std::move(plan), o));
  return std::shared_ptr<StagedTarget>(std::move(target));
}

void BindCuda(py::module_& m, void (*raise)(const Status&)) {
  py::class_<cuda::GpuApplyReport>(m, "GpuApplyReport")
      .def_readonly("chunks", &cuda::GpuApplyReport::chunks)
      .def_readonly("chunks_applied", &cuda::GpuApplyReport::chunks_applied)
      .def_readonly("chunks_skipped", &cuda::GpuApplyReport::chunks_skipped)
      .def_readonly("records", &cuda::GpuApplyReport::records)
      .def_readonly("batches", &cuda::GpuApplyReport::batches)
      .def_readonly("payload_bytes", &cuda::GpuApplyReport::payload_bytes)
      .def_readonly("device_bytes", &cuda::GpuApplyReport::device_bytes)
      .def_readonly("seconds", &cuda::GpuApplyReport::seconds)
      .def_readonly("kernel_ms", &cuda::GpuApplyReport::kernel_ms)
      .def("__repr__", [](const cuda::GpuApplyReport& r) {
        return "GpuApplyReport(" + std::to_string(r.chunks_applied) + " chunks applied, " +
               std::to_string(r.chunks_skipped) + " skipped)";
      });
  m.def(
      "apply_cuda",
      [raise](const std::string& delta, py::handle tensors, uint64_t staging_bytes) {
        auto borrowed = BorrowAll(tensors, /*writable=*/true, /*allow_cuda=*/true);
        if (!borrowed.ok()) raise(borrowed.status());
        std::vector<const BorrowedTensor*> views;
        for (const auto& t : *borrowed) views.push_back(t.get());
        Result<cuda::GpuApplyReport> report = InternalError("not run");
        {
          py::gil_scoped_release release;
          report = ApplyCudaImpl(delta, views, staging_bytes);
        }
        if (!report.ok()) raise(report.status());
        return *report;
      },
      py::arg("delta"), py::arg("tensors"), py::arg("staging_bytes"),
      "Applies a delta in place to CUDA tensors given as DLPack capsules.");
  m.def(
      "range_hashes_cuda",
      [raise](py::handle tensors) {
        auto borrowed =
            BorrowAll(tensors, /*writable=*/false, /*allow_cuda=*/true);
        if (!borrowed.ok()) raise(borrowed.status());
        std::vector<cuda::DeviceRange> ranges;
        for (const auto& t : *borrowed) {
          if (!t->on_cuda())
            raise(InvalidArgumentError("tensor '" + t->name() +
                                       "' is not in CUDA memory"));
          ranges.push_back({t->data(), t->byte_size()});
        }
        Result<std::vector<Hash128>> hashes = InternalError("not run");
        {
          py::gil_scoped_release release;
          hashes = cuda::RangeHashesDevice(ranges);
        }
        if (!hashes.ok()) raise(hashes.status());
        std::vector<std::pair<uint64_t, uint64_t>> out;
        for (const Hash128& h : *hashes) out.emplace_back(h.lo, h.hi);
        return out;
      },
      py::arg("tensors"),
      "Range hashes (docs/format.md) of CUDA tensors, hashed on their device.");
}

}  // namespace refit::python
