// The public publisher's options and report (refit/publisher.h) as the
// library's (sync/publisher.h) and back, for the public types built on a
// Publisher (SyncPublisher, the public PartsCoordinator). The public ones
// leave out chunk packs and the per-stage times.
#ifndef REFIT_SYNC_SYNC_PUBLISHER_H_
#define REFIT_SYNC_SYNC_PUBLISHER_H_

#include "refit/publisher.h"
#include "sync/publisher.h"

namespace refit {

PublisherOptions ToPublisherOptions(SyncPublisherOptions options);
SyncPublishReport ToSyncPublishReport(PublishReport report);

}  // namespace refit

#endif  // REFIT_SYNC_SYNC_PUBLISHER_H_
