// Internal name of the authentication header: everything is in the public
// refit/auth.h.
#ifndef REFIT_SYNC_AUTH_H_
#define REFIT_SYNC_AUTH_H_

#include "refit/auth.h"

#endif  // REFIT_SYNC_AUTH_H_
