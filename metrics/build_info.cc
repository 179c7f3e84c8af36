#include "metrics/build_info.h"

#include "absl/status/statusor.h"
#include "base/version.h"

namespace ckptd::metrics {

absl::Status AddBuildInfo(Registry& registry, absl::string_view component) {
  absl::StatusOr<GaugeFamily*> info = registry.AddGauge(
      "ckptd_build_info", "1, labelled with the process's component and ckptd version.", {"component", "version"});
  if (!info.ok()) return info.status();
  (*info)->With({component, base::Version()})->Set(1);
  return absl::OkStatus();
}

}  // namespace ckptd::metrics
