// `refit layout`: generate a trainer layout from a model's config.json and
// parallel sizes, and check one (validation, ownership, coverage), printing
// per-rank owned bytes and the balance. docs/layout.md describes layouts.
#ifndef REFIT_TOOLS_REFIT_LAYOUT_COMMAND_H_
#define REFIT_TOOLS_REFIT_LAYOUT_COMMAND_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>

namespace refit::cli {

// Registers `layout generate` and `layout check` on `app`. The returned
// function runs the one that was parsed and returns its exit code, or
// nullopt when another subcommand was parsed; `global_json` is the tool's
// --json.
std::function<std::optional<int>(bool global_json)> RegisterLayoutCommand(CLI::App* app);

}  // namespace refit::cli

#endif  // REFIT_TOOLS_REFIT_LAYOUT_COMMAND_H_
