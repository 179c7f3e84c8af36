#!/usr/bin/env bash
# Prints ckptd-alerts.yaml as a PrometheusRule for the Prometheus Operator:
# the same groups under spec:, comments kept.
#
#   deploy/prometheus/prometheusrule.sh > deploy/kubernetes/monitoring/prometheusrule.yaml
#
# (tests/deploy/deploy_files_test.sh fails while that file is not its output.)
set -euo pipefail
rules="$(dirname "$0")/ckptd-alerts.yaml"
grep -q '^groups:$' "$rules" || { echo "prometheusrule.sh: no 'groups:' line in $rules" >&2; exit 1; }
cat <<'HEAD'
# The alert rules of deploy/prometheus/ckptd-alerts.yaml for the Prometheus
# Operator. Generated: edit that file, then run
#   deploy/prometheus/prometheusrule.sh > deploy/kubernetes/monitoring/prometheusrule.yaml
# Prometheus loads only the PrometheusRules its ruleSelector matches: give
# it the label yours asks for in monitoring/kustomization.yaml (labels:).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: ckptd
  labels:
    app.kubernetes.io/name: ckptd
spec:
HEAD
# The file from its groups: on (its header comment is about the file),
# indented under spec:.
sed -n '/^groups:$/,$ s/^\(.\)/  \1/p' "$rules"
