// refit._native: the C++ library as a Python extension module.
//
// This layer only converts: Python objects to borrowed tensor views
// (borrow.h), Status to exceptions of refit.errors, and C++ reports to
// read-only Python objects. Policy (dtype resolution, PyTorch staging, the
// Publisher/Receiver conveniences) lives in the pure-Python package. Every
// call that does native work of any length releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "borrow.h"
#include "delta/delta_file.h"
#include "format/safetensors.h"
#include "ranks/parts.h"
#include "refit/auth.h"
#include "refit/checkpoint.h"
#include "refit/delta.h"
#include "refit/layout.h"
#include "refit/status.h"
#include "refit/store.h"
#include "refit/trainer.h"
#include "sync/follow.h"
#include "sync/host_staged_target.h"
#include "sync/protocol.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "trainer/rank_encoder.h"
#ifdef REFIT_PYTHON_CUDA
#include "gpu_apply.h"
#endif

namespace py = pybind11;

namespace refit::python {
namespace {

// A non-OK Status on its way to Python; the translator below turns it into
// the matching refit.errors class.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

void Check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) throw StatusError(r.status());
  return std::move(r).value();
}

void TranslateStatusError(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const StatusError& e) {
    py::object make = py::module_::import("refit.errors").attr("_from_status");
    py::object exc = make(std::string(StatusCodeName(e.status().code())),
                          std::string(e.status().message()));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  }
}

using Borrowed = std::vector<std::unique_ptr<BorrowedTensor>>;

// The CUDA device all of `b` lives on; kInvalidArgument naming a tensor in
// host memory or on another device.
Result<int> OneDevice(const Borrowed& b) {
  int device = -1;
  for (const auto& t : b) {
    if (!t->on_cuda()) {
      return InvalidArgumentError("tensor '" + t->name() +
                                  "' is in host memory; a publisher with its baseline in "
                                  "device memory publishes CUDA tensors");
    }
    if (device >= 0 && t->device_id() != device) {
      return InvalidArgumentError("tensors are on CUDA devices " + std::to_string(device) +
                                  " and " + std::to_string(t->device_id()) +
                                  "; one publisher takes the tensors of one device");
    }
    device = t->device_id();
  }
  return device < 0 ? 0 : device;
}

std::vector<TensorView> Views(const Borrowed& b) {
  std::vector<TensorView> out;
  out.reserve(b.size());
  for (const auto& t : b) out.push_back(t->View());
  return out;
}

std::vector<MutableTensorView> MutableViews(const Borrowed& b) {
  std::vector<MutableTensorView> out;
  out.reserve(b.size());
  for (const auto& t : b) out.push_back(t->MutableView());
  return out;
}

// A {canonical name: amax} mapping (or None) as trainer::GlobalAmax: the
// whole-tensor amax of tensors split across ranks (docs/trainer.md).
trainer::GlobalAmax AmaxFrom(const py::object& amax) {
  trainer::GlobalAmax out;
  if (amax.is_none()) return out;
  if (!py::isinstance<py::dict>(amax)) {
    throw StatusError(InvalidArgumentError("amax must be a dict of canonical tensor name -> "
                                           "float (the whole tensor's amax)"));
  }
  for (const auto& [name, value] : amax.cast<py::dict>()) {
    if (!py::isinstance<py::str>(name) ||
        !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value) ||
          py::hasattr(value, "__float__"))) {
      throw StatusError(InvalidArgumentError("amax must map canonical tensor names (str) to "
                                             "floats, not " +
                                             std::string(py::str(py::repr(name))) + ": " +
                                             std::string(py::str(py::repr(value)))));
    }
    out[name.cast<std::string>()] = static_cast<float>(value.cast<double>());
  }
  return out;
}

int Millis(double seconds) {
  if (seconds < 0) throw StatusError(InvalidArgumentError("a timeout must not be negative"));
  double ms = seconds * 1000.0;
  return ms > 2e9 ? 2000000000 : static_cast<int>(ms);
}

std::vector<uint8_t> Bytes(const py::object& b) {
  std::string s = b.cast<py::bytes>();
  return std::vector<uint8_t>(s.begin(), s.end());
}

// The shared HMAC key (key / key_file) plus, optionally, an Ed25519 signing
// key (publisher) or verify key (receivers): raw bytes or a PEM file each.
Authenticator MakeAuth(const py::object& key, const std::string& key_file,
                       const py::object& ed_key = py::none(), const std::string& ed_key_file = "",
                       bool signing = false) {
  if (!key.is_none() && !key_file.empty()) {
    throw StatusError(InvalidArgumentError("give key or key_file, not both"));
  }
  const char* what = signing ? "sign_key" : "verify_key";
  if (!ed_key.is_none() && !ed_key_file.empty()) {
    throw StatusError(InvalidArgumentError(std::string("give ") + what + " or " + what +
                                           "_file, not both"));
  }
  Authenticator a = Authenticator::None();
  if (!key_file.empty()) {
    a = Unwrap(Authenticator::FromKeyFile(key_file));
  } else if (!key.is_none()) {
    a = Unwrap(Authenticator::Hmac(Bytes(key)));
  }
  if (!ed_key.is_none()) {
    std::vector<uint8_t> k = Bytes(ed_key);
    a = Unwrap(signing ? a.WithSigningKey(k) : a.WithVerifyKey(k));
  } else if (!ed_key_file.empty()) {
    a = Unwrap(signing ? a.WithSigningKeyFile(ed_key_file) : a.WithVerifyKeyFile(ed_key_file));
  }
  return a;
}

// A numpy dtype that holds a safetensors dtype's elements: the native type
// where NumPy has one, the unsigned integer of the same width (the bit
// pattern) otherwise (BF16, the F8 family, ...).
py::dtype NumpyDType(const std::string& dtype, int width) {
  static const std::map<std::string, std::string> kNative = {
      {"F64", "float64"}, {"F32", "float32"}, {"F16", "float16"}, {"I64", "int64"},
      {"I32", "int32"},   {"I16", "int16"},   {"I8", "int8"},     {"U64", "uint64"},
      {"U32", "uint32"},  {"U16", "uint16"},  {"U8", "uint8"},    {"BOOL", "bool"}};
  auto it = kNative.find(dtype);
  if (it != kNative.end()) return py::dtype(it->second);
  return py::dtype("uint" + std::to_string(8 * width));
}

std::vector<py::ssize_t> NumpyShape(const std::vector<uint64_t>& shape) {
  std::vector<py::ssize_t> out;
  for (uint64_t d : shape) out.push_back(static_cast<py::ssize_t>(d));
  return out;
}

// A checkpoint opened from Python. Arrays it hands out view its memory
// mappings and keep it alive.
class PyCheckpoint {
 public:
  PyCheckpoint(const std::string& path, bool writable)
      : ckpt_(Unwrap(Checkpoint::Open(path, writable ? Checkpoint::Mode::kReadWrite
                                                     : Checkpoint::Mode::kReadOnly))) {}

  const Checkpoint& get() const { return ckpt_; }
  Checkpoint& get() { return ckpt_; }

  size_t Index(const std::string& name) const {
    auto i = ckpt_.IndexOf(name);
    if (!i) {
      throw py::key_error("checkpoint '" + ckpt_.path() + "' has no tensor '" + name + "'");
    }
    return *i;
  }

  static py::array Array(py::object self, const std::string& name) {
    PyCheckpoint& c = self.cast<PyCheckpoint&>();
    size_t i = c.Index(name);
    const TensorInfo& t = c.ckpt_.tensors()[i];
    bool writable = c.ckpt_.mode() == Checkpoint::Mode::kReadWrite;
    void* data = writable ? static_cast<void*>(c.ckpt_.MutableData(i).data())
                          : const_cast<uint8_t*>(c.ckpt_.Data(i).data());
    py::array a(NumpyDType(t.dtype, t.element_width), NumpyShape(t.shape), {}, data, self);
    // A read-only mapping faults on a store: NumPy must refuse writes.
    if (!writable) a.attr("flags").attr("writeable") = false;
    return a;
  }

 private:
  Checkpoint ckpt_;
};

// A store opened by URL, shared by a publisher or receiver.
std::shared_ptr<ObjectStore> OpenStore(const std::string& url) {
  return std::shared_ptr<ObjectStore>(Unwrap(OpenObjectStore(url)).release());
}

// A store opened by URL, for Python code that moves objects between
// stores (refit.fanout). Bytes in and out; the GIL is released meanwhile.
class PyStore {
 public:
  explicit PyStore(const std::string& url) : store_(OpenStore(url)) {}

  py::bytes Get(const std::string& key) {
    std::vector<uint8_t> got;
    {
      py::gil_scoped_release release;
      got = Unwrap(store_->Get(key));
    }
    return py::bytes(reinterpret_cast<const char*>(got.data()), got.size());
  }

  void Put(const std::string& key, const py::bytes& data) {
    std::string_view v = data;
    std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(v.data()), v.size());
    py::gil_scoped_release release;
    Check(store_->Put(key, bytes));
  }

  std::vector<std::pair<std::string, uint64_t>> List(const std::string& prefix) {
    std::vector<ObjectInfo> got;
    {
      py::gil_scoped_release release;
      got = Unwrap(store_->List(prefix));
    }
    std::vector<std::pair<std::string, uint64_t>> out;
    out.reserve(got.size());
    for (const ObjectInfo& o : got) out.emplace_back(o.key, o.size);
    return out;
  }

  void Delete(const std::string& key) {
    py::gil_scoped_release release;
    Check(store_->Delete(key));
  }

 private:
  std::shared_ptr<ObjectStore> store_;
};

class PyPublisher {
 public:
  PyPublisher(const std::string& store_url, const std::string& baseline,
              std::vector<std::string> members, const py::object& key,
              const std::string& key_file, const py::object& sign_key,
              const std::string& sign_key_file, double vote_timeout, const std::string& policy,
              int threads, uint64_t chunk_bytes, int upload_threads, uint64_t snapshot_every,
              uint64_t keep_versions, const py::object& device_initial, bool pinned_host,
              const std::string& durable_path, bool conditional, uint64_t pack_bytes) {
    PublisherOptions o;
    o.pack_bytes = pack_bytes;
    o.members = std::move(members);
    o.auth = MakeAuth(key, key_file, sign_key, sign_key_file, /*signing=*/true);
    o.vote_timeout_ms = Millis(vote_timeout);
    o.policy = Unwrap(ParseDeadlinePolicy(policy));
    o.diff.threads = threads;
    if (chunk_bytes != 0) o.diff.chunk_bytes = chunk_bytes;
    o.diff.allow_conditional = conditional;
    o.upload_threads = upload_threads;
    o.snapshot_every = snapshot_every;
    o.keep_versions = keep_versions;
    store_ = OpenStore(store_url);
    if (device_initial.is_none()) {
      py::gil_scoped_release release;
      pub_ = Unwrap(Publisher::Open(store_.get(), baseline, std::move(o)));
      return;
    }
    // The baseline in device memory: a copy of the trainer's CUDA tensors.
    Borrowed b = Unwrap(BorrowAll(device_initial, /*writable=*/false, /*allow_cuda=*/true));
    device_ = Unwrap(OneDevice(b));
#ifdef REFIT_PYTHON_CUDA
    std::vector<TensorView> views = Views(b);
    py::gil_scoped_release release;
    DeviceBaselineMade made = Unwrap(MakeDeviceBaseline(views, device_, pinned_host, durable_path));
    durable_ = std::move(made.durable);
    flush_ = std::move(made.flush);
    pub_ = Unwrap(Publisher::Open(store_.get(), std::move(made.baseline), std::move(o)));
#else
    (void)pinned_host;
    (void)durable_path;
    throw StatusError(UnimplementedError(
        "this build of refit has no CUDA module: a publisher baseline in device memory "
        "needs one (build where nvcc is installed, or with -DREFIT_WITH_CUDA=ON)"));
#endif
  }

  uint64_t committed_version() const { return pub_->committed_version(); }

  PublishReport Publish(uint64_t version, py::handle triples) {
    Borrowed b = Unwrap(BorrowAll(triples, /*writable=*/false, /*allow_cuda=*/device_ >= 0));
    if (device_ >= 0) {
      int d = Unwrap(OneDevice(b));
      if (d != device_) {
        throw StatusError(InvalidArgumentError(
            "the tensors are on CUDA device " + std::to_string(d) +
            " but the publisher's baseline is on device " + std::to_string(device_)));
      }
    }
    std::vector<TensorView> views = Views(b);
    py::gil_scoped_release release;
    return Unwrap(pub_->Publish(version, views));
  }

  // The CUDA device of the baseline, or -1 when it is a checkpoint file.
  int device() const { return device_; }

  // The durable baseline file's state (a dict), or None without one.
  py::object Durable() const {
#ifdef REFIT_PYTHON_CUDA
    if (!durable_) return py::none();
    const DurableInfo d = durable_();
    py::dict out;
    out["loaded"] = d.loaded;
    out["loaded_version"] = d.loaded_version;
    out["written_version"] = d.written_version;
    out["writes"] = d.writes;
    out["last_write_seconds"] = d.last_write_ms / 1000;
    out["error"] = d.error;
    return out;
#else
    return py::none();
#endif
  }

  // Waits until the newest committed version is in the durable file.
  void FlushDurable() {
#ifdef REFIT_PYTHON_CUDA
    if (!flush_) return;
    py::gil_scoped_release release;
    Check(flush_());
#endif
  }

  PublishReport PublishCheckpoint(uint64_t version, const std::string& path) {
    py::gil_scoped_release release;
    return Unwrap(pub_->PublishCheckpoint(version, path));
  }

  void Serve(uint64_t version, double seconds) {
    int ms = Millis(seconds);
    py::gil_scoped_release release;
    Check(pub_->Serve(version, ms));
  }

 private:
  std::shared_ptr<ObjectStore> store_;  // outlives pub_ (declared first)
  std::unique_ptr<Publisher> pub_;
  int device_ = -1;
#ifdef REFIT_PYTHON_CUDA
  std::function<DurableInfo()> durable_;  // read the baseline pub_ owns
  std::function<Status()> flush_;
#endif
};

class PyRankPublisher {
 public:
  // This rank's side of versions published by many ranks (docs/trainer.md):
  // `layout` is the layout's JSON text; the baseline comes from a
  // canonical checkpoint at the committed version, or from this rank's
  // own local tensors (`initial`, (name, dtype, object) triples).
  PyRankPublisher(const std::string& store_url, const std::string& parts_url,
                  const std::string& layout_json, uint32_t rank, int64_t committed,
                  const std::string& baseline, const py::object& initial, const py::object& key,
                  const std::string& key_file, int threads, uint64_t chunk_bytes,
                  int upload_threads, int device, const py::object& initial_amax,
                  uint64_t pack_bytes) {
    layout::Layout l = Unwrap(layout::ParseLayout(layout_json));
    trainer::RankEncoderOptions eo;
    eo.threads = threads;
    if (chunk_bytes != 0) eo.chunk_bytes = chunk_bytes;
    ranks::RankPublisherOptions ro;
    ro.auth = MakeAuth(key, key_file);
    ro.upload_threads = upload_threads;
    ro.pack_bytes = pack_bytes;
    store_ = OpenStore(store_url);
    parts_ = parts_url.empty() ? store_ : OpenStore(parts_url);
    Borrowed init;
    if (!initial.is_none()) {
      init = Unwrap(BorrowAll(initial, /*writable=*/false, /*allow_cuda=*/device >= 0));
    }
    device_ = device;
    const trainer::GlobalAmax amax = AmaxFrom(initial_amax);
    py::gil_scoped_release release;
    if (committed < 0) {
      // The store's head: the version every rank's baseline must be at.
      auto head = store_->Get(kHeadKey);
      if (head.ok()) {
        committed = static_cast<int64_t>(
            Unwrap(DecodeHead(Unwrap(ro.auth.Open(*head)))));
      } else if (head.status().code() == StatusCode::kNotFound) {
        committed = 0;
      } else {
        Check(head.status());
      }
    }
    if (device >= 0) {
      // The baseline in device memory, encoded on the GPU
      // (cuda/device_rank_encoder.h).
#ifdef REFIT_PYTHON_CUDA
      std::vector<TensorView> canonical;
      std::optional<Checkpoint> ck;
      if (!baseline.empty()) {
        ck.emplace(Unwrap(Checkpoint::Open(baseline, Checkpoint::Mode::kReadOnly)));
        canonical = CheckpointViews(*ck);
      }
      encoder_ = Unwrap(MakeDeviceRankEncoder(l, rank, eo, device, Views(init), canonical));
#else
      throw StatusError(UnimplementedError(
          "this build of refit has no CUDA module: a rank's baseline in device memory "
          "needs one (build where nvcc is installed, or with -DREFIT_WITH_CUDA=ON)"));
#endif
    } else {
      auto cpu = Unwrap(trainer::RankEncoder::Create(l, rank, eo));
      if (!baseline.empty()) {
        Checkpoint ck = Unwrap(Checkpoint::Open(baseline, Checkpoint::Mode::kReadOnly));
        Check(cpu->SetBaseline(CheckpointViews(ck)));
      } else {
        Check(cpu->SetBaselineFromLocal(Views(init), amax));
      }
      encoder_ = std::move(cpu);
    }
    pub_ = Unwrap(ranks::RankPublisher::Open(parts_.get(), store_.get(), encoder_.get(), rank,
                                             static_cast<uint64_t>(committed), std::move(ro)));
  }

  uint64_t committed_version() const { return pub_->committed_version(); }
  uint64_t owned_bytes() const { return encoder_->owned_bytes(); }

  py::dict Publish(uint64_t version, py::handle triples, const py::object& amax_object) {
    const trainer::GlobalAmax amax = AmaxFrom(amax_object);
    Borrowed b = Unwrap(BorrowAll(triples, /*writable=*/false, /*allow_cuda=*/device_ >= 0));
    if (device_ >= 0) {
      const int d = Unwrap(OneDevice(b));
      if (d != device_) {
        throw StatusError(InvalidArgumentError(
            "the tensors are on CUDA device " + std::to_string(d) +
            " but the rank's baseline is on device " + std::to_string(device_)));
      }
    }
    std::vector<TensorView> views = Views(b);
    ranks::RankPartReport r;
    {
      py::gil_scoped_release release;
      r = Unwrap(pub_->Publish(version, views, amax));
    }
    py::dict d;
    d["version"] = r.version;
    d["base_version"] = r.base_version;
    d["owned_bytes"] = r.encode.owned_bytes;
    d["changed_direct"] = r.encode.changed_direct;
    d["changed_residual"] = r.encode.changed_residual;
    d["chunks"] = r.encode.chunks;
    d["bytes_uploaded"] = r.bytes_uploaded;
    d["seconds"] = r.seconds;
    return d;
  }

  bool AwaitDecision(double timeout) {
    int ms = Millis(timeout);
    py::gil_scoped_release release;
    return Unwrap(pub_->AwaitDecision(ms));
  }

 private:
  std::shared_ptr<ObjectStore> store_, parts_;  // outlive pub_ (declared first)
  std::unique_ptr<trainer::RankEncoderInterface> encoder_;
  std::unique_ptr<ranks::RankPublisher> pub_;
  int device_ = -1;  // the CUDA device of a baseline in device memory
};

class PyCoordinator {
 public:
  PyCoordinator(const std::string& store_url, const std::string& parts_url,
                const std::string& baseline, const std::string& staging,
                std::vector<std::string> members, std::vector<uint32_t> ranks,
                const py::object& key, const std::string& key_file, double vote_timeout,
                double parts_timeout, int threads) {
    PublisherOptions o;
    o.members = std::move(members);
    o.auth = MakeAuth(key, key_file);
    o.vote_timeout_ms = Millis(vote_timeout);
    o.diff.threads = threads;
    ranks::CoordinatorOptions co;
    co.ranks = std::move(ranks);
    co.auth = o.auth;
    co.parts_timeout_ms = Millis(parts_timeout);
    co.threads = threads;
    store_ = OpenStore(store_url);
    parts_ = parts_url.empty() ? store_ : OpenStore(parts_url);
    py::gil_scoped_release release;
    pub_ = Unwrap(Publisher::Open(store_.get(), baseline, std::move(o)));
    coord_ = Unwrap(ranks::PartsCoordinator::Open(parts_.get(), pub_.get(), baseline, staging,
                                                  std::move(co)));
  }

  uint64_t committed_version() const { return pub_->committed_version(); }

  py::tuple Publish(uint64_t version) {
    ranks::CoordinatedReport r;
    {
      py::gil_scoped_release release;
      r = Unwrap(coord_->Publish(version));
    }
    py::dict parts;
    parts["chunks"] = r.part_chunks;
    parts["bytes"] = r.part_bytes;
    parts["changed_elements"] = r.changed_elements;
    parts["wait_seconds"] = r.wait_seconds;
    parts["apply_seconds"] = r.apply_seconds;
    return py::make_tuple(r.publish, parts);
  }

 private:
  std::shared_ptr<ObjectStore> store_, parts_;
  std::unique_ptr<Publisher> pub_;
  std::unique_ptr<ranks::PartsCoordinator> coord_;
};

class PyDirectCoordinator {
 public:
  // Decides versions whose ranks' parts receivers apply directly
  // (docs/protocol.md, "Versions from many ranks"): no baseline, no
  // staging copy. `table` is a checkpoint at the store's head version,
  // read only for its tensor table and only when the store records none
  // (version 0 without a snapshot); "" otherwise.
  PyDirectCoordinator(const std::string& store_url, std::vector<std::string> members,
                      std::vector<uint32_t> ranks, const py::object& key,
                      const std::string& key_file, double vote_timeout, double parts_timeout,
                      const std::string& table) {
    DirectCoordinatorOptions o;
    o.members = std::move(members);
    o.ranks = std::move(ranks);
    o.auth = MakeAuth(key, key_file);
    o.vote_timeout_ms = Millis(vote_timeout);
    o.parts_timeout_ms = Millis(parts_timeout);
    o.initial_checkpoint = table;
    store_ = OpenStore(store_url);
    py::gil_scoped_release release;
    coord_ = Unwrap(DirectCoordinator::Open(store_.get(), std::move(o)));
  }

  uint64_t committed_version() const { return coord_->committed_version(); }

  py::tuple Publish(uint64_t version) {
    DirectReport r;
    {
      py::gil_scoped_release release;
      r = Unwrap(coord_->Publish(version));
    }
    py::dict report;
    report["version"] = r.version;
    report["base_version"] = r.base_version;
    report["committed"] = r.committed;
    report["reason"] = r.reason;
    report["vote_seconds"] = r.vote_seconds;
    report["manifest_seconds"] = r.manifest_seconds;
    report["seconds"] = r.seconds;
    py::dict parts;
    parts["chunks"] = r.part_chunks;
    parts["bytes"] = r.part_bytes;
    parts["changed_elements"] = r.changed_elements;
    parts["wait_seconds"] = r.wait_seconds;
    return py::make_tuple(report, parts);
  }

  std::vector<uint32_t> PartsStored(uint64_t version) {
    py::gil_scoped_release release;
    return Unwrap(coord_->PartsStored(version));
  }

 private:
  std::shared_ptr<ObjectStore> store_;  // outlives coord_ (declared first)
  std::unique_ptr<DirectCoordinator> coord_;
};

class PyReceiver {
 public:
  // Patches `checkpoint`, or, when it is empty, the borrowed `tensors`
  // ((name, dtype, object) triples, held until the receiver dies).
  PyReceiver(const std::string& store_url, const std::string& member,
             const std::string& checkpoint, const py::object& tensors,
             const std::string& state_dir, const py::object& key,
             const std::string& key_file, const py::object& verify_key,
             const std::string& verify_key_file, int threads,
             double poll_interval, double decision_timeout,
             double resend_timeout, int max_fold_versions,
             const std::string& two_phase, const std::string& layout_json,
             uint32_t rank, uint64_t device_staging, uint64_t host_staging)
      : poll_ms_(Millis(poll_interval)) {
    ReceiverOptions o;
    o.member = member;
    o.checkpoint = checkpoint;
    if (two_phase == "cuda") {
#ifdef REFIT_PYTHON_CUDA
      held_ =
          Unwrap(BorrowAll(tensors, /*writable=*/true, /*allow_cuda=*/true));
      std::vector<const BorrowedTensor*> views;
      for (const auto& t : held_) views.push_back(t.get());
      DeviceStaging staging;
      staging.device_bytes = device_staging;
      staging.host_bytes = host_staging;
      o.staged = Unwrap(MakeDeviceTarget(views, layout_json, rank, staging));
#else
      (void)layout_json;
      (void)rank;
      (void)device_staging;
      throw StatusError(UnimplementedError(
          "this build of refit has no CUDA module: a receiver applying in GPU "
          "memory needs "
          "one (build where nvcc is installed, or with -DREFIT_WITH_CUDA=ON)"));
#endif
    } else if (!tensors.is_none()) {
      held_ = Unwrap(BorrowAll(tensors, /*writable=*/true));
      if (two_phase == "host") {
        o.staged = std::make_shared<HostStagedTarget>(MutableViews(held_),
                                                      host_staging);
      } else {
        o.tensors = MutableViews(held_);
      }
    }
    o.state_dir = state_dir;
    o.auth = MakeAuth(key, key_file, verify_key, verify_key_file, /*signing=*/false);
    o.threads = threads;
    o.poll_ms = poll_ms_;
    o.decision_timeout_ms = Millis(decision_timeout);
    o.resend_timeout_ms = Millis(resend_timeout);
    o.max_fold_versions = max_fold_versions;
    store_ = OpenStore(store_url);
    py::gil_scoped_release release;
    rcv_ = Unwrap(Receiver::Open(store_.get(), std::move(o)));
  }

  uint64_t active_version() const { return rcv_->active_version(); }

  StepResult Step() {
    py::gil_scoped_release release;
    return Unwrap(rcv_->Step());
  }

  // Two-phase receivers (Receiver::Prepare / ActivatePrepared).
  StepResult Prepare(uint64_t target) {
    py::gil_scoped_release release;
    return Unwrap(rcv_->Prepare(target == 0 ? UINT64_MAX : target));
  }
  StepResult Activate() {
    py::gil_scoped_release release;
    return Unwrap(rcv_->ActivatePrepared());
  }
  bool prepared() const { return rcv_->prepared(); }

  // Steps until the receiver is idle (nothing more to do now) or, with
  // `target` > 0, until the active version reaches it, polling while idle
  // up to `timeout` seconds. Returns every step that did something, so no
  // version's changed tensors are lost. Ctrl-C interrupts between steps.
  std::vector<StepResult> Sync(uint64_t target, double timeout) {
    const int timeout_ms = Millis(timeout);
    std::vector<StepResult> steps;
    FollowOptions follow;
    // Folds stop at the target, so no version past it is activated.
    if (target != 0) follow.until = target;
    follow.step_first = true;
    follow.until_idle = target == 0;
    follow.timeout_ms = timeout_ms;
    follow.poll_ms = poll_ms_;
    follow.on_step = [&](const StepResult& r) { steps.push_back(r); };
    bool interrupted = false;
    follow.stop = [&] {
      py::gil_scoped_acquire acquire;
      interrupted = PyErr_CheckSignals() != 0;
      return interrupted;
    };
    FollowResult r;
    {
      py::gil_scoped_release release;
      r = Unwrap(Follow(*rcv_, follow));
    }
    if (interrupted) throw py::error_already_set();
    if (r.end == FollowEnd::kTimedOut) {
      throw StatusError(DeadlineExceededError(
          "the receiver did not reach version " + std::to_string(target) +
          " within " + std::to_string(timeout_ms) + " ms (active version " +
          std::to_string(rcv_->active_version()) + ")"));
    }
    return steps;
  }

 private:
  int poll_ms_;
  Borrowed held_;  // outlives rcv_, which writes into it (declared first)
  std::shared_ptr<ObjectStore> store_;
  std::unique_ptr<Receiver> rcv_;
};

double Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

void BindReports(py::module_& m) {
  py::class_<DiffReport>(m, "DiffReport")
      .def_readonly("tensors", &DiffReport::tensors)
      .def_readonly("changed_tensors", &DiffReport::changed_tensors)
      .def_readonly("total_elements", &DiffReport::total_elements)
      .def_readonly("changed_elements", &DiffReport::changed_elements)
      .def_readonly("full_bytes", &DiffReport::full_bytes)
      .def_readonly("chunks", &DiffReport::chunks)
      .def_readonly("payload_bytes", &DiffReport::payload_bytes)
      .def_readonly("chunk_bytes", &DiffReport::chunk_bytes)
      .def_readonly("file_bytes", &DiffReport::file_bytes)
      .def_readonly("chunks_by_kind", &DiffReport::chunks_by_kind)
      .def_readonly("seconds", &DiffReport::seconds)
      .def_property_readonly("changed_percent", [](const DiffReport& r) {
        return Percent(r.changed_elements, r.total_elements);
      })
      .def("__repr__", [](const DiffReport& r) {
        return "DiffReport(changed " + std::to_string(r.changed_elements) + " of " +
               std::to_string(r.total_elements) + " elements, " +
               std::to_string(r.file_bytes) + " delta bytes of " +
               std::to_string(r.full_bytes) + ")";
      });

  py::class_<ApplyReport>(m, "ApplyReport")
      .def_readonly("chunks", &ApplyReport::chunks)
      .def_readonly("chunks_applied", &ApplyReport::chunks_applied)
      .def_readonly("chunks_skipped", &ApplyReport::chunks_skipped)
      .def_readonly("chunks_restored", &ApplyReport::chunks_restored)
      .def_readonly("changed_elements", &ApplyReport::changed_elements)
      .def_readonly("checkpoint_bytes", &ApplyReport::checkpoint_bytes)
      .def_readonly("pages_written", &ApplyReport::pages_written)
      .def_readonly("page_size", &ApplyReport::page_size)
      .def_readonly("seconds", &ApplyReport::seconds)
      .def_readonly("headers_written", &ApplyReport::headers_written)
      .def_readonly("headers_unchanged", &ApplyReport::headers_unchanged)
      .def_readonly("headers_not_carried", &ApplyReport::headers_not_carried)
      .def("__repr__", [](const ApplyReport& r) {
        return "ApplyReport(" + std::to_string(r.chunks_applied) + " chunks applied, " +
               std::to_string(r.chunks_skipped) + " skipped, " +
               std::to_string(r.changed_elements) + " elements changed)";
      });

  py::class_<VerifyReport>(m, "VerifyReport")
      .def_readonly("matches_target", &VerifyReport::matches_target)
      .def_readonly("matches_base", &VerifyReport::matches_base)
      .def_readonly("tensors", &VerifyReport::tensors)
      .def_readonly("mismatched", &VerifyReport::mismatched)
      .def_readonly("headers_checked", &VerifyReport::headers_checked)
      .def_readonly("header_differs", &VerifyReport::header_differs)
      .def("__repr__", [](const VerifyReport& r) {
        return std::string("VerifyReport(matches_target=") +
               (r.matches_target ? "True" : "False") +
               ", matches_base=" + (r.matches_base ? "True" : "False") + ")";
      });

  py::class_<TensorInspect>(m, "TensorInspect")
      .def_readonly("name", &TensorInspect::name)
      .def_readonly("dtype", &TensorInspect::dtype)
      .def_readonly("elements", &TensorInspect::elements)
      .def_readonly("changed", &TensorInspect::changed)
      .def_readonly("chunks", &TensorInspect::chunks)
      .def_readonly("payload_bytes", &TensorInspect::payload_bytes)
      .def_readonly("chunk_bytes", &TensorInspect::chunk_bytes)
      .def_readonly("kinds", &TensorInspect::kinds)
      .def_readonly("bound_bytes", &TensorInspect::bound_bytes);

  py::class_<InspectReport>(m, "InspectReport")
      .def_readonly("format_version", &InspectReport::format_version)
      .def_readonly("version", &InspectReport::version)
      .def_readonly("base_version", &InspectReport::base_version)
      .def_readonly("file_bytes", &InspectReport::file_bytes)
      .def_readonly("total_elements", &InspectReport::total_elements)
      .def_readonly("changed_elements", &InspectReport::changed_elements)
      .def_readonly("full_bytes", &InspectReport::full_bytes)
      .def_readonly("chunks", &InspectReport::chunks)
      .def_readonly("payload_bytes", &InspectReport::payload_bytes)
      .def_readonly("chunk_bytes", &InspectReport::chunk_bytes)
      .def_readonly("kinds", &InspectReport::kinds)
      .def_readonly("bound_bytes", &InspectReport::bound_bytes)
      .def_readonly("bound_valid", &InspectReport::bound_valid)
      .def_readonly("tensors", &InspectReport::tensors)
      .def_property_readonly("changed_percent", [](const InspectReport& r) {
        return Percent(r.changed_elements, r.total_elements);
      })
      .def("__repr__", [](const InspectReport& r) {
        return "InspectReport(version " + std::to_string(r.version) + " from " +
               std::to_string(r.base_version) + ", " + std::to_string(r.changed_elements) +
               " changed elements, " + std::to_string(r.file_bytes) + " bytes)";
      });

  py::class_<PublishReport>(m, "PublishReport")
      .def_readonly("version", &PublishReport::version)
      .def_readonly("base_version", &PublishReport::base_version)
      .def_readonly("committed", &PublishReport::committed)
      .def_readonly("dropped", &PublishReport::dropped)
      .def_readonly("reason", &PublishReport::reason)
      .def_readonly("diff", &PublishReport::diff)
      .def_readonly("bytes_uploaded", &PublishReport::bytes_uploaded)
      .def_readonly("resends_served", &PublishReport::resends_served)
      .def_readonly("encode_upload_seconds", &PublishReport::encode_upload_seconds)
      .def_readonly("commit_seconds", &PublishReport::commit_seconds)
      .def_readonly("seconds", &PublishReport::seconds)
      .def_readonly("snapshot", &PublishReport::snapshot)
      .def_readonly("versions_deleted", &PublishReport::versions_deleted)
      .def_readonly("snapshots_deleted", &PublishReport::snapshots_deleted)
      .def_readonly("retention_error", &PublishReport::retention_error)
      .def_property_readonly("changed_percent", [](const PublishReport& r) {
        return Percent(r.diff.changed_elements, r.diff.total_elements);
      })
      .def_property_readonly("full_bytes", [](const PublishReport& r) { return r.diff.full_bytes; })
      .def("__repr__", [](const PublishReport& r) {
        char pct[32];
        std::snprintf(pct, sizeof pct, "%.3f",
                      Percent(r.diff.changed_elements, r.diff.total_elements));
        return "PublishReport(version " + std::to_string(r.version) +
               (r.committed ? " committed" : " aborted") + ", changed " + pct + "%, " +
               std::to_string(r.bytes_uploaded) + " bytes uploaded of " +
               std::to_string(r.diff.full_bytes) + ")";
      });

  py::class_<StepResult>(m, "StepResult")
      .def_property_readonly(
          "outcome",
          [](const StepResult& r) { return OutcomeName(r.outcome, '_'); })
      .def_readonly("version", &StepResult::version)
      .def_readonly("chunks_applied", &StepResult::chunks_applied)
      .def_readonly("chunks_skipped", &StepResult::chunks_skipped)
      .def_readonly("chunks_resent", &StepResult::chunks_resent)
      .def_readonly("changed_elements", &StepResult::changed_elements)
      .def_readonly("bytes_fetched", &StepResult::bytes_fetched)
      .def_readonly("chunks_before_manifest",
                    &StepResult::chunks_before_manifest)
      .def_readonly("chunks_read_early", &StepResult::chunks_read_early)
      .def_readonly("seconds", &StepResult::seconds)
      .def_readonly("tail_seconds", &StepResult::tail_seconds)
      .def_readonly("versions_folded", &StepResult::versions_folded)
      .def_readonly("recovered", &StepResult::recovered)
      .def_readonly("pause_seconds", &StepResult::pause_seconds)
      .def_readonly("pause_kernel_ms", &StepResult::pause_kernel_ms)
      .def_readonly("pause_verify_ms", &StepResult::pause_verify_ms)
      .def_readonly("staged_host_bytes", &StepResult::staged_host_bytes)
      .def_readonly("staged_device_bytes", &StepResult::staged_device_bytes)
      .def_readonly("seal_seconds", &StepResult::seal_seconds)
      .def_readonly("after_hash_seconds", &StepResult::after_hash_seconds)
      .def_readonly("base_from_kept_digests", &StepResult::base_from_kept_digests)
      .def_readonly("changed_tensors", &StepResult::changed_tensors)
      .def_property_readonly(
          "stages",
          [](const StepResult& r) {
            const StepResult::Stages& s = r.stages;
            py::dict d;
            d["base_check"] = s.base_check;
            d["fetch"] = s.fetch;
            d["chunk_wait"] = s.chunk_wait;
            d["apply_wait"] = s.apply_wait;
            d["apply_cpu"] = s.apply_cpu;
            d["check"] = s.check;
            d["flush"] = s.flush;
            d["vote"] = s.vote;
            d["decision_wait"] = s.decision_wait;
            d["activate"] = s.activate;
            return d;
          })
      .def("__repr__", [](const StepResult& r) {
        return std::string("StepResult(") + OutcomeName(r.outcome, '_') +
               " version " + std::to_string(r.version) + ", " +
               std::to_string(r.changed_tensors.size()) + " tensors changed)";
      });
}

// The diff functions' options; chunk_bytes 0 keeps the default.
DiffOptions MakeDiffOptions(uint64_t version, uint64_t base_version, uint64_t chunk_bytes,
                            int threads, bool allow_xor) {
  DiffOptions o;
  o.version = version;
  o.base_version = base_version;
  if (chunk_bytes != 0) o.chunk_bytes = chunk_bytes;
  o.threads = threads;
  o.allow_xor = allow_xor;
  return o;
}

void BindFunctions(py::module_& m) {
  m.def(
      "diff_paths",
      [](const std::string& base, const std::string& target, const std::string& out,
         uint64_t version, uint64_t base_version, uint64_t chunk_bytes, int threads,
         bool allow_xor) {
        const DiffOptions o =
            MakeDiffOptions(version, base_version, chunk_bytes, threads, allow_xor);
        py::gil_scoped_release release;
        return Unwrap(Diff(base, target, out, o));
      },
      py::arg("base"), py::arg("target"), py::arg("out"), py::arg("version"),
      py::arg("base_version"), py::arg("chunk_bytes"), py::arg("threads"),
      py::arg("allow_xor"));

  m.def(
      "diff_tensors",
      [](py::handle base, py::handle target, const std::string& out, uint64_t version,
         uint64_t base_version, uint64_t chunk_bytes, int threads, bool allow_xor) {
        Borrowed b = Unwrap(BorrowAll(base, false));
        Borrowed t = Unwrap(BorrowAll(target, false));
        std::vector<TensorView> bv = Views(b), tv = Views(t);
        const DiffOptions o =
            MakeDiffOptions(version, base_version, chunk_bytes, threads, allow_xor);
        py::gil_scoped_release release;
        return Unwrap(DiffTensors(bv, tv, out, o));
      },
      py::arg("base"), py::arg("target"), py::arg("out"), py::arg("version"),
      py::arg("base_version"), py::arg("chunk_bytes"), py::arg("threads"),
      py::arg("allow_xor"));

  m.def(
      "apply_path",
      [](const std::string& delta, const std::string& checkpoint, int threads, bool sync) {
        ApplyOptions o;
        o.threads = threads;
        o.sync = sync;
        py::gil_scoped_release release;
        return Unwrap(Apply(delta, checkpoint, o));
      },
      py::arg("delta"), py::arg("checkpoint"), py::arg("threads"), py::arg("sync"));

  m.def(
      "apply_tensors",
      [](const std::string& delta, py::handle tensors, int threads) {
        Borrowed b = Unwrap(BorrowAll(tensors, /*writable=*/true));
        std::vector<MutableTensorView> views = MutableViews(b);
        ApplyOptions o;
        o.threads = threads;
        o.sync = false;
        py::gil_scoped_release release;
        return Unwrap(ApplyToTensors(delta, views, o));
      },
      py::arg("delta"), py::arg("tensors"), py::arg("threads"));

  m.def(
      "verify",
      [](const std::string& checkpoint, const std::string& delta, int threads) {
        py::gil_scoped_release release;
        return Unwrap(Verify(checkpoint, delta, threads));
      },
      py::arg("checkpoint"), py::arg("delta"), py::arg("threads"));

  m.def(
      "inspect",
      [](const std::string& delta) {
        py::gil_scoped_release release;
        return Unwrap(Inspect(delta));
      },
      py::arg("delta"));

  m.def(
      "delta_tensors",
      [](const std::string& delta) {
        DeltaReader r = Unwrap(DeltaReader::Open(delta));
        py::list out;
        for (const TensorEntry& e : r.tensors()) {
          out.append(py::make_tuple(e.name, e.dtype, e.shape, e.before != e.after));
        }
        return py::make_tuple(r.version(), r.base_version(), out);
      },
      py::arg("delta"),
      "(version, base_version, [(name, dtype, shape, changed)]) from a delta's "
      "trailer, without decoding chunks.");

  m.def(
      "save",
      [](const std::string& path, py::handle tensors,
         const std::map<std::string, std::string>& metadata) {
        Borrowed b = Unwrap(BorrowAll(tensors, false));
        std::vector<SafetensorsTensorView> views;
        for (const auto& t : b) {
          views.push_back(SafetensorsTensorView{
              t->name(), t->dtype(), t->shape(), std::span<const uint8_t>(t->data(), t->byte_size())});
        }
        py::gil_scoped_release release;
        Check(WriteSafetensors(path, metadata, views));
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata"));

  m.def(
      "copy_checkpoint",
      [](const std::string& src, const std::string& dst) {
        py::gil_scoped_release release;
        Check(CopyCheckpoint(src, dst));
      },
      py::arg("src"), py::arg("dst"));

  m.def(
      "generate_ed25519",
      []() {
        auto pair = Unwrap(Authenticator::GenerateEd25519());
        return py::make_tuple(
            py::bytes(reinterpret_cast<const char*>(pair.first.data()), pair.first.size()),
            py::bytes(reinterpret_cast<const char*>(pair.second.data()), pair.second.size()));
      },
      "A fresh Ed25519 key pair: (private, public), 32 raw bytes each.");

  m.def(
      "data_address",
      [](const std::string& dtype, py::handle obj) {
        auto t = Unwrap(BorrowedTensor::Borrow("probe", dtype, obj, false));
        return reinterpret_cast<uintptr_t>(t->data());
      },
      py::arg("dtype"), py::arg("tensor"),
      "The address of the memory refit reads and writes for `tensor` (for tests "
      "of zero-copy behaviour).");
}

void BindClasses(py::module_& m) {
  py::class_<PyCheckpoint>(m, "Checkpoint")
      .def(py::init<const std::string&, bool>(), py::arg("path"), py::arg("writable"))
      .def_property_readonly("path", [](const PyCheckpoint& c) { return c.get().path(); })
      .def_property_readonly("sharded", [](const PyCheckpoint& c) { return c.get().sharded(); })
      .def_property_readonly(
          "writable",
          [](const PyCheckpoint& c) { return c.get().mode() == Checkpoint::Mode::kReadWrite; })
      .def("tensors",
           [](const PyCheckpoint& c) {
             py::list out;
             for (const TensorInfo& t : c.get().tensors()) {
               out.append(py::make_tuple(t.name, t.dtype, t.shape));
             }
             return out;
           })
      .def("array", &PyCheckpoint::Array, py::arg("name"))
      .def("sync", [](PyCheckpoint& c) {
        py::gil_scoped_release release;
        Check(c.get().Sync());
      });

  py::class_<PyPublisher>(m, "Publisher")
      .def(py::init<const std::string&, const std::string&, std::vector<std::string>,
                    const py::object&, const std::string&, const py::object&,
                    const std::string&, double, const std::string&, int, uint64_t, int,
                    uint64_t, uint64_t, const py::object&, bool, const std::string&, bool,
                    uint64_t>(),
           py::arg("store"), py::arg("baseline"), py::arg("members"), py::arg("key"),
           py::arg("key_file"), py::arg("sign_key"), py::arg("sign_key_file"),
           py::arg("vote_timeout"), py::arg("policy"), py::arg("threads"),
           py::arg("chunk_bytes"), py::arg("upload_threads"), py::arg("snapshot_every"),
           py::arg("keep_versions"), py::arg("device_initial") = py::none(),
           py::arg("pinned_host") = false, py::arg("durable_path") = "",
           py::arg("conditional") = false, py::arg("pack_bytes") = 0)
      .def_property_readonly("committed_version", &PyPublisher::committed_version)
      .def_property_readonly("device", &PyPublisher::device)
      .def("durable", &PyPublisher::Durable)
      .def("flush_durable", &PyPublisher::FlushDurable)
      .def("publish", &PyPublisher::Publish, py::arg("version"), py::arg("tensors"))
      .def("publish_checkpoint", &PyPublisher::PublishCheckpoint, py::arg("version"),
           py::arg("path"))
      .def("serve", &PyPublisher::Serve, py::arg("version"), py::arg("seconds"));

  py::class_<PyRankPublisher>(m, "RankPublisher")
      .def(py::init<const std::string&, const std::string&, const std::string&, uint32_t,
                    int64_t, const std::string&, const py::object&, const py::object&,
                    const std::string&, int, uint64_t, int, int, const py::object&,
                    uint64_t>(),
           py::arg("store"), py::arg("parts"), py::arg("layout"), py::arg("rank"),
           py::arg("committed"), py::arg("baseline"), py::arg("initial"), py::arg("key"),
           py::arg("key_file"), py::arg("threads"), py::arg("chunk_bytes"),
           py::arg("upload_threads"), py::arg("device") = -1,
           py::arg("initial_amax") = py::none(), py::arg("pack_bytes") = 0)
      .def_property_readonly("committed_version", &PyRankPublisher::committed_version)
      .def_property_readonly("owned_bytes", &PyRankPublisher::owned_bytes)
      .def("publish", &PyRankPublisher::Publish, py::arg("version"), py::arg("tensors"),
           py::arg("amax") = py::none())
      .def("await_decision", &PyRankPublisher::AwaitDecision, py::arg("timeout"));

  py::class_<PyCoordinator>(m, "Coordinator")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, std::vector<std::string>, std::vector<uint32_t>,
                    const py::object&, const std::string&, double, double, int>(),
           py::arg("store"), py::arg("parts"), py::arg("baseline"), py::arg("staging"),
           py::arg("members"), py::arg("ranks"), py::arg("key"), py::arg("key_file"),
           py::arg("vote_timeout"), py::arg("parts_timeout"), py::arg("threads"))
      .def_property_readonly("committed_version", &PyCoordinator::committed_version)
      .def("publish", &PyCoordinator::Publish, py::arg("version"));

  py::class_<PyStore>(m, "Store")
      .def(py::init<const std::string&>(), py::arg("url"))
      .def("get", &PyStore::Get, py::arg("key"))
      .def("put", &PyStore::Put, py::arg("key"), py::arg("data"))
      .def("list", &PyStore::List, py::arg("prefix") = "")
      .def("delete", &PyStore::Delete, py::arg("key"));

  py::class_<PyDirectCoordinator>(m, "DirectCoordinator")
      .def(py::init<const std::string&, std::vector<std::string>, std::vector<uint32_t>,
                    const py::object&, const std::string&, double, double,
                    const std::string&>(),
           py::arg("store"), py::arg("members"), py::arg("ranks"), py::arg("key"),
           py::arg("key_file"), py::arg("vote_timeout"), py::arg("parts_timeout"),
           py::arg("table"))
      .def_property_readonly("committed_version", &PyDirectCoordinator::committed_version)
      .def("publish", &PyDirectCoordinator::Publish, py::arg("version"))
      .def("parts_stored", &PyDirectCoordinator::PartsStored, py::arg("version"));

  py::class_<PyReceiver>(m, "Receiver")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const py::object&, const std::string&, const py::object&,
                    const std::string&, const py::object&, const std::string&,
                    int, double, double, double, int, const std::string&,
                    const std::string&, uint32_t, uint64_t, uint64_t>(),
           py::arg("store"), py::arg("member"), py::arg("checkpoint"),
           py::arg("tensors"), py::arg("state_dir"), py::arg("key"),
           py::arg("key_file"), py::arg("verify_key"),
           py::arg("verify_key_file"), py::arg("threads"),
           py::arg("poll_interval"), py::arg("decision_timeout"),
           py::arg("resend_timeout"), py::arg("max_fold_versions"),
           py::arg("two_phase") = "", py::arg("layout_json") = "",
           py::arg("rank") = 0, py::arg("device_staging") = uint64_t{512} << 20,
           py::arg("host_staging") = uint64_t{8} << 30)
      .def_property_readonly("active_version", &PyReceiver::active_version)
      .def_property_readonly("prepared", &PyReceiver::prepared)
      .def("prepare", &PyReceiver::Prepare, py::arg("target"))
      .def("activate", &PyReceiver::Activate)
      .def("step", &PyReceiver::Step)
      .def("sync", &PyReceiver::Sync, py::arg("target"), py::arg("timeout"));
}

}  // namespace
}  // namespace refit::python

PYBIND11_MODULE(_native, m) {
  m.doc() = "refit's native core (use the refit package, not this module)";
  py::register_exception_translator(&refit::python::TranslateStatusError);
  refit::python::BindReports(m);
  refit::python::BindFunctions(m);
  refit::python::BindClasses(m);
#ifdef REFIT_PYTHON_CUDA
  refit::python::BindCuda(m, [](const refit::Status& s) { refit::python::Check(s); });
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
