// Internal name of the layout header: everything is in the public
// refit/layout.h.
#ifndef REFIT_LAYOUT_LAYOUT_H_
#define REFIT_LAYOUT_LAYOUT_H_

#include "refit/layout.h"

#endif  // REFIT_LAYOUT_LAYOUT_H_
