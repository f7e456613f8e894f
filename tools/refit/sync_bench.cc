// `refit bench sync`: end-to-end distribution over a bandwidth-limited link
// (docs/benchmarks.md, "Distribution"). For each link rate and change rate
// it publishes one version with the real Publisher to in-process Receivers
// (threads) and measures the refit time, from the start of Publish() until
// every receiver has activated the version, against the ideal time of the
// bytes that crossed the link, and against sending the full checkpoint over
// the same link.
//
// The link is a ThrottledStore (a token bucket with no burst) on the path
// that crosses the cluster boundary: the publisher's store calls (its chunk,
// manifest, index, decision and head Puts, and its reads of the votes). With
// --throttle up (the default) the receivers read the store directly: it sits
// on their side of the boundary. With --throttle both, the receivers' reads
// share one more bucket at the same rate (the other direction of a
// full-duplex link). With --relay the store is a relay tree on loopback
// (RelayStore, root in the publisher); the link sits between the publisher
// and the root, and the run is made with 1 receiver and with N, in the same
// process, for the comparison.
//
// Versions are chained like an RL trajectory: version k is version k-1
// evolved (synth.h, EvolveModel) at the run's change rate, and the
// publisher's baseline and every receiver's checkpoint advance with each
// commit, so no checkpoint is copied between runs. The publisher and the
// receivers live across versions, as in a deployment (what they keep from
// one version to the next counts); each version gets a fresh link. Objects
// are sealed with HMAC-SHA256 as in a real deployment. Nothing here is
// shared between threads except the stores (thread-safe) and the
// receivers' results.
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/parallel.h"
#include "cli_util.h"
#include "commands.h"
#include "flag_checks.h"
#include "refit/auth.h"
#include "refit/checkpoint.h"
#include "delta/detect.h"
#include "scratch_dir.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "sync/relay_tree.h"
#include "synth.h"
#include "transport/memory_store.h"
#include "transport/object_store.h"
#include "transport/relay_store.h"
#include "transport/throttled_store.h"

namespace refit::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kCmd = "bench sync";

struct SyncBenchArgs {
  double size_mib = 1024;
  std::vector<std::string> rates = {"1%", "3%", "5%"};
  std::vector<double> link_mbit = {1000, 100};
  int receivers = 0;  // 0: 1, or 16 with --relay
  bool relay = false;
  // Receivers hold their tensors in host memory (ReceiverOptions::tensors,
  // an inference worker's weights) instead of a checkpoint file each.
  bool in_memory = false;
  int fanout = 4;
  std::string throttle = "up";
  // The store without --relay: "dir" (a directory store, files fsynced) or
  // "memory" (MemoryStore: the protocol's own costs, no file system).
  std::string store = "dir";
  std::string fixtures;  // a folder with step0/step1.safetensors
  double chunk_mib = 8;
  int threads = 0;
  int upload_threads = 4;
  int poll_ms = 20;
  int full_base_check_every = ReceiverOptions().full_base_check_every;
  int full_baseline_check_every = PublisherOptions().full_baseline_check_every;
  double full_measure_max_s = 40;
  uint64_t seed = 1;
  // Versions may carry conditional XOR chunks (kind 5).
  bool conditional = false;
  // > 0: the publisher (its encoder and upload threads) runs on the first
  // this many CPUs of the process's set and the receivers on the others, as
  // if on hosts of their own; 0: every party on every CPU.
  int publisher_cores = 0;
  // Untimed versions (at the first rate and link) before the rows, so that
  // the rows show the steady state rather than the first version's full
  // base checks.
  int warmup = 0;
  // Checkpoint receivers without ReceiverOptions::early_writeback.
  bool no_early_writeback = false;
  bool json = false;
};

// The CPUs this process may run on, in order.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// Limits the calling thread, and the threads it creates from now on, to
// `cpus` (none: left as it is).
Status PinTo(const std::vector<int>& cpus) {
  if (cpus.empty()) return Status::Ok();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return UnavailableError(std::string("sched_setaffinity: ") + std::strerror(errno));
  }
  return Status::Ok();
}

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Counts the payload bytes of the calls that pass through it (the bytes a
// ThrottledStore below it charges). Thread-safe.
class CountingStore final : public ForwardingStore {
 public:
  explicit CountingStore(std::shared_ptr<ObjectStore> inner)
      : ForwardingStore(std::move(inner)) {}
  uint64_t put_bytes() const { return put_.load(); }
  uint64_t get_bytes() const { return get_.load(); }

  Status Put(std::string_view key, std::span<const uint8_t> data) override {
    put_ += data.size();
    return inner()->Put(key, data);
  }
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override {
    put_ += data.size();
    return inner()->PutIfAbsent(key, data);
  }
  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    Result<std::vector<uint8_t>> r = inner()->Get(key);
    if (r.ok()) get_ += r->size();
    return r;
  }

 private:
  std::atomic<uint64_t> put_{0};
  std::atomic<uint64_t> get_{0};
};

// Forwards every call to the store set last: the link of the version being
// published, so that the publisher and the receivers, which keep their
// store, get a fresh link per version. Thread-safe.
class SwitchableStore final : public ObjectStore {
 public:
  void Set(std::shared_ptr<ObjectStore> inner) {
    std::lock_guard<std::mutex> lock(mu_);
    inner_ = std::move(inner);
  }

  std::string Describe() const override { return Current()->Describe(); }
  Status Put(std::string_view key, std::span<const uint8_t> data) override {
    return Current()->Put(key, data);
  }
  Status PutIfAbsent(std::string_view key,
                     std::span<const uint8_t> data) override {
    return Current()->PutIfAbsent(key, data);
  }
  Result<std::vector<uint8_t>> Get(std::string_view key) override {
    return Current()->Get(key);
  }
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    return Current()->List(prefix);
  }
  Status Delete(std::string_view key) override {
    return Current()->Delete(key);
  }
  // Every link wraps the same backend, so counts carry across links.
  uint64_t ChangeCount() override { return Current()->ChangeCount(); }
  void AwaitChange(uint64_t since, int timeout_ms) override {
    Current()->AwaitChange(since, timeout_ms);
  }

 private:
  std::shared_ptr<ObjectStore> Current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_;
  }
  mutable std::mutex mu_;
  std::shared_ptr<ObjectStore> inner_;
};

// A read-only mapping of a whole file (the full checkpoint to send).
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return UnavailableError("cannot open '" + path + "'");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      return UnavailableError("cannot stat '" + path + "'");
    }
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                     MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return UnavailableError("cannot map '" + path + "'");
    return std::unique_ptr<MappedFile>(new MappedFile(
        static_cast<uint8_t*>(p), static_cast<size_t>(st.st_size)));
  }
  ~MappedFile() { ::munmap(data_, size_); }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  MappedFile(uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  size_t size_;
};

// One publisher and its receivers over one store (a directory, or a relay
// tree on loopback), with their checkpoints in a scratch directory. The
// link stores are made per version (a fresh token bucket each time).
class Fleet {
 public:
  static Result<std::unique_ptr<Fleet>> Create(const SyncBenchArgs& args,
                                               const std::string& base_path,
                                               int receivers, bool relay) {
    std::unique_ptr<Fleet> f(new Fleet());
    f->args_ = &args;
    if (args.publisher_cores > 0) {
      const std::vector<int> all = AllowedCpus();
      const size_t n = static_cast<size_t>(args.publisher_cores);
      if (n >= all.size()) {
        return InvalidArgumentError(
            "--publisher-cores must leave CPUs for the receivers: this process may run on " +
            std::to_string(all.size()));
      }
      f->all_cpus_ = all;
      f->publisher_cpus_.assign(all.begin(), all.begin() + static_cast<ptrdiff_t>(n));
      f->receiver_cpus_.assign(all.begin() + static_cast<ptrdiff_t>(n), all.end());
    }
    REFIT_ASSIGN_OR_RETURN(ScratchDir dir,
                           ScratchDir::Create("refit-syncbench"));
    f->dir_.emplace(std::move(dir));
    std::vector<uint8_t> key(32);
    for (size_t i = 0; i < key.size(); ++i)
      key[i] = static_cast<uint8_t>(i * 37 + 11);
    REFIT_ASSIGN_OR_RETURN(f->auth_, Authenticator::Hmac(key));
    f->publisher_ckpt_ = f->dir_->File("publisher.safetensors");
    REFIT_RETURN_IF_ERROR(CopyCheckpoint(base_path, f->publisher_ckpt_));
    std::optional<Checkpoint> base;
    if (args.in_memory) {
      REFIT_ASSIGN_OR_RETURN(
          Checkpoint c, Checkpoint::Open(base_path, Checkpoint::Mode::kReadOnly));
      base.emplace(std::move(c));
    }
    for (int i = 0; i < receivers; ++i) {
      std::string member = fmt::format("r{}", i);
      f->members_.push_back(member);
      f->ckpts_.push_back(f->dir_->File(member + ".safetensors"));
      f->states_.push_back(f->dir_->File(member + ".state"));
      if (base) {
        f->memory_.push_back(CopyToMemory(*base, &f->memory_views_.emplace_back()));
      } else {
        REFIT_RETURN_IF_ERROR(CopyCheckpoint(base_path, f->ckpts_.back()));
      }
      std::error_code ec;
      fs::create_directories(f->states_.back(), ec);
      if (ec) return UnavailableError("cannot create " + f->states_.back());
    }
    if (relay) {
      REFIT_RETURN_IF_ERROR(f->BuildTree());
    } else if (args.store == "memory") {
      f->backend_ = std::make_shared<MemoryStore>();
    } else {
      REFIT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store,
                             OpenObjectStore(f->dir_->File("store")));
      f->backend_ = std::move(store);
    }
    return f;
  }

  ~Fleet() {
    // The parties first, then the stores they use.
    rx_.clear();
    publisher_.reset();
    // Leaves first, then the root: no endpoint outlives its parent's need.
    while (!nodes_.empty()) nodes_.pop_back();
    root_.reset();
    backend_.reset();
  }

  int receivers() const { return static_cast<int>(members_.size()); }
  bool relay() const { return root_ != nullptr; }
  const std::shared_ptr<ObjectStore>& backend() const { return backend_; }

  struct VersionResult {
    uint64_t version = 0;
    bool committed = false;
    PublishReport publish;
    uint64_t up_put_bytes = 0;  // bytes the publisher put through the link
    uint64_t up_get_bytes = 0;  // bytes it read through it (votes)
    uint64_t down_bytes = 0;    // bytes the receivers read (all of them)
    double refit_seconds = 0;   // Publish start -> every receiver active
    double first_active_seconds = 0;
    double apply_seconds_max = 0;     // longest receiver ProcessVersion
    double tail_seconds_max = 0;      // longest manifest-seen -> vote
    uint64_t early_chunks_min = 0;    // fewest chunks a receiver applied
                                      // before the manifest arrived
    double relay_index_seconds = -1;  // last node got v/<V>/manifest (relay)
    // Where the receiver that finished last spent its step.
    StepResult::Stages receiver_stages;
    std::string error;
  };

  // Publishes `target` as the next version over a link of `bytes_per_second`
  // and waits for every receiver to activate it.
  Result<VersionResult> PublishVersion(const std::vector<TensorView>& target,
                                       double bytes_per_second,
                                       bool throttle_down) {
    VersionResult out;
    out.version = ++version_;
    auto link = std::make_shared<CountingStore>(
        std::make_shared<ThrottledStore>(backend_, bytes_per_second));
    publisher_link_.Set(link);
    if (!publisher_) {
      PublisherOptions popt;
      popt.members = members_;
      popt.auth = auth_;
      popt.diff.chunk_bytes =
          static_cast<uint64_t>(std::llround(args_->chunk_mib * (1 << 20)));
      popt.diff.threads = args_->threads;
      popt.diff.allow_conditional = args_->conditional;
      popt.vote_timeout_ms = 300000;
      popt.upload_threads = args_->upload_threads;
      popt.poll_ms = args_->poll_ms;
      popt.full_baseline_check_every = args_->full_baseline_check_every;
      REFIT_ASSIGN_OR_RETURN(
          publisher_, Publisher::Open(&publisher_link_, publisher_ckpt_, popt));
    }

    // Receivers' stores: their relay node, or the directory (through one
    // shared downlink bucket with --throttle both).
    std::vector<std::shared_ptr<CountingStore>> down;
    std::shared_ptr<CountingStore> shared_down;
    if (!relay()) {
      std::shared_ptr<ObjectStore> inner = backend_;
      if (throttle_down)
        inner = std::make_shared<ThrottledStore>(backend_, bytes_per_second);
      shared_down = std::make_shared<CountingStore>(inner);
    }
    for (size_t i = 0; i < members_.size(); ++i) {
      down.push_back(relay() ? std::make_shared<CountingStore>(nodes_[i])
                             : shared_down);
      if (receiver_links_.size() <= i)
        receiver_links_.push_back(std::make_unique<SwitchableStore>());
      receiver_links_[i]->Set(down.back());
    }
    for (size_t i = rx_.size(); i < members_.size(); ++i) {
      ReceiverOptions ropt;
      ropt.member = members_[i];
      if (memory_views_.empty()) {
        ropt.checkpoint = ckpts_[i];
      } else {
        ropt.tensors = memory_views_[i];
      }
      ropt.state_dir = states_[i];
      ropt.auth = auth_;
      ropt.poll_ms = args_->poll_ms;
      ropt.decision_timeout_ms = 300000;
      ropt.full_base_check_every = args_->full_base_check_every;
      ropt.early_writeback = !args_->no_early_writeback;
      REFIT_ASSIGN_OR_RETURN(std::unique_ptr<Receiver> r,
                             Receiver::Open(receiver_links_[i].get(), ropt));
      rx_.push_back(std::move(r));
    }
    std::vector<std::unique_ptr<Receiver>>& rx = rx_;
    const uint64_t link_put0 = link->put_bytes();
    const uint64_t link_get0 = link->get_bytes();
    if (relay()) {
      watch_key_ = ManifestKey(out.version);
      for (int i = 0; i < receivers(); ++i)
        arrival_ns_[static_cast<size_t>(i)] = -1;
    }

    const size_t n = rx.size();
    std::vector<Clock::time_point> done(n);
    std::vector<Status> status(n);
    std::vector<double> step_seconds(n, 0);
    std::vector<double> tail_seconds(n, 0);
    std::vector<uint64_t> early(n, 0);
    std::vector<StepResult::Stages> stages(n);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        if (Status pinned = PinTo(receiver_cpus_); !pinned.ok()) {
          status[i] = pinned;
          return;
        }
        Result<StepResult> r = rx[i]->SyncTo(out.version, 600000);
        done[i] = Clock::now();
        if (r.ok()) {
          step_seconds[i] = r->seconds;
          tail_seconds[i] = r->tail_seconds;
          early[i] = r->chunks_before_manifest;
          stages[i] = r->stages;
        } else {
          status[i] = r.status();
        }
      });
    }
    const Clock::time_point t0 = Clock::now();
    t0_ns_ = t0.time_since_epoch().count();
    Status pinned = PinTo(publisher_cpus_);
    Result<PublishReport> report =
        pinned.ok() ? publisher_->Publish(out.version, target) : Result<PublishReport>(pinned);
    Status unpinned = PinTo(all_cpus_);
    for (std::thread& t : threads) t.join();
    REFIT_RETURN_IF_ERROR(unpinned);
    if (!report.ok())
      return report.status().WithContext("publishing version " +
                                         std::to_string(out.version));
    for (size_t i = 0; i < n; ++i) {
      if (!status[i].ok()) {
        return status[i].WithContext("receiver " + members_[i]);
      }
    }
    out.publish = *report;
    out.committed = report->committed;
    out.up_put_bytes = link->put_bytes() - link_put0;
    out.up_get_bytes = link->get_bytes() - link_get0;
    for (size_t i = 0; i < n; ++i) {
      if (i == 0 || down[i] != down[i - 1])
        out.down_bytes += down[i]->get_bytes();
    }
    auto last_done = std::max_element(done.begin(), done.end());
    out.receiver_stages = stages[static_cast<size_t>(last_done - done.begin())];
    Clock::time_point last = *last_done;
    Clock::time_point first = *std::min_element(done.begin(), done.end());
    out.refit_seconds = Seconds(last - t0);
    out.first_active_seconds = Seconds(first - t0);
    out.apply_seconds_max =
        *std::max_element(step_seconds.begin(), step_seconds.end());
    out.tail_seconds_max =
        *std::max_element(tail_seconds.begin(), tail_seconds.end());
    out.early_chunks_min = *std::min_element(early.begin(), early.end());
    if (relay()) {
      int64_t latest = -1;
      bool all = true;
      for (int i = 0; i < receivers(); ++i) {
        int64_t at = arrival_ns_[static_cast<size_t>(i)].load();
        if (at < 0) all = false;
        latest = std::max(latest, at);
      }
      if (all) {
        out.relay_index_seconds = Seconds(Clock::duration(latest - t0_ns_));
      }
    }
    if (!out.committed) out.error = report->reason;
    return out;
  }

 private:
  Fleet() = default;

  // One receiver's tensors in host memory: a copy of every tensor of `ckpt`
  // in one buffer, and views of them in `views`.
  static std::unique_ptr<uint8_t[]> CopyToMemory(
      const Checkpoint& ckpt, std::vector<MutableTensorView>* views) {
    std::vector<TensorView> from = CheckpointViews(ckpt);
    size_t total = 0;
    for (const TensorView& v : from) total += TensorBytes(v);
    auto buffer = std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(total, 1));
    size_t at = 0;
    for (const TensorView& v : from) {
      const size_t n = TensorBytes(v);
      std::memcpy(buffer.get() + at, v.data, n);
      views->push_back({v.name, v.dtype, v.width, v.shape, buffer.get() + at});
      at += n;
    }
    return buffer;
  }
  static size_t TensorBytes(const TensorView& v) {
    size_t n = static_cast<size_t>(v.width);
    for (uint64_t d : v.shape) n *= static_cast<size_t>(d);
    return n;
  }

  Status BuildTree() {
    const int n = receivers();
    arrival_ns_ =
        std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(n));
    RelayOptions base;
    base.keys = ProtocolRelayKeys();
    base.log_to_stderr = true;
    REFIT_ASSIGN_OR_RETURN(std::unique_ptr<RelayStore> root,
                           RelayStore::Root("127.0.0.1:0", base));
    root_ = std::shared_ptr<RelayStore>(std::move(root));
    backend_ = root_;
    REFIT_ASSIGN_OR_RETURN(std::vector<int> parents,
                           RelayTreeParents(n, args_->fanout));
    for (int i = 0; i < n; ++i) {
      int p = parents[static_cast<size_t>(i)];
      std::string parent =
          p < 0 ? root_->listen_address()
                : nodes_[static_cast<size_t>(p)]->listen_address();
      bool has_children =
          std::find(parents.begin(), parents.end(), i) != parents.end();
      RelayOptions o = base;
      o.on_arrival = [this, i](const std::string& key) {
        if (key == watch_key_) {
          arrival_ns_[static_cast<size_t>(i)].store(
              Clock::now().time_since_epoch().count());
        }
      };
      REFIT_ASSIGN_OR_RETURN(
          std::unique_ptr<RelayStore> node,
          RelayStore::Node(members_[static_cast<size_t>(i)], parent,
                           has_children ? "127.0.0.1:0" : "", o));
      nodes_.push_back(std::shared_ptr<RelayStore>(std::move(node)));
    }
    // Every node connected before the first version.
    auto deadline = Clock::now() + std::chrono::seconds(20);
    for (;;) {
      bool all = true;
      for (const auto& node : nodes_)
        all = all && node->status().parent_connected;
      if (all) break;
      if (Clock::now() > deadline) {
        return UnavailableError("relay tree did not connect within 20 s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Status::Ok();
  }

  const SyncBenchArgs* args_ = nullptr;
  // --publisher-cores: the process's CPUs, and the publisher's and the
  // receivers' shares of them (empty: not pinned).
  std::vector<int> all_cpus_, publisher_cpus_, receiver_cpus_;
  std::optional<ScratchDir> dir_;
  Authenticator auth_ = Authenticator::None();
  std::string publisher_ckpt_;
  std::vector<std::string> members_, ckpts_, states_;
  // --in-memory: each receiver's tensors (views into its buffer).
  std::vector<std::unique_ptr<uint8_t[]>> memory_;
  std::vector<std::vector<MutableTensorView>> memory_views_;
  std::shared_ptr<ObjectStore> backend_;
  // The publisher and the receivers, and the stores they keep: each
  // version points them at its own link.
  SwitchableStore publisher_link_;
  std::vector<std::unique_ptr<SwitchableStore>> receiver_links_;
  std::unique_ptr<Publisher> publisher_;
  std::vector<std::unique_ptr<Receiver>> rx_;
  std::shared_ptr<RelayStore> root_;
  std::vector<std::shared_ptr<RelayStore>> nodes_;
  uint64_t version_ = 0;
  // Relay: when v/<V>/manifest (the last object of the upload) of the
  // version in flight reached each node. The
  // key is written before the version starts and read by the I/O threads.
  std::string watch_key_;
  std::unique_ptr<std::atomic<int64_t>[]> arrival_ns_;
  int64_t t0_ns_ = 0;
};

struct FullSend {
  double mbit = 0;
  uint64_t bytes = 0;
  double wire_seconds = 0;       // bytes / link rate
  double measured_seconds = -1;  // a Put through the link; -1: not measured
};

// Sends the full checkpoint file through a fresh link to `backend` (a Put,
// then the object is deleted) when its wire time is at most `max_seconds`.
Result<FullSend> MeasureFullSend(const std::shared_ptr<ObjectStore>& backend,
                                 const std::string& path, double mbit,
                                 double max_seconds, bool can_measure) {
  FullSend f;
  f.mbit = mbit;
  f.bytes = fs::file_size(path);
  double bps = mbit * 1e6 / 8;
  f.wire_seconds = static_cast<double>(f.bytes) / bps;
  if (!can_measure || f.wire_seconds > max_seconds) return f;
  REFIT_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file,
                         MappedFile::Open(path));
  auto link = std::make_shared<ThrottledStore>(backend, bps);
  Clock::time_point t0 = Clock::now();
  REFIT_RETURN_IF_ERROR(link->Put("full/checkpoint", file->bytes()));
  f.measured_seconds = Seconds(Clock::now() - t0);
  REFIT_RETURN_IF_ERROR(backend->Delete("full/checkpoint"));
  return f;
}

struct Row {
  std::string input;
  double rate = 0;  // 0 for a fixture pair
  double mbit = 0;
  int receivers = 0;
  Fleet::VersionResult v;
  double ideal_seconds = 0;
  FullSend full;
};

double IdealSeconds(const Fleet::VersionResult& v, double mbit, bool both) {
  double bps = mbit * 1e6 / 8;
  double up = static_cast<double>(v.up_put_bytes);
  double down = both ? static_cast<double>(v.down_bytes) : 0.0;
  return std::max(up, down) / bps;
}

// The encode pass of a row: model bytes per second of the encode stage and
// per encoder thread.
double EncodePerThread(const Fleet::VersionResult& v) {
  const DiffReport& d = v.publish.diff;
  const double s = v.publish.stages.encode;
  return d.threads > 0 && s > 0
             ? static_cast<double>(d.full_bytes) / s / d.threads
             : 0;
}

Json RowJson(const Row& r) {
  const Fleet::VersionResult& v = r.v;
  Json j = {
      {"input", r.input},
      {"rate", r.rate},
      {"link_mbit", r.mbit},
      {"receivers", r.receivers},
      {"version", v.version},
      {"committed", v.committed},
      {"changed_elements", v.publish.diff.changed_elements},
      {"total_elements", v.publish.diff.total_elements},
      {"chunks", v.publish.diff.chunks},
      {"payload_bytes", v.up_put_bytes},
      {"publisher_read_bytes", v.up_get_bytes},
      {"receiver_read_bytes", v.down_bytes},
      {"ideal_s", r.ideal_seconds},
      {"refit_s", v.refit_seconds},
      {"refit_over_ideal", v.refit_seconds / r.ideal_seconds},
      {"upload_s", v.publish.encode_upload_seconds},
      {"first_receiver_active_s", v.first_active_seconds},
      {"receiver_step_max_s", v.apply_seconds_max},
      {"receiver_tail_max_s", v.tail_seconds_max},
      {"chunks_applied_before_manifest_min", v.early_chunks_min},
      {"publish_return_s", v.publish.seconds},
      {"full_bytes", r.full.bytes},
      {"full_wire_s", r.full.wire_seconds},
      {"speedup_full_wire_over_refit", r.full.wire_seconds / v.refit_seconds}};
  j["full_measured_s"] = r.full.measured_seconds >= 0
                             ? Json(r.full.measured_seconds)
                             : Json(nullptr);
  j["relay_manifest_at_last_node_s"] =
      v.relay_index_seconds >= 0 ? Json(v.relay_index_seconds) : Json(nullptr);
  const PublishReport::Stages& p = v.publish.stages;
  j["publisher_stages_s"] = {{"prepare", p.prepare},
                             {"encode", p.encode},
                             {"encode_blocked", p.encode_blocked},
                             {"upload_drain", p.upload_drain},
                             {"manifest", p.manifest},
                             {"vote_wait", p.vote_wait},
                             {"decision", p.decision},
                             {"advance", p.advance},
                             {"advance_sync", p.advance_sync},
                             {"finish", p.finish}};
  j["base_hashed"] = v.publish.base_hashed;
  j["advance_compared_bytes"] = v.publish.advance_compared_bytes;
  j["advance_stored_bytes"] = v.publish.advance_stored_bytes;
  j["encoder"] = {{"threads", v.publish.diff.threads},
                  {"gb_per_s_per_thread", EncodePerThread(v) / 1e9},
                  {"scan_worker_s", v.publish.diff.scan_seconds},
                  {"code_worker_s", v.publish.diff.code_seconds},
                  {"sink_s", v.publish.diff.sink_seconds}};
  const StepResult::Stages& q = v.receiver_stages;
  j["receiver_stages_s"] = {{"base_check", q.base_check},
                            {"fetch", q.fetch},
                            {"chunk_wait", q.chunk_wait},
                            {"apply_wait", q.apply_wait},
                            {"apply_cpu", q.apply_cpu},
                            {"check", q.check},
                            {"flush", q.flush},
                            {"vote", q.vote},
                            {"decision_wait", q.decision_wait},
                            {"activate", q.activate}};
  return j;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Model bytes per second and thread: per wall second, and per CPU second of
// the threads (what other work on the cores does not change).
struct EncodeFloor {
  double wall = 0;
  double cpu = 0;
};

// The floor of the publisher's encode pass on this machine: the cheapest
// pass over baseline and target, counting their differing elements
// (CountChanged: the detection kernel without index output), over pieces
// of at most 4 MiB on `threads` threads, as the encoder spreads its
// chunks. The faster of two passes (the first maps the file's pages).
EncodeFloor EncodeFloorPerThread(const std::vector<TensorView>& base,
                            const std::vector<TensorView>& target, int threads) {
  struct Piece {
    const uint8_t* a;
    const uint8_t* b;
    uint64_t n;
    int width;
  };
  std::vector<Piece> pieces;
  uint64_t bytes = 0;
  for (const TensorView& t : target) {
    auto it = std::find_if(base.begin(), base.end(),
                           [&](const TensorView& v) { return v.name == t.name; });
    if (it == base.end() || it->width != t.width || t.width <= 0) continue;
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    const uint64_t per = (uint64_t{4} << 20) / static_cast<uint64_t>(t.width);
    for (uint64_t s = 0; s < n; s += per) {
      const uint64_t off = s * static_cast<uint64_t>(t.width);
      pieces.push_back({it->data + off, t.data + off, std::min(per, n - s), t.width});
    }
    bytes += n * static_cast<uint64_t>(t.width);
  }
  EncodeFloor best;
  if (bytes == 0) return best;
  for (int pass = 0; pass < 2; ++pass) {
    std::atomic<uint64_t> sink{0};
    std::vector<double> cpu(static_cast<size_t>(std::max(threads, 1)), 0.0);
    const Clock::time_point t0 = Clock::now();
    ParallelForEach(pieces.size(), threads, [&](size_t i, int worker) {
      const Piece& p = pieces[i];
      const double c0 = ThreadCpuSeconds();
      sink += CountChanged(p.a, p.b, p.n, p.width);
      cpu[static_cast<size_t>(worker)] += ThreadCpuSeconds() - c0;
    });
    const double s = Seconds(Clock::now() - t0);
    double cpu_s = 0;
    for (double c : cpu) cpu_s += c;
    if (s > 0) best.wall = std::max(best.wall, static_cast<double>(bytes) / s / threads);
    if (cpu_s > 0) best.cpu = std::max(best.cpu, static_cast<double>(bytes) / cpu_s);
  }
  return best;
}

// Where each version's time went (PublishReport::stages,
// StepResult::stages), one line per row.
void PrintStages(const std::vector<Row>& rows) {
  fmt::print(
      "\nper-stage seconds. publisher (wall in Publish): prep = baseline "
      "check + announcement; encode = diff until the last chunk was queued "
      "(blk: of which waiting for the upload queue); drain = uploads left "
      "after it; man = manifest; votes = manifest stored -> every vote read; "
      "dec = decision stored; adv = baseline advanced (after the decision: "
      "the committed ranges stored, checked and synced); sync = of adv, "
      "msync + fsync; stored = of the bytes of those ranges, the share "
      "stored (4 KiB blocks that differed); bh = the diff hashed the "
      "baseline's bytes (y) or took its kept digests (n); fin = head. receiver (the one that finished last; wall on its "
      "stepping thread): base = base check hashing; fetch = chunk Gets and "
      "checks; cwait = waiting for chunks; await = waiting for apply "
      "workers; acpu = apply worker seconds (overlaps the rest); check = "
      "tensors vs manifest; flush = checkpoint + journal durable; vote = vote "
      "stored; dwait = vote -> decision read; act = activation\n");
  fmt::print(
      "{:>6} {:>7} {:>4} | {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} "
      "{:>6} {:>6} {:>2} {:>6} | {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} "
      "{:>6} {:>6} {:>6} | {:>7}\n",
      "rate", "Mbit/s", "rcv", "prep", "encode", "blk", "drain", "man", "votes",
      "dec", "adv", "sync", "stored", "bh", "fin", "base", "fetch", "cwait", "await", "acpu", "check",
      "flush", "vote", "dwait", "act", "refit s");
  for (const Row& r : rows) {
    const PublishReport::Stages& p = r.v.publish.stages;
    const StepResult::Stages& q = r.v.receiver_stages;
    fmt::print(
        "{:>6} {:>7.0f} {:>4} | {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} "
        "{:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6} {:>2} {:>6.3f} | {:>6.3f} "
        "{:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} "
        "{:>6.3f} {:>6.3f} | {:>7.3f}\n",
        r.rate > 0 ? Percent(r.rate, 1) : "-", r.mbit, r.receivers, p.prepare,
        p.encode, p.encode_blocked, p.upload_drain, p.manifest, p.vote_wait,
        p.decision, p.advance, p.advance_sync,
        r.v.publish.advance_compared_bytes > 0
            ? Percent(static_cast<double>(r.v.publish.advance_stored_bytes) /
                          static_cast<double>(r.v.publish.advance_compared_bytes),
                      0)
            : "-",
        r.v.publish.base_hashed ? "y" : "n", p.finish, q.base_check, q.fetch, q.chunk_wait,
        q.apply_wait, q.apply_cpu, q.check, q.flush, q.vote, q.decision_wait,
        q.activate, r.v.refit_seconds);
  }
  fmt::print(
      "\npublisher's encode pass (CPU encoder). GB/s/thr = model bytes / "
      "encode / threads; scan = worker CPU seconds reading base and target "
      "(detection, changed values, segment hashes); code = worker CPU seconds "
      "entropy coding and framing; idle = threads x encode - scan - code "
      "(waits for the ordered sink or the upload queue, imbalance, cores "
      "taken by other work); sink = wall seconds in the ordered sink "
      "(sealing, SHA-256, queueing; one thread); scan GB/s = model bytes / "
      "scan, per busy thread, against the floor below\n");
  fmt::print("{:>6} {:>7} {:>4} | {:>3} {:>8} {:>6} {:>8} | {:>7} {:>7} {:>7} {:>7} | {:>7}\n",
             "rate", "Mbit/s", "rcv", "thr", "model GB", "encode", "GB/s/thr",
             "scan", "code", "idle", "sink", "scan GB/s");
  for (const Row& r : rows) {
    const DiffReport& d = r.v.publish.diff;
    const double encode = r.v.publish.stages.encode;
    fmt::print(
        "{:>6} {:>7.0f} {:>4} | {:>3} {:>8.2f} {:>6.3f} {:>8.2f} | {:>7.3f} "
        "{:>7.3f} {:>7.3f} {:>7.3f} | {:>7.2f}\n",
        r.rate > 0 ? Percent(r.rate, 1) : "-", r.mbit, r.receivers, d.threads,
        static_cast<double>(d.full_bytes) / 1e9, encode, EncodePerThread(r.v) / 1e9,
        d.scan_seconds, d.code_seconds,
        std::max(0.0, d.threads * encode - d.scan_seconds - d.code_seconds),
        d.sink_seconds,
        d.scan_seconds > 0 ? static_cast<double>(d.full_bytes) / d.scan_seconds / 1e9 : 0.0);
  }
}

void PrintRows(const std::vector<Row>& rows, bool relay) {
  fmt::print(
      "{:<10} {:>6} {:>7} {:>4} {:>8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} "
      "{:>8} {:>8} {:>6} {:>9} {:>8}{}\n",
      "input", "rate", "Mbit/s", "rcv", "changed", "payload", "ideal s",
      "upload", "up/idl", "refit s", "ref/idl", "rcv-step", "rcv-tail",
      "early", "full s", "speedup", relay ? "   manifest@last-node s" : "");
  for (const Row& r : rows) {
    const Fleet::VersionResult& v = r.v;
    double changed =
        v.publish.diff.total_elements
            ? static_cast<double>(v.publish.diff.changed_elements) /
                  static_cast<double>(v.publish.diff.total_elements)
            : 0;
    std::string full = r.full.measured_seconds >= 0
                           ? fmt::format("{:.1f}m", r.full.measured_seconds)
                           : fmt::format("{:.1f}c", r.full.wire_seconds);
    fmt::print(
        "{:<10} {:>6} {:>7.0f} {:>4} {:>8} {:>10} {:>8.3f} {:>8.3f} {:>8.2f} "
        "{:>8.3f} {:>8.2f} {:>8.3f} {:>8.3f} {:>6} {:>9} {:>7.1f}x{}\n",
        r.input, r.rate > 0 ? Percent(r.rate, 1) : "-", r.mbit, r.receivers,
        Percent(changed, 2), HumanBytes(static_cast<double>(v.up_put_bytes)),
        r.ideal_seconds, v.publish.encode_upload_seconds,
        v.publish.encode_upload_seconds / r.ideal_seconds, v.refit_seconds,
        v.refit_seconds / r.ideal_seconds, v.apply_seconds_max,
        v.tail_seconds_max, v.early_chunks_min, full,
        r.full.wire_seconds / v.refit_seconds,
        relay ? (v.relay_index_seconds >= 0
                     ? fmt::format("   {:.3f}", v.relay_index_seconds)
                     : std::string("   -"))
              : "");
    if (!v.committed) fmt::print("  (aborted: {})\n", v.error);
  }
}

int Run(const SyncBenchArgs& args, const std::string& command_line) {
  const bool json = args.json;
  std::vector<double> rates;
  for (const std::string& text : args.rates) {
    Result<double> rate = ParseRate(text, "--rates");
    if (!rate.ok()) return Fail(kCmd, rate.status(), json);
    rates.push_back(*rate);
  }
  for (double m : args.link_mbit) {
    if (!(m > 0)) {
      return Fail(kCmd, InvalidArgumentError("--link-mbit values must be > 0"),
                  json);
    }
  }
  if (args.store != "dir" && args.store != "memory") {
    return Fail(kCmd, InvalidArgumentError("--store must be 'dir' or 'memory'"),
                json);
  }
  if (args.throttle != "up" && args.throttle != "both") {
    return Fail(kCmd, InvalidArgumentError("--throttle must be 'up' or 'both'"),
                json);
  }
  const bool both = args.throttle == "both";
  if (both && args.relay) {
    return Fail(
        kCmd,
        InvalidArgumentError("--throttle both applies to the directory "
                             "store; the relay tree's links are loopback"),
        json);
  }
  if (!(args.size_mib > 0) || args.size_mib > 64 * 1024) {
    return Fail(kCmd, InvalidArgumentError("--size-mib must be in (0, 65536]"),
                json);
  }
  const int receivers =
      args.receivers > 0 ? args.receivers : (args.relay ? 16 : 1);
  const int threads =
      args.threads > 0 || args.publisher_cores == 0 ? EffectiveThreads(args.threads)
                                                    : args.publisher_cores;

  Result<ScratchDir> inputs = ScratchDir::Create("refit-syncbench-in");
  if (!inputs.ok()) return Fail(kCmd, inputs.status(), json);

  Json out = Json::object();
  out["command"] = command_line;
  out["machine"] =
      args.publisher_cores > 0
          ? fmt::format("{}, {} hardware threads; the publisher on {} of them (refit using {}), "
                        "the receivers on the other {} (--publisher-cores)",
                        CpuModel(), std::thread::hardware_concurrency(), args.publisher_cores,
                        threads, AllowedCpus().size() - static_cast<size_t>(args.publisher_cores))
          : fmt::format("{}, {} hardware threads; refit using {}", CpuModel(),
                        std::thread::hardware_concurrency(), threads);
  std::string link_text =
      args.relay
          ? "ThrottledStore(burst 0) between the publisher and the relay root "
            "(every publisher call crosses it); the tree below the root is "
            "loopback TCP, unthrottled"
      : both ? "ThrottledStore(burst 0) on the publisher's calls, and a "
               "second one at the same rate shared by the receivers' reads "
               "(both directions of a full-duplex link)"
             : "ThrottledStore(burst 0) on the publisher's calls (its Puts "
               "and its reads of votes); receivers read the directory store "
               "directly (the store is on their side of the boundary)";
  out["link"] = link_text;
  const std::string store_text =
      args.relay ? "relay tree (objects in each endpoint's memory)"
      : args.store == "memory" ? "memory (MemoryStore: a map in this process)"
                               : "directory (each object a file, fsynced)";
  out["store"] = store_text;
  const std::string receiver_text =
      args.in_memory ? "tensors in host memory (ReceiverOptions::tensors)"
                     : args.no_early_writeback
                         ? "a checkpoint file each (memory-mapped, flushed before the vote; "
                           "no early write-back)"
                         : "a checkpoint file each (memory-mapped, flushed before the vote)";
  out["receivers"] = receiver_text;
  std::vector<Row> rows;
  std::vector<FullSend> fulls;
  EncodeFloor encode_floor;  // synthetic input only

  if (!args.fixtures.empty()) {
    // step0 -> step1 of a fixture folder, once per link, each on a fresh fleet.
    const std::string step0 = args.fixtures + "/step0.safetensors";
    const std::string step1 = args.fixtures + "/step1.safetensors";
    for (const std::string& p : {step0, step1}) {
      if (Status s = CheckExists(p, "fixture checkpoint"); !s.ok())
        return Fail(kCmd, s, json);
    }
    out["input"] = fmt::format("{} -> {}", step0, step1);
    for (double mbit : args.link_mbit) {
      auto fleet = Fleet::Create(args, step0, receivers, args.relay);
      if (!fleet.ok()) return Fail(kCmd, fleet.status(), json);
      auto full = MeasureFullSend((*fleet)->backend(), step1, mbit,
                                  args.full_measure_max_s,
                                  !args.relay && args.store == "dir");
      if (!full.ok()) return Fail(kCmd, full.status(), json);
      fulls.push_back(*full);
      auto target = Checkpoint::Open(step1, Checkpoint::Mode::kReadOnly);
      if (!target.ok()) return Fail(kCmd, target.status(), json);
      auto v = (*fleet)->PublishVersion(CheckpointViews(*target), mbit * 1e6 / 8, both);
      if (!v.ok()) return Fail(kCmd, v.status(), json);
      Row r{"fixture", 0, mbit, receivers, *v, IdealSeconds(*v, mbit, both),
            *full};
      rows.push_back(r);
    }
  } else {
    if (!json) fmt::print(stderr, "generating the synthetic model...\n");
    Stopwatch gen;
    SynthModel model = GenerateModel(
        static_cast<uint64_t>(args.size_mib * (1 << 20)), args.seed);
    const std::string base_path = inputs->File("base.safetensors");
    if (Status s = WriteModel(model, base_path, {{"step", "0"}}); !s.ok()) {
      return Fail(kCmd, s, json);
    }
    out["input"] = fmt::format(
        "synthetic BF16 model, {} tensors, {} bytes ({} elements), seed {}, "
        "generated and written in {:.1f} s; version k = version k-1 evolved at "
        "the row's rate (EvolveModel seed {} * 7919 + k)",
        model.tensors.size(), model.bytes(), model.elements(), args.seed,
        gen.Seconds(), args.seed);
    if (!json) fmt::print(stderr, "{}\n", out["input"].get<std::string>());
    {
      auto base = Checkpoint::Open(base_path, Checkpoint::Mode::kReadOnly);
      if (!base.ok()) return Fail(kCmd, base.status(), json);
      encode_floor = EncodeFloorPerThread(CheckpointViews(*base), model.Views(), threads);
    }

    // Without --relay: one fleet of `receivers`. With --relay: a fleet of 1
    // receiver, then one of `receivers`, each starting from the base and
    // publishing the same versions.
    std::vector<int> sizes = {receivers};
    if (args.relay && receivers != 1) sizes = {1, receivers};
    for (int fleet_size : sizes) {
      if (fleet_size != sizes.front()) {
        model = GenerateModel(static_cast<uint64_t>(args.size_mib * (1 << 20)),
                              args.seed);
      }
      if (!json)
        fmt::print(stderr, "copying checkpoints for {} receiver(s)...\n",
                   fleet_size);
      auto fleet = Fleet::Create(args, base_path, fleet_size, args.relay);
      if (!fleet.ok()) return Fail(kCmd, fleet.status(), json);
      uint64_t k = 0;
      for (int w = 0; w < args.warmup && !rates.empty(); ++w) {
        ++k;
        EvolveModel(&model, rates.front(), args.seed * 7919 + k);
        if (!json) fmt::print(stderr, "version {}: warm-up, not a row...\n", k);
        auto v = (*fleet)->PublishVersion(model.Views(), args.link_mbit.front() * 1e6 / 8, both);
        if (!v.ok()) return Fail(kCmd, v.status(), json);
      }
      for (double mbit : args.link_mbit) {
        FullSend full;
        bool measured_before = false;
        for (const FullSend& f : fulls) {
          if (f.mbit == mbit) {
            full = f;
            measured_before = true;
          }
        }
        if (!measured_before) {
          if (!json)
            fmt::print(stderr, "full checkpoint over {} Mbit/s...\n", mbit);
          auto f = MeasureFullSend((*fleet)->backend(), base_path, mbit,
                                   args.full_measure_max_s,
                                   !args.relay && args.store == "dir");
          if (!f.ok()) return Fail(kCmd, f.status(), json);
          full = *f;
          fulls.push_back(full);
        }
        for (double rate : rates) {
          ++k;
          EvolveModel(&model, rate, args.seed * 7919 + k);
          if (!json) {
            fmt::print(stderr,
                       "version {}: {} at {} Mbit/s, {} receiver(s)...\n", k,
                       Percent(rate, 1), mbit, fleet_size);
          }
          auto v =
              (*fleet)->PublishVersion(model.Views(), mbit * 1e6 / 8, both);
          if (!v.ok()) return Fail(kCmd, v.status(), json);
          Row r{"synthetic", rate, mbit,
                fleet_size,  *v,   IdealSeconds(*v, mbit, both),
                full};
          rows.push_back(r);
          if (!json) {
            PrintRows({r}, args.relay);
          }
        }
      }
    }
  }

  Json links = Json::array();
  for (const FullSend& f : fulls) {
    Json j = {{"link_mbit", f.mbit},
              {"full_bytes", f.bytes},
              {"wire_s", f.wire_seconds}};
    j["measured_s"] =
        f.measured_seconds >= 0 ? Json(f.measured_seconds) : Json(nullptr);
    links.push_back(j);
  }
  out["full_checkpoint"] = links;
  Json jrows = Json::array();
  for (const Row& r : rows) jrows.push_back(RowJson(r));
  out["runs"] = jrows;
  out["encode_floor_gb_per_s_per_thread"] = {{"wall", encode_floor.wall / 1e9},
                                              {"cpu", encode_floor.cpu / 1e9}};
  out["conditional"] = args.conditional;
  if (json) {
    PrintJson(out);
    return kExitOk;
  }
  fmt::print("\nrefit bench sync: {}\n", command_line);
  fmt::print("machine: {}\n", out["machine"].get<std::string>());
  fmt::print("input:   {}\n", out["input"].get<std::string>());
  fmt::print("link:    {}\n", link_text);
  fmt::print("store:   {}\n", store_text);
  fmt::print("receivers hold: {}\n", receiver_text);
  fmt::print("coding:  {}\n", args.conditional
                                   ? "today's kinds and conditional XOR (kind 5, --conditional)"
                                   : "today's kinds (no --conditional)");
  for (const FullSend& f : fulls) {
    fmt::print(
        "full checkpoint over {:.0f} Mbit/s: {} bytes, wire time {:.2f} s{}\n",
        f.mbit, f.bytes, f.wire_seconds,
        f.measured_seconds >= 0
            ? fmt::format(", measured Put through the link {:.2f} s",
                          f.measured_seconds)
            : std::string(", not measured (computed)"));
  }
  fmt::print(
      "payload = bytes the publisher put through the link; ideal = {} / link "
      "rate; upload = Publish start to the manifest stored; refit = Publish "
      "start to every receiver active; rcv-step = longest receiver step "
      "(announcement seen to active); rcv-tail = longest manifest seen to "
      "vote stored; early = fewest chunks a receiver applied before the "
      "manifest; full s = full checkpoint over the link (m measured, c "
      "computed); speedup = full wire time / refit\n",
      both ? "max(payload, receivers' reads)" : "payload");
  PrintRows(rows, args.relay);
  PrintStages(rows);
  if (encode_floor.wall > 0) {
    fmt::print(
        "encode floor on {} threads: {:.2f} GB/s of model per thread and wall "
        "second, {:.2f} per CPU second (compare GB/s/thr and scan GB/s); "
        "CountChanged over the baseline file and the target in memory: both "
        "read, nothing else done\n",
        threads, encode_floor.wall / 1e9, encode_floor.cpu / 1e9);
  }
  return kExitOk;
}

}  // namespace

std::function<int(bool, const std::string&)> RegisterBenchSync(
    CLI::App* bench_cmd) {
  auto args = std::make_shared<SyncBenchArgs>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "sync",
      "End-to-end distribution over a bandwidth-limited link: the publisher "
      "and in-process receivers, refit time vs the ideal time of the bytes "
      "sent and vs sending the full checkpoint over the same link.");
  cmd->add_option("--size-mib", args->size_mib, "synthetic model size in MiB")
      ->capture_default_str();
  cmd->add_option("--rates", args->rates,
                  "fractions of elements changed per version")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--link-mbit", args->link_mbit, "link rates in Mbit/s")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--receivers", args->receivers,
                  "receivers (threads); 0 = 1, or 16 with --relay")
      ->capture_default_str()
      ->check(IntIn(0, 1024));
  cmd->add_flag("--relay", args->relay,
                "receivers in a relay tree on loopback; runs 1 receiver and "
                "then --receivers, for the comparison");
  cmd->add_flag("--in-memory", args->in_memory,
                "receivers hold their tensors in host memory (an inference "
                "worker's weights) instead of a checkpoint file each");
  cmd->add_option("--fanout", args->fanout, "relay tree fan-out")
      ->capture_default_str()
      ->check(IntIn(1, 64));
  cmd->add_option("--throttle", args->throttle,
                  "up: the publisher's calls cross the link; both: the "
                  "receivers' reads too (a second bucket)")
      ->capture_default_str();
  cmd->add_option("--store", args->store,
                  "dir: a directory store (objects written and fsynced as "
                  "files); memory: objects in a map of this process (the "
                  "protocol's own costs); ignored with --relay")
      ->capture_default_str();
  cmd->add_option("--fixtures", args->fixtures,
                  "instead of a synthetic model: step0 -> step1 of this folder "
                  "(e.g. ../shared/fixtures/qwen2-tiny)");
  cmd->add_option("--chunk-mib", args->chunk_mib,
                  "bytes of a tensor per chunk, MiB")
      ->capture_default_str();
  cmd->add_option("-j,--threads", args->threads,
                  "encoder threads; 0 = all cores")
      ->capture_default_str()
      ->check(IntIn(0, kMaxThreads));
  cmd->add_option("--publisher-cores", args->publisher_cores,
                  "run the publisher (encoder and uploads) on the first N CPUs of this "
                  "process and the receivers on the rest, as on hosts of their own; -j 0 "
                  "then means N; 0 = every party on every CPU")
      ->capture_default_str()
      ->check(IntIn(0, kMaxThreads));
  cmd->add_option("--warmup", args->warmup,
                  "untimed versions before the rows (at the first rate and link), so the "
                  "rows show the steady state; version 1 hashes every base in full")
      ->capture_default_str()
      ->check(IntIn(0, 1000));
  cmd->add_flag("--no-early-writeback", args->no_early_writeback,
                "checkpoint receivers leave every write-back to the flush before the vote "
                "(ReceiverOptions::early_writeback = false)");
  cmd->add_option("--upload-threads", args->upload_threads,
                  "publisher upload threads")
      ->capture_default_str()
      ->check(IntIn(1, 256));
  cmd->add_option("--poll-ms", args->poll_ms,
                  "publisher and receiver poll interval")
      ->capture_default_str();
  cmd->add_option("--full-base-check-every", args->full_base_check_every,
                  "receivers hash their whole base every N-th version and "
                  "check the others from the digests they kept (1: every "
                  "version; ReceiverOptions::full_base_check_every)")
      ->capture_default_str()
      ->check(IntIn(0, 1 << 30));
  cmd->add_option("--full-baseline-check-every", args->full_baseline_check_every,
                  "the publisher hashes its baseline's bytes in every N-th "
                  "version's diff and takes the others' base hashes from the "
                  "digests it kept (1: every version; "
                  "PublisherOptions::full_baseline_check_every)")
      ->capture_default_str()
      ->check(IntIn(0, 1 << 30));
  cmd->add_option("--full-measure-max-s", args->full_measure_max_s,
                  "send the full checkpoint through the link when that takes "
                  "at most this long; otherwise report the computed time")
      ->capture_default_str();
  cmd->add_flag("--conditional", args->conditional,
                "versions may carry conditional XOR chunks (kind 5, coded given "
                "the base) where smaller");
  cmd->add_option("--seed", args->seed, "generator seed")
      ->capture_default_str()
      ->check(Unsigned());
  cmd->add_flag("--json", args->json, "print a JSON object on stdout");
  return [args](bool json, const std::string& command_line) {
    SyncBenchArgs a = *args;
    a.json = a.json || json;
    return Run(a, command_line);
  };
}

}  // namespace refit::cli
