// ckptd_build_info: the gauge every ckptd process serves, 1 with the
// component and version as labels, so that dashboards and alerts can tell
// which version runs where (and join it onto other series).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "metrics/registry.h"

namespace ckptd::metrics {

// Registers ckptd_build_info{component,version} in `registry` and sets it to
// 1 for `component` ("agent", "coordinator") and base::Version().
absl::Status AddBuildInfo(Registry& registry, absl::string_view component);

}  // namespace ckptd::metrics
