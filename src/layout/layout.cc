#include "layout/layout.h"

namespace refit::layout {

Result<Layout> ParseLayout(std::string_view) {
  return UnimplementedError("ParseLayout: not implemented yet");
}
Result<Layout> LoadLayout(const std::string&) {
  return UnimplementedError("LoadLayout: not implemented yet");
}
std::string LayoutToJson(const Layout&) { return "{}"; }
Status ValidateLayout(const Layout&) {
  return UnimplementedError("ValidateLayout: not implemented yet");
}
Result<Ownership> AssignOwnership(const Layout&) {
  return UnimplementedError("AssignOwnership: not implemented yet");
}
Status CheckCoverage(const Layout&, const Ownership&) {
  return UnimplementedError("CheckCoverage: not implemented yet");
}
uint64_t PieceBytes(const Layout&, const Piece&) { return 0; }

}  // namespace refit::layout
