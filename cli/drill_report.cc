#include "cli/drill_report.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "cli/svg.h"

namespace ckptd::cli {

using ckptd::v1::StepEntry;

namespace {

// "node-b rank 2": where a failure was recorded.
std::string Where(const ckptd::v1::FailureEvent& e) {
  return absl::StrCat(e.node_id(), e.has_rank() ? absl::StrCat(" rank ", e.rank()) : "");
}

// "intact", or "2 problem(s)".
std::string VerifiedText(const ckptd::v1::VerifyProgress& v) {
  return v.ok() ? "intact" : absl::StrCat(v.problems_size(), " problem(s)");
}

const char* PassOrFail(bool held) { return held ? "PASS" : "FAIL"; }
// The class and the text of an HTML verdict: pass">PASS or fail">FAIL.
const char* VerdictHtml(bool held) { return held ? "pass\">PASS" : "fail\">FAIL"; }

// `text`, or "-" when the figure is not known.
std::string Figure(bool known, const std::string& text) { return known ? text : "-"; }

std::string DetectionText(const DrillOutcome& d) {
  const std::optional<double> s = d.detection_seconds();
  return s ? absl::StrFormat("%.3f s", *s) : "-";
}

std::string RestoredText(const DrillOutcome& d) {
  if (!d.status.resumed()) return "-";
  return d.status.fresh_start() ? "fresh start" : absl::StrCat("step ", d.status.restored_step());
}

// ------------------------------------------------------------- HTML

// The drill's timeline, in seconds from the injection (or the order, before
// one): the order, the injection, the failures recorded, the verifications,
// the fault lifted and the resumption as marks; the fault and the downtime
// as bands; the commits as ticks.
std::string TimelineSvg(const DrillOutcome& d) {
  const ckptd::v1::DrillStatus& st = d.status;
  std::vector<svg::Mark> marks;
  marks.push_back({st.ordered_unix_nanos(), "ordered", "ordered", "the coordinator took the order"});
  const int64_t injected_at = d.injected ? st.report().injected_unix_nanos() : 0;
  if (d.injected) marks.push_back({injected_at, "injected", "fault", st.report().detail()});
  for (const auto& e : st.events()) {
    marks.push_back({e.unix_nanos(), absl::StrCat("detected ", FailureKindName(e.kind())), "detect",
                     absl::StrCat(Where(e), ": ", e.detail())});
  }
  if (d.damaged_verified) {
    marks.push_back({d.damaged_verified_unix_nanos, absl::StrCat("verified step ", d.damaged_verified->step()),
                     "verify", d.damaged_verified->ok() ? "intact" : "damaged: quarantined"});
  }
  const DrillScenarioInfo* info = FindDrillScenario(st.request().scenario());
  const bool lasting = info != nullptr && info->timed;
  if (lasting && st.report().ended() && st.report().ended_unix_nanos() > 0) {
    marks.push_back({st.report().ended_unix_nanos(), "fault lifted", "lifted", ""});
  }
  if (st.resumed()) {
    marks.push_back(
        {st.resumed_unix_nanos(),
         st.fresh_start() ? std::string("resumed fresh") : absl::StrCat("resumed from ", st.restored_step()), "resume",
         "the first step after the restore"});
  }
  if (d.restored_verified) {
    marks.push_back({d.restored_verified_unix_nanos, absl::StrCat("verified step ", d.restored_verified->step()),
                     "verify", d.restored_verified->ok() ? "intact" : "damaged"});
  }
  // The axis spans the coordinator's times. The verifications and the end
  // are this machine's: its clock may be off, so they widen the axis only
  // when they fall near it (and are drawn at its edge otherwise).
  svg::TimeAxis axis;
  axis.origin = injected_at > 0 ? injected_at : st.ordered_unix_nanos();
  axis.from = st.ordered_unix_nanos();
  axis.to = axis.from + 1;
  for (const svg::Mark& m : marks) {
    if (m.nanos > 0 && m.css_class != "verify") {
      axis.from = std::min(axis.from, m.nanos);
      axis.to = std::max(axis.to, m.nanos);
    }
  }
  constexpr int64_t kNear = int64_t{600} * 1'000'000'000;
  for (int64_t local : {d.ended_unix_nanos, d.damaged_verified_unix_nanos, d.restored_verified_unix_nanos}) {
    if (local > axis.to && local - axis.to < kNear) axis.to = local;
  }
  const int64_t pad = std::max<int64_t>((axis.to - axis.from) / 30, 1);
  axis.from -= pad;
  axis.to += pad;
  axis.left = 130;
  axis.width = 820;

  svg::Timeline timeline(axis);
  const size_t fault = timeline.AddLane("fault active");
  const size_t down = timeline.AddLane("training down");
  const size_t checkpoints = timeline.AddLane("checkpoints");
  if (d.injected) {
    const int64_t until = st.report().ended() && st.report().ended_unix_nanos() > 0 ? st.report().ended_unix_nanos()
                          : lasting                                                 ? axis.to
                                                                                    : injected_at;
    timeline.AddBand(fault, injected_at, until, "band-fault",
                     absl::StrFormat("fault active %.3f s", SecondsBetween(injected_at, until)));
  }
  if (st.resumed() && st.failed_unix_nanos() > 0) {
    timeline.AddBand(down, st.failed_unix_nanos(), st.resumed_unix_nanos(), "band-down",
                     absl::StrFormat("from the failure to the first step after the restore: %.3f s",
                                     SecondsBetween(st.failed_unix_nanos(), st.resumed_unix_nanos())));
  }
  for (const StepEntry& e : d.steps) {
    const bool quarantined = e.state() == ckptd::v1::STEP_QUARANTINED;
    timeline.AddTick(checkpoints, e.committed_unix_nanos(), quarantined ? "ckpt-bad" : "ckpt",
                     absl::StrCat("step ", e.step(), " committed",
                                  quarantined ? absl::StrCat(", then quarantined: ", e.reason()) : ""));
  }
  for (svg::Mark& m : marks) timeline.AddMark(std::move(m));
  return timeline.Render(absl::StrCat("Timeline of the ", d.scenario, " drill on job ", d.job));
}

constexpr char kPageStyle[] = R"(
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .6em 0; }
td, th { border-bottom: 1px solid #ddd; padding: .25em .8em .25em 0; text-align: left; vertical-align: top; }
th { font-weight: 600; }
.pass { color: #17803d; font-weight: 600; } .fail { color: #c0262d; font-weight: 600; }
.muted { color: #777; }
svg.timeline { display: block; margin: .8em 0; font: 11px system-ui, sans-serif; }
svg .lane { text-anchor: end; fill: #555; }
svg .grid { stroke: #eee; }
svg .axis { stroke: #444; } svg .tick { stroke: #444; fill: #444; text-anchor: middle; }
svg .band-fault { fill: #f0a04b; opacity: .7; } svg .band-down { fill: #d9534f; opacity: .6; }
svg .ckpt { stroke: #2e8b57; stroke-width: 2; } svg .ckpt-bad { stroke: #c0262d; stroke-width: 3; }
svg .mark line { stroke-dasharray: 3 3; stroke: #888; }
svg .mark.ordered circle { fill: #888; } svg .mark.fault circle { fill: #e67e22; }
svg .mark.detect circle { fill: #c0262d; } svg .mark.verify circle { fill: #2a6fdb; }
svg .mark.lifted circle { fill: #b08900; } svg .mark.resume circle { fill: #17803d; }
)";

void AppendDrillSection(const DrillOutcome& d, size_t index, std::string* s) {
  absl::StrAppend(s, "<section id=\"drill-", index, "\">\n<h2>", index, ". ", XmlEscape(DrillTitle(d)),
                  ": <span class=\"", VerdictHtml(d.passed()), "</span></h2>\n");
  absl::StrAppend(s, "<p class=\"muted\">drill ", d.status.drill_id(), " of job ", XmlEscape(d.job), ", ordered ",
                  XmlEscape(IsoTime(d.status.ordered_unix_nanos())),
                  d.injected ? absl::StrCat("; ", XmlEscape(d.status.report().detail())) : "", "</p>\n");
  *s += TimelineSvg(d);
  *s += "<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(s, "<tr><th>", XmlEscape(k), "</th><td>", XmlEscape(v), "</td></tr>\n");
  };
  if (d.failover_seconds) row("new leader", absl::StrFormat("%s, %.2f s after the kill", d.new_leader, *d.failover_seconds));
  if (d.next_commit_seconds) row("next commit", absl::StrFormat("%.2f s after the kill", *d.next_commit_seconds));
  row("detection", DetectionText(d));
  row("step restored", RestoredText(d));
  if (d.status.restore_sources().ranks_size() > 0) row("read from", RestoreSourcesText(d.status.restore_sources()));
  row("step at the failure", Figure(d.status.resumed(), absl::StrCat(d.status.step_at_failure())));
  row("work lost", Figure(d.status.resumed(), absl::StrFormat("%d steps (%.1f s at %.3f s per step)", d.lost_steps,
                                                              d.lost_seconds, d.status.step_seconds())));
  row("restart", Figure(d.status.resumed(), absl::StrFormat("%.3f s from the failure to the first step after the "
                                                            "restore",
                                                            d.restart_seconds)));
  if (d.restored_verified) {
    row("restored step verified", d.restored_verified->ok()
                                      ? absl::StrCat("intact: ", d.restored_verified->shards_done(), " shards, ",
                                                     HumanBytes(d.restored_verified->bytes_done()))
                                      : VerifiedText(*d.restored_verified));
  } else if (!d.restored_unverified_reason.empty()) {
    row("restored step verified", absl::StrCat("no: ", d.restored_unverified_reason));
  }
  *s += "</table>\n<table>\n<tr><th>verdict</th><th>expectation</th><th>detail</th></tr>\n";
  for (const DrillVerdict& v : d.verdicts) {
    absl::StrAppend(s, "<tr><td class=\"", VerdictHtml(v.held), "</td><td>", XmlEscape(v.expectation), "</td><td>",
                    XmlEscape(v.detail), "</td></tr>\n");
  }
  *s += "</table>\n";
  if (!d.status.events().empty()) {
    *s += "<table>\n<tr><th>failure recorded</th><th>at</th><th>where</th><th>detail</th></tr>\n";
    const int64_t origin = d.injected ? d.status.report().injected_unix_nanos() : d.status.ordered_unix_nanos();
    for (const auto& e : d.status.events()) {
      absl::StrAppend(s, "<tr><td>", FailureKindName(e.kind()), "</td><td>",
                      XmlEscape(svg::OffsetLabel(SecondsBetween(origin, e.unix_nanos()))), "</td><td>",
                      XmlEscape(Where(e)), "</td><td>", XmlEscape(e.detail()), "</td></tr>\n");
    }
    *s += "</table>\n";
  }
  *s += "</section>\n";
}

}  // namespace

std::string DrillTitle(const DrillOutcome& d) {
  if (d.status.request().scenario() == ckptd::v1::KILL_COORDINATOR) {
    return absl::StrCat(d.scenario, ": the leader ", d.status.node_id());
  }
  return absl::StrCat(
      d.scenario, " on node ", d.status.node_id(),
      d.status.request().target_node().empty() ? absl::StrCat(" (rank ", d.status.request().rank(), ")") : "",
      d.status.partner_nodes_size() > 0
          ? absl::StrCat(" and its partners ", absl::StrJoin(d.status.partner_nodes(), ", "))
          : "");
}

void WriteDrillJson(const DrillOutcome& d, JsonWriter& w) {
  const ckptd::v1::DrillStatus& st = d.status;
  w.BeginObject();
  w.Field("drill_id", st.drill_id());
  w.Field("scenario", d.scenario);
  w.Field("job", d.job);
  w.Field("target", d.target);
  w.Field("node", st.node_id());
  w.Key("partner_nodes");
  w.BeginArray();
  for (const std::string& p : st.partner_nodes()) w.String(p);
  w.EndArray();
  w.Field("ordered_unix_nanos", st.ordered_unix_nanos());
  w.Field("injected", d.injected);
  w.Field("injected_unix_nanos", st.report().injected_unix_nanos());
  w.Field("detail", st.report().detail());
  w.Field("error", st.report().error());
  w.Key("detection_seconds");
  if (std::optional<double> s = d.detection_seconds()) {
    w.Double(*s);
  } else {
    w.Null();
  }
  w.Key("failures");
  w.BeginArray();
  for (const auto& e : st.events()) {
    w.BeginObject();
    w.Field("kind", FailureKindName(e.kind()));
    w.Field("node", e.node_id());
    if (e.has_rank()) w.Field("rank", e.rank());
    w.Field("unix_nanos", e.unix_nanos());
    w.Field("detail", e.detail());
    w.EndObject();
  }
  w.EndArray();
  w.Field("resumed", st.resumed());
  w.Field("fresh_start", st.fresh_start());
  w.Field("restored_step", st.restored_step());
  w.Key("restore_sources");
  if (st.restore_sources().ranks_size() > 0) {
    WriteRestoreSummary(w, st.restore_sources());
  } else {
    w.Null();
  }
  w.Field("step_at_failure", st.step_at_failure());
  w.Field("failed_unix_nanos", st.failed_unix_nanos());
  w.Field("resumed_unix_nanos", st.resumed_unix_nanos());
  w.Field("lost_steps", d.lost_steps);
  w.Field("lost_seconds", d.lost_seconds);
  w.Field("restart_seconds", d.restart_seconds);
  if (d.failover_seconds) {
    w.Field("failover_seconds", *d.failover_seconds);
    w.Field("new_leader", d.new_leader);
  }
  if (d.next_commit_seconds) w.Field("next_commit_seconds", *d.next_commit_seconds);
  w.Field("fault_lifted", st.report().ended());
  w.Field("fault_lifted_unix_nanos", st.report().ended_unix_nanos());
  if (d.damaged_verified) w.Field("verified_step", d.damaged_verified->step());
  if (st.request().scenario() == ckptd::v1::CORRUPT_MEMORY && d.injected) w.Field("damaged_step", st.report().step());
  w.Key("restored_verified");
  if (d.restored_verified) {
    w.BeginObject();
    w.Field("step", d.restored_verified->step());
    w.Field("ok", d.restored_verified->ok());
    w.Field("shards", d.restored_verified->shards_done());
    w.Field("bytes", d.restored_verified->bytes_done());
    w.Key("problems");
    w.BeginArray();
    for (const std::string& p : d.restored_verified->problems()) w.String(p);
    w.EndArray();
    w.EndObject();
  } else {
    w.Null();
  }
  if (!d.restored_unverified_reason.empty()) w.Field("restored_unverified_reason", d.restored_unverified_reason);
  if (!d.restored_verify_error.empty()) w.Field("restored_verify_error", d.restored_verify_error);
  w.Key("commits");
  w.BeginArray();
  for (const StepEntry& e : d.steps) {
    if (e.committed_unix_nanos() < st.ordered_unix_nanos()) continue;
    w.BeginObject();
    w.Field("step", e.step());
    w.Field("state", StepStateName(e.state()));
    w.Field("committed_unix_nanos", e.committed_unix_nanos());
    w.EndObject();
  }
  w.EndArray();
  w.Key("verdict");
  w.BeginArray();
  for (const DrillVerdict& v : d.verdicts) {
    w.BeginObject();
    w.Field("expectation", v.expectation);
    w.Field("held", v.held);
    w.Field("detail", v.detail);
    w.EndObject();
  }
  w.EndArray();
  w.Field("passed", d.passed());
  w.EndObject();
}

void PrintDrillReport(const DrillOutcome& d, std::ostream& out) {
  const ckptd::v1::DrillStatus& st = d.status;
  const int64_t injected_at = st.report().injected_unix_nanos();
  auto at = [&](int64_t nanos) {
    return injected_at > 0 ? absl::StrFormat("%+8.3f s", SecondsBetween(injected_at, nanos)) : IsoTime(nanos);
  };
  if (st.partner_nodes_size() > 0) {
    out << "\npartner nodes killed with node " << TerminalSafe(st.node_id()) << ": "
        << TerminalSafe(absl::StrJoin(st.partner_nodes(), ", ")) << "\n";
  }
  out << "\ntimeline (from the injection)\n";
  out << "  " << at(st.ordered_unix_nanos()) << "  ordered\n";
  if (d.injected) out << "  " << at(injected_at) << "  injected: " << TerminalSafe(st.report().detail()) << "\n";
  if (d.failover_seconds) {
    out << "  " << absl::StrFormat("%+8.3f s", *d.failover_seconds) << "  " << TerminalSafe(d.new_leader)
        << " leads\n";
  }
  if (d.next_commit_seconds) {
    out << "  " << absl::StrFormat("%+8.3f s", *d.next_commit_seconds) << "  the job committed a step\n";
  }
  for (const auto& e : st.events()) {
    out << "  " << at(e.unix_nanos()) << "  detected " << FailureKindName(e.kind())
        << (e.node_id().empty() ? "" : " on ") << TerminalSafe(Where(e)) << ": " << TerminalSafe(e.detail()) << "\n";
  }
  if (d.damaged_verified) {
    out << "  " << at(d.damaged_verified_unix_nanos) << "  verified step " << d.damaged_verified->step() << ": "
        << VerifiedText(*d.damaged_verified) << "\n";
  }
  if (st.report().ended()) out << "  " << at(st.report().ended_unix_nanos()) << "  fault lifted\n";
  if (st.resumed()) {
    out << "  " << at(st.resumed_unix_nanos()) << "  training resumed from "
        << (st.fresh_start() ? std::string("a fresh start") : absl::StrCat("step ", st.restored_step())) << "\n";
  }
  if (d.restored_verified) {
    out << "  " << at(d.restored_verified_unix_nanos) << "  verified the restored step " << d.restored_verified->step()
        << ": " << VerifiedText(*d.restored_verified) << "\n";
  } else if (!d.restored_unverified_reason.empty()) {
    out << "  restored step not verified: " << TerminalSafe(d.restored_unverified_reason) << "\n";
  }
  if (st.resumed()) {
    out << absl::StrFormat(
        "\nwork lost    %d steps (%.1f s at %.3f s per step)\nrestart      %.3f s from the "
        "failure to the first step after the restore\n",
        d.lost_steps, d.lost_seconds, st.step_seconds(), d.restart_seconds);
    if (st.restore_sources().ranks_size() > 0) {
      out << "read from    " << TerminalSafe(RestoreSourcesText(st.restore_sources())) << "\n";
    }
  }
  out << "\nverdict\n";
  for (const DrillVerdict& v : d.verdicts) {
    out << "  " << PassOrFail(v.held) << "  " << TerminalSafe(v.expectation) << (v.detail.empty() ? "" : ": ")
        << TerminalSafe(v.detail) << "\n";
  }
  out << "drill: " << PassOrFail(d.passed()) << "\n";
}

std::string DrillHtmlPage(const std::vector<DrillOutcome>& drills, absl::string_view title) {
  const size_t passed = PassedCount(drills);
  std::string s =
      absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>", XmlEscape(title),
                   "</title>\n<style>", kPageStyle, "</style>\n</head>\n<body>\n<h1>", XmlEscape(title), "</h1>\n");
  absl::StrAppend(&s, "<p>", passed, " of ", drills.size(), " drill", drills.size() == 1 ? "" : "s",
                  " passed: <span class=\"", VerdictHtml(passed == drills.size() && !drills.empty()), "</span></p>\n");
  s += "<table>\n<tr><th>#</th><th>drill</th><th>detected</th><th>restored</th><th>work lost</th>"
       "<th>restart</th><th>verdict</th></tr>\n";
  for (size_t i = 0; i < drills.size(); ++i) {
    const DrillOutcome& d = drills[i];
    absl::StrAppend(&s, "<tr><td>", i + 1, "</td><td><a href=\"#drill-", i + 1, "\">", XmlEscape(DrillTitle(d)),
                    "</a></td><td>", DetectionText(d), "</td><td>", RestoredText(d), "</td><td>",
                    Figure(d.status.resumed(), absl::StrFormat("%d steps, %.1f s", d.lost_steps, d.lost_seconds)),
                    "</td><td>", Figure(d.status.resumed(), absl::StrFormat("%.3f s", d.restart_seconds)),
                    "</td><td class=\"", VerdictHtml(d.passed()), "</td></tr>\n");
  }
  s += "</table>\n";
  for (size_t i = 0; i < drills.size(); ++i) AppendDrillSection(drills[i], i + 1, &s);
  s += "<p class=\"muted\">Times on the timelines are seconds from the injection. Hover over a mark for its "
       "detail.</p>\n</body>\n</html>\n";
  return s;
}

void PrintSuiteSummary(const SuiteReport& s, std::ostream& out) {
  const size_t passed = PassedCount(s.drills);
  const size_t not_run = s.lines.size() - s.drills.size();
  out << "\nsuite summary: job " << TerminalSafe(s.job) << ", " << TerminalSafe(s.file) << "\n";
  Table t({"#", "line", "scenario", "target", "node", "detected", "restored", "lost", "verdict"}, {0, 1});
  for (size_t i = 0; i < s.lines.size(); ++i) {
    const SuiteReport::Line& line = s.lines[i];
    std::vector<std::string> row = {absl::StrCat(i + 1), absl::StrCat(line.number), line.scenario,
                                    line.target.empty() ? "-" : line.target};
    if (i < s.drills.size()) {
      const DrillOutcome& d = s.drills[i];
      row.insert(row.end(), {d.status.node_id(), DetectionText(d), RestoredText(d),
                             Figure(d.status.resumed(), absl::StrCat(d.lost_steps, " steps")), PassOrFail(d.passed())});
    } else {
      row.insert(row.end(), {"-", "-", "-", "-", "not run"});
    }
    t.Add(std::move(row));
  }
  t.Print(out);
  if (!s.stopped.empty()) out << "stopped early: " << TerminalSafe(s.stopped) << "\n";
  out << "suite: " << PassOrFail(s.passed()) << " (" << passed << " of " << s.lines.size() << " drills passed"
      << (not_run > 0 ? absl::StrCat(", ", not_run, " not run") : "") << ")\n";
}

void WriteSuiteJson(const SuiteReport& s, JsonWriter& w) {
  const size_t passed = PassedCount(s.drills);
  w.BeginObject();
  w.Field("job", s.job);
  w.Field("file", s.file);
  w.Key("drills");
  w.BeginArray();
  for (size_t i = 0; i < s.drills.size(); ++i) {
    w.BeginObject();
    w.Field("line", s.lines[i].number);
    w.Field("spec", s.lines[i].text);
    w.Key("report");
    WriteDrillJson(s.drills[i], w);
    w.EndObject();
  }
  w.EndArray();
  w.Key("not_run");
  w.BeginArray();
  for (size_t i = s.drills.size(); i < s.lines.size(); ++i) {
    w.BeginObject();
    w.Field("line", s.lines[i].number);
    w.Field("spec", s.lines[i].text);
    w.EndObject();
  }
  w.EndArray();
  w.Field("stopped", s.stopped);
  w.Field("drills_passed", static_cast<uint64_t>(passed));
  w.Field("drills_failed", static_cast<uint64_t>(s.drills.size() - passed));
  w.Field("drills_not_run", static_cast<uint64_t>(s.lines.size() - s.drills.size()));
  w.Field("passed", s.passed());
  w.EndObject();
}

}  // namespace ckptd::cli
