#include "support/moto_testing.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "transport/stores.h"

namespace refit::testing {
namespace {

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A port that was free a moment ago (the kernel picks it for port 0).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

// moto answers a conditional PUT (If-None-Match: *) by looking the key up
// and then writing it, two steps that concurrent requests interleave, so
// two racing creators could both be told they won. A real S3 makes the
// create atomic. This launcher runs moto's own application and serves the
// requests that carry If-None-Match one at a time (the others as moto
// does, concurrently), so the test server keeps S3's contract.
constexpr const char* kSerialLauncher = R"py(
import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import (DomainDispatcherApplication,
                                           create_backend_app)
app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()
def serial(environ, start_response):
    if "HTTP_IF_NONE_MATCH" not in environ:
        return app(environ, start_response)
    with lock:
        return list(app(environ, start_response))
run_simple(sys.argv[1], int(sys.argv[2]), serial, threaded=True)
)py";

}  // namespace

StoreOptions MotoServer::Options() const {
  StoreOptions o;
  o.endpoint = endpoint_;
  o.region = "us-east-1";
  o.access_key = "testing";
  o.secret_key = "testing";
  o.max_attempts = 3;
  o.backoff_ms = 20;
  o.timeout_ms = 30000;
  return o;
}

std::string MotoServer::Log() const {
  std::ifstream in(log_path_);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

Result<std::unique_ptr<MotoServer>> MotoServer::Start() {
  std::string moto = FindOnPath("moto_server");
  if (moto.empty()) return NotFoundError("moto_server is not on PATH");
  // The serial launcher needs the Python that has moto; where "python3"
  // is not that one, moto_server itself serves (without atomic creates).
  std::string python = FindOnPath("python3");
  if (!python.empty()) {
    bool exited = false;
    auto serial = Launch({python, "-c", kSerialLauncher}, &exited);
    if (serial.ok()) (*serial)->atomic_creates_ = true;
    if (serial.ok() || !exited) return serial;
  }
  bool exited = false;
  return Launch({moto}, &exited);
}

Result<std::unique_ptr<MotoServer>> MotoServer::Launch(
    std::vector<std::string> argv, bool* exited) {
  int port = FreePort();
  if (port < 0) return UnavailableError("no free TCP port on 127.0.0.1");
  std::unique_ptr<MotoServer> server(new MotoServer());
  server->endpoint_ = "http://127.0.0.1:" + std::to_string(port);
  const char* tmp = std::getenv("TMPDIR");
  server->log_path_ = std::string(tmp != nullptr ? tmp : "/tmp") +
                      "/refit-moto-" + std::to_string(getpid()) + "-" +
                      std::to_string(port) + ".log";
  // moto_server takes -H/-p; the launcher takes host and port in order.
  if (argv.size() == 1) {
    argv.insert(argv.end(), {"-H", "127.0.0.1", "-p"});
  } else {
    argv.push_back("127.0.0.1");
  }
  argv.push_back(std::to_string(port));
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return UnavailableError("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int log = open(server->log_path_.c_str(),
                   O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log >= 0) {
      dup2(log, 1);
      dup2(log, 2);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so the group exists before we kill it
  server->pid_ = pid;

  StoreOptions o = server->Options();
  o.max_attempts = 1;
  o.timeout_ms = 2000;
  // Generous: on a loaded machine moto's imports alone take seconds.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Status last;
  for (;;) {
    int wstatus = 0;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) {
      server->pid_ = -1;
      *exited = true;
      return UnavailableError("moto_server exited during start-up; log:\n" +
                              Tail(server->log_path_));
    }
    last = internal::CreateS3Bucket(kBucket, o);
    if (last.ok()) return server;
    if (std::chrono::steady_clock::now() > deadline) {
      return UnavailableError("moto_server did not answer within 60 s (" +
                              last.ToString() + "); log:\n" +
                              Tail(server->log_path_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

MotoServer::~MotoServer() { Stop(); }

void MotoServer::Stop() {
  if (pid_ <= 0) return;
  kill(-pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  // Wait for the exit without reaping (WNOWAIT): while the zombie holds the
  // pid, the group id cannot be reused, so the final group kill can only
  // reach processes this server started.
  for (;;) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid_), &info,
               WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid_) {
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid_, SIGKILL);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid_, SIGKILL);
  int wstatus = 0;
  waitpid(pid_, &wstatus, 0);
  pid_ = -1;
  unlink(log_path_.c_str());
}

}  // namespace refit::testing
