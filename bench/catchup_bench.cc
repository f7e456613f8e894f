// Catch-up (docs/protocol.md, "Catch-up by folding"): a fresh receiver, a
// copy of the version-0 checkpoint on disk, brought through K committed
// versions, folding them (ReceiverOptions::max_fold_versions, default) or
// one version per step (max_fold_versions = 1), in the same run and in
// alternating order. Synthetic BF16 model of random bits; each version
// flips the low bits of a fraction `rate` of the elements (ulp-sized
// changes, as in training). The versions are published through the real
// protocol into a directory store, with an in-memory member voting.
//
//   refit_catchup_bench [--size-mib 2048] [--versions 8] [--rate 0.03]
//                       [--tensor-mib 64] [--threads N] [--repeat 2]
//                       [--dir /tmp/refit-catchup] [--keep-cache]
//
// Before each timed catch-up the receiver's checkpoint is copied from the
// version-0 file, fsynced and dropped from the page cache
// (posix_fadvise DONTNEED) unless --keep-cache, so both ways start cold.
// Each run reports wall and CPU seconds (user + system, all threads) and
// the storage bytes the process read and dirtied (/proc/self/io: pages of
// the mapped checkpoint count when they are dirtied, once per write-back).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_model.h"
#include "format/safetensors.h"
#include "refit/status.h"
#include "sync/publisher.h"
#include "sync/receiver.h"
#include "transport/object_store.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Args {
  uint64_t size_mib = 2048;
  uint64_t versions = 8;
  double rate = 0.03;
  uint64_t tensor_mib = 64;
  int threads = 0;
  int repeat = 2;
  std::string dir = "/tmp/refit-catchup";
  bool keep_cache = false;
};

using bench::Model;
using bench::SplitMix;

Model Generate(const Args& a) {
  Model m;
  const uint64_t total = a.size_mib << 20, per = a.tensor_mib << 20;
  SplitMix rng{1};
  for (uint64_t off = 0, i = 0; off < total; off += per, ++i) {
    const uint64_t n = std::min(per, total - off);
    m.names.push_back(fmt::format("layers.{}.weight", i));
    std::vector<uint8_t> d(n);
    for (uint64_t j = 0; j + 8 <= n; j += 8) {
      const uint64_t x = rng.Next();
      std::memcpy(d.data() + j, &x, 8);
    }
    m.data.push_back(std::move(d));
  }
  return m;
}

// Flips the low 1-3 bits of about `rate` of the elements (geometric gaps).
void Evolve(Model* m, double rate, uint64_t seed) {
  SplitMix rng{seed};
  const double scale = 1.0 / 9007199254740992.0;  // 2^-53
  const double log1m = std::log1p(-rate);
  for (auto& d : m->data) {
    const uint64_t n = d.size() / 2;
    uint64_t i = 0;
    for (;;) {
      const double u = (static_cast<double>(rng.Next() >> 11) + 1.0) * scale;
      i += static_cast<uint64_t>(std::log(u) / log1m);
      if (i >= n) break;
      d[2 * i] ^= static_cast<uint8_t>((2u << (rng.Next() % 3)) - 1);
      ++i;
    }
  }
}

Status Write(const Model& m, const std::string& path) {
  std::vector<SafetensorsTensorView> views;
  for (size_t i = 0; i < m.names.size(); ++i) {
    views.push_back({m.names[i], "BF16", {m.data[i].size() / 2}, m.data[i]});
  }
  return WriteSafetensors(path, {}, views);
}

// Copies `from` to `to`, fsyncs it and (unless keep_cache) drops its pages.
Status ColdCopy(const std::string& from, const std::string& to, bool keep_cache) {
  std::error_code ec;
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return UnavailableError("cannot copy " + from + ": " + ec.message());
  int fd = open(to.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return UnavailableError("cannot open " + to);
  int rc = fsync(fd);
  if (!keep_cache) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  return rc == 0 ? Status() : UnavailableError("fsync failed on " + to);
}

struct Run {
  double seconds = 0;
  double cpu_seconds = 0;  // user + system, all threads of this process
  uint64_t steps = 0, chunks = 0, skipped = 0, bytes = 0;
  uint64_t written = 0;    // bytes this process dirtied for storage (/proc/self/io)
  uint64_t read = 0;       // bytes this process read from storage
};

// What this process has cost so far: CPU time and storage I/O.
struct Usage {
  double cpu = 0;
  uint64_t read = 0, written = 0;
  static Usage Now() {
    Usage u;
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    u.cpu = static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
            static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
    std::ifstream io("/proc/self/io");
    std::string key;
    uint64_t value = 0;
    while (io >> key >> value) {
      if (key == "read_bytes:") u.read = value;
      if (key == "write_bytes:") u.written = value;
    }
    return u;
  }
};

Result<Run> CatchUp(ObjectStore* store, const Args& a, const std::string& name, int max_fold) {
  const std::string dir = a.dir + "/" + name;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  REFIT_RETURN_IF_ERROR(ColdCopy(a.dir + "/v0.safetensors", dir + "/model.safetensors",
                                 a.keep_cache));
  ReceiverOptions o;
  o.member = name;
  o.checkpoint = dir + "/model.safetensors";
  o.state_dir = dir;
  o.threads = a.threads;
  o.max_fold_versions = max_fold;
  const Usage u0 = Usage::Now();
  auto t0 = Clock::now();
  REFIT_ASSIGN_OR_RETURN(auto r, Receiver::Open(store, o));
  Run run;
  while (r->active_version() < a.versions) {
    REFIT_ASSIGN_OR_RETURN(StepResult s, r->Step());
    if (s.outcome != StepResult::Outcome::kCaughtUp) {
      return InternalError("catch-up step did not catch up");
    }
    ++run.steps;
    run.chunks += s.chunks_applied;
    run.skipped += s.chunks_skipped;
    run.bytes += s.bytes_fetched;
  }
  run.seconds = Since(t0);
  const Usage u1 = Usage::Now();
  run.cpu_seconds = u1.cpu - u0.cpu;
  run.read = u1.read - u0.read;
  run.written = u1.written - u0.written;
  return run;
}

int Main(int argc, char** argv) {
  Args a;
  CLI::App app{"Catch-up of a fresh receiver K committed versions behind: folded against "
               "one version per step, same run (docs/benchmarks.md)"};
  app.add_option("--size-mib", a.size_mib, "synthetic model size")->capture_default_str();
  app.add_option("--versions", a.versions, "committed versions to catch up")
      ->capture_default_str();
  app.add_option("--rate", a.rate, "fraction of elements changed per version")
      ->capture_default_str();
  app.add_option("--tensor-mib", a.tensor_mib, "size of each tensor")->capture_default_str();
  app.add_option("--threads", a.threads, "receiver threads; 0 = all cores")
      ->capture_default_str();
  app.add_option("--repeat", a.repeat, "runs of each way")->capture_default_str();
  app.add_option("--dir", a.dir, "scratch directory (emptied first)")->capture_default_str();
  app.add_flag("--keep-cache", a.keep_cache,
               "leave the checkpoint in the page cache between runs");
  CLI11_PARSE(app, argc, argv);
  if (a.size_mib == 0 || a.tensor_mib == 0 || a.versions < 2 || a.rate <= 0 || a.rate >= 1) {
    fmt::print(stderr, "need --size-mib > 0, --tensor-mib > 0, --versions >= 2, 0 < --rate < 1\n");
    return 2;
  }
  std::error_code ec;
  std::filesystem::remove_all(a.dir, ec);
  std::filesystem::create_directories(a.dir + "/follower");
  auto check = [](const Status& s) {
    if (!s.ok()) {
      fmt::print(stderr, "error: {}\n", s.ToString());
      std::exit(1);
    }
  };

  auto t0 = Clock::now();
  Model trainer = Generate(a);
  check(Write(trainer, a.dir + "/v0.safetensors"));
  check(Write(trainer, a.dir + "/baseline.safetensors"));
  Model follower = trainer;
  auto store = OpenObjectStore(a.dir + "/store");
  check(store.status());
  PublisherOptions po;
  po.members = {"follower"};
  po.poll_ms = 2;
  auto pub = Publisher::Open(store->get(), a.dir + "/baseline.safetensors", po);
  check(pub.status());
  ReceiverOptions fo;
  fo.member = "follower";
  fo.state_dir = a.dir + "/follower";
  fo.threads = a.threads;
  for (size_t i = 0; i < follower.names.size(); ++i) {
    fo.tensors.push_back({follower.names[i], "BF16", 2, {follower.data[i].size() / 2},
                          follower.data[i].data()});
  }
  auto frcv = Receiver::Open(store->get(), fo);
  check(frcv.status());
  uint64_t chunks_published = 0, bytes_published = 0;
  for (uint64_t v = 1; v <= a.versions; ++v) {
    Evolve(&trainer, a.rate, 100 + v);
    Status follow;
    std::thread t([&] { follow = (*frcv)->SyncTo(v, 600000).status(); });
    auto report = (*pub)->Publish(v, trainer.Views());
    t.join();
    check(report.status());
    check(follow);
    if (!report->committed) check(InternalError("version not committed: " + report->reason));
    chunks_published += report->diff.chunks;
    bytes_published += report->bytes_uploaded;
  }
  frcv->reset();
  trainer = Model();
  follower = Model();
  fmt::print("model {} MiB BF16 ({} tensors of <= {} MiB), {} versions at rate {}: "
             "{} chunks, {:.1f} MiB published in {:.1f} s\n",
             a.size_mib, (a.size_mib + a.tensor_mib - 1) / a.tensor_mib, a.tensor_mib, a.versions,
             a.rate, chunks_published, static_cast<double>(bytes_published) / (1 << 20),
             Since(t0));

  std::vector<Run> fold, single;
  for (int rep = 0; rep < a.repeat; ++rep) {
    for (int pass = 0; pass < 2; ++pass) {
      const bool folding = (pass == 0) == (rep % 2 == 0);
      auto run = CatchUp(store->get(), a, folding ? "fold" : "single", folding ? 16 : 1);
      check(run.status());
      fmt::print("  rep {} {:<18} {:7.2f} s  cpu {:7.2f} s  steps {:3}  chunks {:6}  "
                 "fetched {:7.1f} MiB  read {:7.1f} MiB  written {:8.1f} MiB\n",
                 rep, folding ? "fold (max 16)" : "one by one (max 1)", run->seconds,
                 run->cpu_seconds, run->steps, run->chunks,
                 static_cast<double>(run->bytes) / (1 << 20),
                 static_cast<double>(run->read) / (1 << 20),
                 static_cast<double>(run->written) / (1 << 20));
      (folding ? fold : single).push_back(*run);
    }
  }
  auto median = [](std::vector<Run> runs) {
    std::sort(runs.begin(), runs.end(),
              [](const Run& x, const Run& y) { return x.seconds < y.seconds; });
    return runs[runs.size() / 2];
  };
  auto best = [](const std::vector<Run>& runs) {
    return std::min_element(runs.begin(), runs.end(), [](const Run& x, const Run& y) {
             return x.seconds < y.seconds;
           })->seconds;
  };
  const Run f = median(fold), s = median(single);
  fmt::print("\n| catch-up of {} versions | seconds, median of {} (best) | CPU seconds | steps | "
             "chunks applied | MiB fetched | MiB written |\n|---|---|---|---|---|---|---|\n",
             a.versions, a.repeat);
  auto row = [&](const char* name, const Run& r, double b) {
    fmt::print("| {} | {:.2f} ({:.2f}) | {:.2f} | {} | {} | {:.1f} | {:.1f} |\n", name, r.seconds,
               b, r.cpu_seconds, r.steps, r.chunks, static_cast<double>(r.bytes) / (1 << 20),
               static_cast<double>(r.written) / (1 << 20));
  };
  row("one by one (max_fold_versions 1)", s, best(single));
  row("folded (max_fold_versions 16)", f, best(fold));
  fmt::print("speed-up {:.2f}x (median), {:.2f}x (best)\n", s.seconds / f.seconds,
             best(single) / best(fold));
  std::filesystem::remove_all(a.dir, ec);
  return 0;
}

}  // namespace
}  // namespace refit

int main(int argc, char** argv) { return refit::Main(argc, argv); }
