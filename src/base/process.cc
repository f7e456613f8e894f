#include "base/process.h"

#include <fcntl.h>
#include <spawn.h>

#include <cstring>
#include <string_view>

extern char** environ;

namespace refit {

Result<pid_t> SpawnLogged(const std::vector<std::string>& argv, const std::string& out,
                          const std::string& err, const std::string& crash_at) {
  if (argv.empty()) return InvalidArgumentError("no program to start");
  std::vector<std::string> args = argv;
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("REFIT_CRASH_AT=")) continue;
    env.emplace_back(*e);
  }
  if (!crash_at.empty()) env.push_back("REFIT_CRASH_AT=" + crash_at);
  std::vector<char*> env_ptrs;
  for (std::string& e : env) env_ptrs.push_back(e.data());
  env_ptrs.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, arg_ptrs[0], &actions, nullptr, arg_ptrs.data(), env_ptrs.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return UnavailableError("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  return pid;
}

}  // namespace refit
