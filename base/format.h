// Human-readable sizes, durations and times for tables, logs and reports.
#pragma once

#include <cstdint>
#include <string>

namespace ckptd::base {

// "1.5 GiB", "12.0 MiB", "512 B".
std::string HumanBytes(uint64_t bytes);
// "2024-05-01T12:00:00Z"; "-" for 0 (unknown).
std::string IsoTime(int64_t unix_nanos);
// "0.4 s", "12 s", "5.2 min", "3.1 h", "2.0 d"; negative (clock skew) as 0.
std::string ShortDuration(double s);
// "0.04 s", "1.5 s", "35.2 s", "412 s"; "-" for 0 (unknown).
std::string Seconds(double s);

}  // namespace ckptd::base
