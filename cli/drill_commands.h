// ckptctl drill: failure drills against a live job. `drill run` orders one
// scenario through the coordinator, watches what follows and judges it;
// `drill suite FILE` runs several in order and sums them up. Each report
// prints as text, as JSON (--json) and as a self-contained HTML page with an
// SVG timeline (--html FILE). docs/ckptctl.md describes them; the drills run
// in cli/drill_runner.h and render in cli/drill_report.h.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "cli/operator_commands.h"

namespace ckptd::cli {

extern const char kDrillHelp[];
extern const char kDrillSuiteHelp[];

// ckptctl drill run|suite ...; see kDrillHelp and kDrillSuiteHelp. Exit 0
// when every expectation of every drill held, 1 when one did not (or a drill
// could not be carried out), 2 usage, 3 the coordinator cannot be reached.
int RunDrillCommand(const std::vector<std::string>& argv, const CoordinatorApiFactory& api, std::ostream& out,
                    std::ostream& err, const OperatorEnv& env = {});

}  // namespace ckptd::cli
