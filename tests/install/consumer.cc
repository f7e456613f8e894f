// Uses the installed public headers only: a directory store, an
// authenticated envelope, and a receiver over the store.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "refit/auth.h"
#include "refit/receiver.h"
#include "refit/store.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  auto store = refit::OpenObjectStore(dir + "/store");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const std::vector<uint8_t> hello = {'h', 'i'};
  if (!(*store)->Put("hello", hello).ok() || *(*store)->Get("hello") != hello) {
    std::fprintf(stderr, "store round trip failed\n");
    return 1;
  }
  refit::Authenticator auth = refit::Authenticator::None();
  const std::vector<uint8_t> sealed = auth.Seal(hello);
  auto opened = auth.Open(sealed);
  if (!opened.ok() ||
      std::vector<uint8_t>(opened->begin(), opened->end()) != hello) {
    std::fprintf(stderr, "envelope round trip failed\n");
    return 1;
  }
  // A receiver of in-memory tensors on a store that holds no version yet:
  // its first step has nothing to do.
  std::vector<uint8_t> weights(16);
  refit::SyncReceiverOptions options;
  options.member = "consumer";
  options.tensors.push_back({"w", "BF16", 2, {8}, weights.data()});
  options.state_dir = dir + "/state";
  std::filesystem::create_directories(options.state_dir);
  auto receiver = refit::SyncReceiver::Open(store->get(), std::move(options));
  if (!receiver.ok()) {
    std::fprintf(stderr, "%s\n", receiver.status().ToString().c_str());
    return 1;
  }
  auto step = (*receiver)->Step();
  if (!step.ok() || step->outcome != refit::SyncStep::Outcome::kIdle) {
    std::fprintf(stderr, "first step: %s\n",
                 step.ok() ? refit::SyncOutcomeName(step->outcome).c_str()
                           : step.status().ToString().c_str());
    return 1;
  }
  std::printf("consumer: ok, active version %llu\n",
              static_cast<unsigned long long>((*receiver)->active_version()));
  return 0;
}
