#!/usr/bin/env bash
# The deployment files (deploy/systemd, deploy/kubernetes, deploy/slurm,
# deploy/prometheus, deploy/grafana) and docs/operations.md checked against
# each other and against the binaries just built, in half a minute:
#   1. Kubernetes: yamllint, kustomize builds (the commented-out switches
#      turned on: the replicated coordinators' component ha/, the object
#      store), Kubernetes' schemas (kubernetes-validate) on the manifests and
#      the builds, and a structural check of every manifest, the sidecar's
#      security settings, the agent's metrics port, probes, priority and
#      memory, the monitors (monitoring/) and the PyTorchJob (kubeflow/)
#      included, and of the build with ha/ (the replicas' --advertise are the
#      agents' --coordinator list, their --etcd-endpoints the etcd
#      StatefulSet's members, a PodDisruptionBudget per StatefulSet);
#   2. systemd: `systemd-analyze verify` and `security --offline` on the units
#      (ExecStart pointed at BIN_DIR), the coordinator's with the drop-in
#      ha.conf too, and their env files against the units;
#   3. shell: `bash -n` and shellcheck on the Slurm scripts, install.sh,
#      prometheusrule.sh and this test; install.sh into a temporary root;
#      torchrun.sbatch's agents, torchruns, rendezvous and trainer;
#   4. every --flag passed to a ckptd binary in those files (and in
#      docs/operations.md, the alert rules, the dashboard) is one its --help
#      lists; every ckptd_* metric the doc names is one a binary registers;
#   5. the doc's TLS recipe, run as written: a coordinator started with
#      coordinator.env's flags, an agent with agent.env's, and ckptctl talk
#      mutual TLS with its certificates;
#   6. the Dockerfile: its runtime packages hold every shared library the
#      binaries load; its build packages are ones install-deps installs;
#   7. replicated coordinators: two started as ha.conf does, with
#      coordinator-ha.env's flags, on a real etcd (one member, loopback):
#      one leads, the standby names it, and takes over the leader's SIGKILL;
#   8. monitoring: promtool check rules, test rules and check config on
#      deploy/prometheus; the alert rules' labels, annotations, metrics and
#      scrape jobs; the PrometheusRule generated from them; the Grafana
#      dashboard's structure, variables, metrics and PromQL.
#
#   deploy_files_test.sh BIN_DIR [WORK_DIR]
# Needs yamllint, shellcheck, python3-yaml, openssl, systemd-analyze, etcd
# and promtool (scripts/install-deps.sh installs them; promtool into
# .tools/), and kustomize or kubectl (not a
# Debian 12 package in a version with components, nor on PyPI: without one
# the kustomize builds and the checks of their output are skipped). Prints ok/FAILED per check and
# "N passed, M failed"; exits 1 when any failed.
set -uo pipefail
BIN="$(cd "${1:?usage: deploy_files_test.sh BIN_DIR [WORK_DIR]}" && pwd)"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -n "${2:-}" ]; then
  W="$2"
  rm -rf "$W" && mkdir -p "$W"
else
  W="$(mktemp -d)"
fi
W="$(cd "$W" && pwd)"
KEEP_W="${2:-}"
# Processes the checks start (in subshells) are listed here, for cleanup.
PIDFILE="$W/pids"
: >"$PIDFILE"
stop_started() {
  local p
  while read -r p; do kill -KILL "$p" 2>/dev/null; done <"$PIDFILE"
  : >"$PIDFILE"
}
cleanup() {
  stop_started
  wait 2>/dev/null
  [ -z "$KEEP_W" ] && [ "$failures" -eq 0 ] && rm -rf "$W"
}
passed=0
failures=0
trap cleanup EXIT
check() {  # check WHAT COMMAND...: runs COMMAND; its output is shown when it fails
  local what="$1" out
  shift
  if out="$("$@" 2>&1)"; then
    echo "ok: $what"
    passed=$((passed + 1))
  else
    echo "FAILED: $what"
    [ -n "$out" ] && sed 's/^/    /' <<<"$out"
    failures=$((failures + 1))
  fi
}
# Debian's python3 (with python3-yaml), also where another python3 comes first on PATH.
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
have() { command -v "$1" >/dev/null 2>&1; }
need() {  # need TOOL PACKAGE
  have "$1" || { echo "FAILED: $1 is missing (Debian package $2; scripts/install-deps.sh installs it)"; failures=$((failures + 1)); return 1; }
}
K8S="$REPO/deploy/kubernetes"
SYSD="$REPO/deploy/systemd"
SLURM="$REPO/deploy/slurm"
DOC="$REPO/docs/operations.md"
PROM="$REPO/deploy/prometheus"
BINARIES=(ckptd-coordinator ckptd-agent ckptctl ckptd-demo-trainer)
# The metrics the binaries serve, for the checks that name them (the doc,
# the alert rules, the dashboard): python3 -c 'import metric_names' with
# PYTHONPATH=$W.
cat >"$W/metric_names.py" <<'PYEOF'
import os, re

def registered(repo):
    """name -> gauge, counter or histogram: every Add{Gauge,Counter,Histogram}("ckptd_...") of
    the sources (tests, build folders and hidden ones left out)."""
    out = {}
    for top, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if not d.startswith(("build", "."))]
        for f in files:
            if f.endswith(".cc") and not f.endswith("_test.cc"):
                text = open(os.path.join(top, f)).read()
                for kind, name in re.findall(r'Add(Gauge|Counter|Histogram)\(\s*"(ckptd_[a-z0-9_]+)"', text):
                    out[name] = kind.lower()
    return out

def documented(doc):
    """name -> type of each row of docs/operations.md's metric tables (| `name` | type | ...)."""
    return dict(re.findall(r"^\| `(ckptd_[a-z0-9_]+)` \| (gauge|counter|histogram) \|", open(doc).read(), re.M))

def unknown(names, known):
    """The names that are no metric of `known` (name -> type); name_bucket, _sum and _count are a
    histogram's series."""
    bad = []
    for n in sorted(set(names)):
        base = re.sub(r"_(bucket|sum|count)$", "", n)
        if n not in known and not (base != n and known.get(base) == "histogram"):
            bad.append(n)
    return bad
PYEOF

# ---------------------------------------------------------- 1. Kubernetes
if need yamllint yamllint; then
  check "yamllint deploy/kubernetes" yamllint -s -c "$K8S/.yamllint" "$K8S"
fi
# kustomize builds, with a standalone kustomize or kubectl's (v1.21 or later:
# components). The switches that are comments in kustomization.yaml (the
# replicated coordinators, ha/; the object store) are built on a copy with
# their lines uncommented, as an operator turns them on. Builds go to $W/k8s.
KUSTOMIZE=()
if have kustomize; then
  KUSTOMIZE=(kustomize build)
elif have kubectl && kubectl kustomize --help >/dev/null 2>&1; then
  KUSTOMIZE=(kubectl kustomize)
fi
kustomize_builds() {
  local d out="$W/k8s"
  mkdir -p "$out"
  for d in . demo sidecar monitoring kubeflow; do
    "${KUSTOMIZE[@]}" "$K8S/$d" >"$out/build-${d/./base}.yaml" || { echo "kustomize build deploy/kubernetes/$d failed"; return 1; }
  done
  # The base with the replicated coordinators' component.
  rm -rf "$out/ha" && cp -r "$K8S" "$out/ha" || return 1
  sed -i 's/^# components:$/components:/; s/^#   - ha$/  - ha/' "$out/ha/kustomization.yaml"
  grep -q '^  - ha$' "$out/ha/kustomization.yaml" || { echo "kustomization.yaml: no commented '# components:' / '#   - ha' switch"; return 1; }
  "${KUSTOMIZE[@]}" "$out/ha" >"$out/build-ha.yaml" || { echo "kustomize build with components: [ha] failed"; return 1; }
  # And with the object store too: the base's switch and ha/'s patch for it.
  rm -rf "$out/ha-s3" && cp -r "$out/ha" "$out/ha-s3" || return 1
  sed -i '/^# configMapGenerator:$/,$ s/^# \{0,1\}//' "$out/ha-s3/kustomization.yaml"
  sed -i '/^# With the storage root in an object store/,$ s/^#   /  /' "$out/ha-s3/ha/kustomization.yaml"
  grep -q '^  - path: object-store.json$' "$out/ha-s3/ha/kustomization.yaml" ||
    { echo "ha/kustomization.yaml: no commented object-store.json patch"; return 1; }
  "${KUSTOMIZE[@]}" "$out/ha-s3" >"$out/build-ha-s3.yaml" ||
    { echo "kustomize build with components: [ha] and the object store failed"; return 1; }
}
if [ ${#KUSTOMIZE[@]} -gt 0 ]; then
  check "kustomize build: deploy/kubernetes, demo, sidecar, monitoring, kubeflow; with components: [ha]; with ha and the object store" \
    kustomize_builds
else
  # Neither Debian 12 (its kubectl 1.20 predates components) nor PyPI ships
  # a kustomize, so CI skips these too; a machine with kubectl runs them.
  echo "skipped: kustomize builds and the replicated coordinators' manifests (no kustomize, no kubectl kustomize)"
fi
k8s_structure() {
  "$PY" - "$K8S" <<'PYEOF'
import glob, os, re, sys
import yaml

root = sys.argv[1]
problems = []
def bad(msg):
    problems.append(msg)

KNOWN = {("v1", "Namespace"), ("v1", "PersistentVolumeClaim"), ("v1", "Service"), ("v1", "Secret"),
         ("v1", "ConfigMap"), ("apps/v1", "Deployment"), ("apps/v1", "DaemonSet"), ("apps/v1", "StatefulSet"),
         ("batch/v1", "Job"), ("policy/v1", "PodDisruptionBudget"), ("networking.k8s.io/v1", "NetworkPolicy"),
         ("scheduling.k8s.io/v1", "PriorityClass"),
         ("kustomize.config.k8s.io/v1beta1", "Kustomization"), ("kustomize.config.k8s.io/v1alpha1", "Component")}
# Kinds of CustomResourceDefinitions (the Prometheus Operator's, Kubeflow's
# training operator's): Kubernetes' schemas do not know them
# (kubernetes-validate only warns), so their fields are checked here.
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PodMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"), ("kubeflow.org/v1", "PyTorchJob")}
KNOWN |= CRDS
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "PyTorchJob")
KUSTOMIZE_KINDS = ("Kustomization", "Component")
# Secrets the operator creates with kubectl before applying (docs/operations.md).
EXTERNAL_SECRETS = {"ckptd-operator-token", "ckptd-agent-token"}

docs = []
for path in sorted(glob.glob(os.path.join(root, "**", "*.yaml"), recursive=True)):
    rel = os.path.relpath(path, root)
    try:
        with open(path) as f:
            loaded = [d for d in yaml.safe_load_all(f) if d is not None]
    except yaml.YAMLError as e:
        bad(f"{rel}: not YAML: {e}")
        continue
    if not loaded:
        bad(f"{rel}: empty")
    for d in loaded:
        if not isinstance(d, dict):
            bad(f"{rel}: a document that is not a mapping")
            continue
        docs.append((rel, d))

def name_of(d):
    return (d.get("metadata") or {}).get("name")

for rel, d in docs:
    av, kind = d.get("apiVersion"), d.get("kind")
    if (av, kind) not in KNOWN:
        bad(f"{rel}: unexpected apiVersion/kind {av!r}/{kind!r}")
    if kind not in KUSTOMIZE_KINDS and not name_of(d):
        bad(f"{rel}: {kind} without metadata.name")

kusts = [(rel, d) for rel, d in docs if d.get("kind") in KUSTOMIZE_KINDS]
objects = [(rel, d) for rel, d in docs if d.get("kind") not in KUSTOMIZE_KINDS]
if not kusts:
    bad("no kustomization.yaml")
# A Component's manifests change the base's (ha/: the coordinator's
# replicas); their wiring is checked on the kustomize build with it.
component_dirs = {os.path.dirname(rel) for rel, k in kusts if k.get("kind") == "Component"}
def in_component(rel):
    return os.path.dirname(rel) in component_dirs

# Every manifest is listed by a kustomization, every listed file exists, and
# every kustomization of workloads replaces the image name their containers use.
listed = set()
image_names = set()
for rel, k in kusts:
    base = os.path.dirname(rel)
    runs = False
    for r in k.get("resources") or []:
        target = os.path.normpath(os.path.join(base, r))
        if not os.path.exists(os.path.join(root, target)):
            bad(f"{rel}: resource {r} does not exist")
        listed.add(target)
        runs = runs or any(orel == target and d.get("kind") in WORKLOAD_KINDS for orel, d in docs)
    imgs = k.get("images") or []
    if runs and not imgs:
        bad(f"{rel}: no images: entry (the image is a placeholder to replace)")
    for i in imgs:
        if not i.get("name") or not i.get("newName"):
            bad(f"{rel}: an images: entry needs name and newName")
        image_names.add(i.get("name"))
for rel in sorted({rel for rel, _ in objects}):
    if rel not in listed:
        bad(f"{rel}: not listed in any kustomization.yaml")

by_kind = {}
for rel, d in objects:
    by_kind.setdefault(d["kind"], []).append((rel, d))
pvcs = {name_of(d): d for _, d in by_kind.get("PersistentVolumeClaim", [])}
secrets = {name_of(d) for _, d in by_kind.get("Secret", [])} | EXTERNAL_SECRETS

workloads = []  # (rel, kind, name, pod template)
for kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
    for rel, d in by_kind.get(kind, []):
        spec = d.get("spec") or {}
        tmpl = spec.get("template") or {}
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        what = f"{rel}: {kind} {name_of(d)}"
        if not labels:
            bad(f"{what}: pod template without labels")
        if kind in ("Deployment", "DaemonSet", "StatefulSet"):
            sel = (spec.get("selector") or {}).get("matchLabels") or {}
            if not sel:
                bad(f"{what}: no selector.matchLabels")
            for k, v in sel.items():
                if labels.get(k) != v:
                    bad(f"{what}: selector {k}={v} does not match the pod labels")
        workloads.append((rel, kind, name_of(d), d, tmpl))

def containers_of(tmpl):
    spec = tmpl.get("spec") or {}
    return (spec.get("initContainers") or []) + (spec.get("containers") or [])

def program(c):
    cmd = c.get("command") or []
    return os.path.basename(cmd[0]) if cmd else None

def arg_after(c, flag):
    args = (c.get("command") or [])[1:] + (c.get("args") or [])
    for i, a in enumerate(args[:-1]):
        if a == flag:
            return str(args[i + 1])
    return None

def mounts_by_path(c, spec):
    vols = {v.get("name"): v for v in spec.get("volumes") or []}
    return {m.get("mountPath"): vols.get(m.get("name")) for m in c.get("volumeMounts") or []}

def mount_for(c, spec, path):
    """The volume whose mount holds `path` (the longest mountPath prefix)."""
    best = None
    for mp, vol in mounts_by_path(c, spec).items():
        if mp and (path == mp or path.startswith(mp.rstrip("/") + "/")):
            if best is None or len(mp) > len(best[0]):
                best = (mp, vol)
    return best

def pod_programs(tmpl):
    return {program(c) for c in containers_of(tmpl)}

roles = {}  # ckptd program -> (what, container, pod spec)
sidecars = []  # (what, pod template) of pods that run the agent beside the trainer
for rel, kind, name, d, tmpl in workloads:
    spec = tmpl.get("spec") or {}
    what = f"{rel}: {kind} {name}"
    volumes = spec.get("volumes") or []
    # A StatefulSet's volumeClaimTemplates are volumes of each pod too.
    claim_templates = [(t.get("metadata") or {}).get("name") for t in (d.get("spec") or {}).get("volumeClaimTemplates") or []]
    vol_names = [v.get("name") for v in volumes] + claim_templates
    if len(set(vol_names)) != len(vol_names):
        bad(f"{what}: duplicate volume names")
    used = set()
    cs = containers_of(tmpl)
    if not spec.get("containers"):
        bad(f"{what}: no containers")
    for c in cs:
        cw = f"{what}: container {c.get('name')!r}"
        if not c.get("name"):
            bad(f"{what}: a container without a name")
        if not c.get("image"):
            bad(f"{cw}: no image")
        elif c["image"] not in image_names:
            bad(f"{cw}: image {c['image']!r} is not one the kustomizations replace ({sorted(image_names)})")
        if not c.get("command"):
            bad(f"{cw}: no command")
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in vol_names:
                bad(f"{cw}: mounts volume {m.get('name')!r}, which the pod does not declare")
            used.add(m.get("name"))
        paths = [m.get("mountPath") for m in c.get("volumeMounts") or []]
        if len(set(paths)) != len(paths):
            bad(f"{cw}: two mounts at one path")
        env_names = {e.get("name") for e in c.get("env") or []}
        for a in (c.get("command") or []) + (c.get("args") or []):
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(a)):
                if var not in env_names:
                    bad(f"{cw}: $({var}) in its command line is not in its env")
        ports = [p.get("name") for p in c.get("ports") or []]
        if len(set(ports)) != len(ports):
            bad(f"{cw}: duplicate port names")
        if program(c) in ("ckptd-coordinator", "ckptd-agent", "ckptd-demo-trainer") and not in_component(rel):
            if pod_programs(tmpl) >= {"ckptd-agent", "ckptd-demo-trainer"}:
                continue  # a sidecar pod: checked below, on its own
            if program(c) in roles:
                bad(f"{cw}: a second {program(c)} container")
            roles[program(c)] = (cw, c, spec)
    if pod_programs(tmpl) >= {"ckptd-agent", "ckptd-demo-trainer"}:
        sidecars.append((what, tmpl))
    for name in claim_templates:
        if name not in used:
            bad(f"{what}: volumeClaimTemplate {name!r} is mounted by no container")
    for v in volumes:
        if v.get("name") not in used:
            bad(f"{what}: volume {v.get('name')!r} is mounted by no container")
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"].get("claimName")
            if claim not in pvcs:
                bad(f"{what}: volume {v.get('name')!r} claims {claim!r}, which no manifest declares")
        if "secret" in v and v["secret"].get("secretName") not in secrets:
            bad(f"{what}: secret {v['secret'].get('secretName')!r} is neither declared nor a documented external one")

# Services select pods and reach their ports.
for rel, svc in by_kind.get("Service", []):
    what = f"{rel}: Service {name_of(svc)}"
    sel = (svc.get("spec") or {}).get("selector") or {}
    if not sel:
        bad(f"{what}: no selector")
    targets = [t for t in workloads
               if all(((t[4].get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in sel.items())]
    if not targets:
        bad(f"{what}: its selector matches no pod template")
    for p in (svc.get("spec") or {}).get("ports") or []:
        tp = p.get("targetPort", p.get("port"))
        found = False
        for t in targets:
            for c in (t[4].get("spec") or {}).get("containers") or []:
                for cp in c.get("ports") or []:
                    if tp == cp.get("name") or tp == cp.get("containerPort"):
                        found = True
        if not found:
            bad(f"{what}: port {p.get('name')!r} targets {tp!r}, which no selected container exposes")

# ckptd's own wiring.
def port_of(listen):
    return int(listen.rsplit(":", 1)[1]) if listen and ":" in listen else None

for prog in ("ckptd-coordinator", "ckptd-agent", "ckptd-demo-trainer"):
    if prog not in roles:
        bad(f"no workload runs {prog}")
if not problems:
    cw, coord, cspec = roles["ckptd-coordinator"]
    aw, agent, aspec = roles["ckptd-agent"]
    tw, trainer, tspec = roles["ckptd-demo-trainer"]
    dep = [d for _, k, _, d, t in workloads if k == "Deployment" and coord in containers_of(t)][0]
    if (dep.get("spec") or {}).get("replicas") != 1 or ((dep["spec"].get("strategy") or {}).get("type")) != "Recreate":
        bad(f"{cw}: the coordinator's Deployment must have replicas: 1 and strategy Recreate")
    cports = {p.get("containerPort"): p.get("name") for p in coord.get("ports") or []}
    for flag in ("--listen", "--metrics-listen"):
        port = port_of(arg_after(coord, flag))
        if port is None or port not in cports:
            bad(f"{cw}: {flag} {arg_after(coord, flag)} is not one of its containerPorts {sorted(cports)}")
    # The agents reach the coordinator through a Service on its --listen port.
    addr = arg_after(agent, "--coordinator") or ""
    host, _, port = addr.rpartition(":")
    svc = [s for _, s in by_kind.get("Service", []) if name_of(s) == host.split(".")[0]]
    if not svc:
        bad(f"{aw}: --coordinator {addr}: no Service named {host.split('.')[0]!r}")
    else:
        sp = [p for p in svc[0]["spec"].get("ports") or [] if str(p.get("port")) == port]
        if not sp:
            bad(f"{aw}: --coordinator {addr}: the Service has no port {port}")
        elif sp[0].get("targetPort") not in (cports.get(port_of(arg_after(coord, "--listen"))), port_of(arg_after(coord, "--listen"))):
            bad(f"{aw}: --coordinator {addr}: the Service port does not lead to the coordinator's --listen port")
    # Coordinator and agents share one ReadWriteMany storage root.
    claims = []
    for w, c, spec in ((cw, coord, cspec), (aw, agent, aspec)):
        root_dir = arg_after(c, "--storage-root")
        m = mount_for(c, spec, root_dir or "")
        if not m or not m[1] or "persistentVolumeClaim" not in m[1]:
            bad(f"{w}: --storage-root {root_dir} is not on a PersistentVolumeClaim")
        else:
            claims.append(m[1]["persistentVolumeClaim"]["claimName"])
    if len(claims) == 2:
        if claims[0] != claims[1]:
            bad(f"the coordinator ({claims[0]}) and the agents ({claims[1]}) use different storage roots")
        elif "ReadWriteMany" not in ((pvcs[claims[0]].get("spec") or {}).get("accessModes") or []):
            bad(f"PersistentVolumeClaim {claims[0]}: the shared storage root must be ReadWriteMany")
    for flag, kind in (("--state-dir", "persistentVolumeClaim"), ("--operator-token-file", "secret"),
                       ("--agent-token-file", "secret")):
        m = mount_for(coord, cspec, arg_after(coord, flag) or "")
        if not m or not m[1] or kind not in m[1]:
            bad(f"{cw}: {flag} {arg_after(coord, flag)} is not on a {kind} volume")
    # Agents present the coordinator's agent token: the same Secret.
    secret_of = lambda c, spec, flag: ((mount_for(c, spec, arg_after(c, flag) or "") or (None, None))[1] or {}).get(
        "secret", {}).get("secretName")
    if secret_of(agent, aspec, "--agent-token-file") is None:
        bad(f"{aw}: --agent-token-file {arg_after(agent, '--agent-token-file')} is not on a secret volume")
    elif secret_of(agent, aspec, "--agent-token-file") != secret_of(coord, cspec, "--agent-token-file"):
        bad(f"{aw}: --agent-token-file is not the coordinator's agent token Secret")
    # The agent's node id comes from the downward API.
    node = arg_after(agent, "--node-id") or ""
    var = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", node)
    env = {e.get("name"): e for e in agent.get("env") or []}
    if not var or (((env.get(var.group(1)) or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") != "spec.nodeName":
        bad(f"{aw}: --node-id must be the node name (env from fieldRef spec.nodeName)")
    # Agent and trainers: one socket folder, one /dev/shm, one uid, one PID namespace.
    def uid(c, spec):
        return (c.get("securityContext") or {}).get("runAsUser", (spec.get("securityContext") or {}).get("runAsUser"))
    if uid(agent, aspec) is None or uid(agent, aspec) != uid(trainer, tspec):
        bad(f"the agent (uid {uid(agent, aspec)}) and the trainers (uid {uid(trainer, tspec)}) must run as one uid: "
            "the socket and the staging are owner-only")
    if aspec.get("hostPID") is not True:
        bad(f"{aw}: needs hostPID: true (the agent watches and signals the trainers' processes)")
    if tspec.get("hostPID") is True:
        bad(f"{tw}: needs no hostPID (the agent takes a trainer's pid from its connection); drop it")
    sockets = []
    for w, c, spec in ((aw, agent, aspec), (tw, trainer, tspec)):
        sock = arg_after(c, "--socket") or ""
        m = mount_for(c, spec, sock)
        if not m or not m[1] or "hostPath" not in m[1]:
            bad(f"{w}: --socket {sock} is not on a hostPath volume")
        else:
            sockets.append((sock, m[1]["hostPath"].get("path"), os.path.relpath(sock, m[0])))
        shm = mounts_by_path(c, spec).get("/dev/shm")
        if not shm or (shm.get("hostPath") or {}).get("path") != "/dev/shm":
            bad(f"{w}: must mount the host's /dev/shm (hostPath) at /dev/shm: the staging memory is there")
    # The node-local tier: on the node's own disk (a hostPath), not on the
    # shared checkpoint volume.
    tier = arg_after(agent, "--local-cache")
    if tier is not None:
        m = mount_for(agent, aspec, tier)
        root = mount_for(agent, aspec, arg_after(agent, "--storage-root") or "")
        if not m or not m[1] or "hostPath" not in m[1]:
            bad(f"{aw}: --local-cache {tier} is not on a hostPath volume (the node's local disk)")
        elif root and root[0] == m[0]:
            bad(f"{aw}: --local-cache {tier} is on the same volume as --storage-root")
    if len(sockets) == 2 and (sockets[0][1], sockets[0][2]) != (sockets[1][1], sockets[1][2]):
        bad(f"the agent's socket {sockets[0]} and the trainers' {sockets[1]} are not the same host file")

    # The agent's metrics: --metrics-listen is its containerPort "metrics",
    # which the probes (and monitoring/podmonitor.yaml) use.
    aports = {p.get("name"): p.get("containerPort") for p in agent.get("ports") or []}
    mport = port_of(arg_after(agent, "--metrics-listen"))
    if mport is None or aports.get("metrics") != mport:
        bad(f"{aw}: --metrics-listen {arg_after(agent, '--metrics-listen')} is not its containerPort named metrics "
            f"({aports.get('metrics')})")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (agent.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or get.get("port") not in ("metrics", mport):
            bad(f"{aw}: needs a {probe} of httpGet {path} on the port metrics")
    live = agent.get("livenessProbe") or {}
    if int(live.get("periodSeconds", 10)) * int(live.get("failureThreshold", 3)) < 60:
        bad(f"{aw}: its livenessProbe restarts it after less than a minute without an answer; a restart drops "
            "what it holds in memory")
    # Its priority, above the trainers' (evicted after them).
    pcs = {name_of(d): d for _, d in by_kind.get("PriorityClass", [])}
    pc = pcs.get(aspec.get("priorityClassName"))
    if not pc:
        bad(f"{aw}: priorityClassName {aspec.get('priorityClassName')!r} is no PriorityClass of the manifests")
    elif pc.get("globalDefault") is not False or not isinstance(pc.get("value"), int) or pc["value"] <= 0:
        bad(f"PriorityClass {name_of(pc)}: needs a positive value and globalDefault: false")
    elif tspec.get("priorityClassName") in pcs and pcs[tspec["priorityClassName"]].get("value", 0) >= pc["value"]:
        bad(f"{tw}: its priority is not below the agent's")
    # Its memory: the staging it allocates is charged to it, so the
    # container's memory (request = limit) holds --memory-budget and more.
    def k8s_bytes(q):
        m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q or ""))
        mult = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9,
                "T": 10**12}
        return int(m.group(1)) * mult[m.group(2)] if m else None
    def ckptd_bytes(v):  # base/flags.cc: K, M, G, T are powers of 1024
        m = re.fullmatch(r"(\d+)([KMGT])?", v or "")
        return int(m.group(1)) << {None: 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)] if m else None
    res = agent.get("resources") or {}
    req, lim = (res.get("requests") or {}).get("memory"), (res.get("limits") or {}).get("memory")
    budget = ckptd_bytes(arg_after(agent, "--memory-budget"))
    if budget is None:
        bad(f"{aw}: needs --memory-budget in bytes (its default, half the machine's memory, ignores the container's)")
    elif req != lim or k8s_bytes(lim) is None:
        bad(f"{aw}: needs a memory request equal to its memory limit (not {req} and {lim})")
    elif k8s_bytes(lim) < budget + 2**30:
        bad(f"{aw}: memory limit {lim} leaves less than 1 GiB beside --memory-budget {arg_after(agent, '--memory-budget')}")
    # The single coordinator: one budget, which allows no voluntary eviction.
    clabels = ((dep["spec"]["template"].get("metadata") or {}).get("labels")) or {}
    def selects(sel, labels):
        return bool(sel) and all(labels.get(k) == v for k, v in sel.items())
    budgets = [d for rel, d in by_kind.get("PodDisruptionBudget", []) if not in_component(rel) and
               selects(((d.get("spec") or {}).get("selector") or {}).get("matchLabels"), clabels)]
    if len(budgets) != 1:
        bad(f"{cw}: {len(budgets)} PodDisruptionBudgets select the coordinator, not 1")
    elif budgets[0]["spec"].get("maxUnavailable") != 0 or "minAvailable" in budgets[0]["spec"]:
        bad(f"PodDisruptionBudget {name_of(budgets[0])}: the single coordinator's needs maxUnavailable: 0 alone")

    # Prometheus Operator (monitoring/): the ServiceMonitor reaches the
    # coordinator's --metrics-listen through its Service, the PodMonitor
    # each agent's; both keep ckptd's job label and name the scrape jobs the
    # alert rules read.
    rules = os.path.join(sys.argv[1], "..", "prometheus", "ckptd-alerts.yaml")
    up_jobs = set(re.findall(r'\bup\{[^}]*job="([^"]+)"', open(rules).read())) if os.path.exists(rules) else set()
    scrape_jobs = set()
    def endpoints(rel, d, field):
        what = f"{rel}: {d['kind']} {name_of(d)}"
        spec = d.get("spec") or {}
        if not (spec.get("selector") or {}).get("matchLabels"):
            bad(f"{what}: needs spec.selector.matchLabels")
        eps = spec.get(field) or []
        if not eps:
            bad(f"{what}: needs spec.{field}")
        for ep in eps:
            if not ep.get("port") or ep.get("path", "/metrics") != "/metrics":
                bad(f"{what}: each of spec.{field} needs a port (its name) and path /metrics")
            if ep.get("honorLabels") is not True:
                bad(f"{what}: needs honorLabels: true (ckptd's label job is the training job)")
            jobs = [r.get("replacement") for r in ep.get("relabelings") or []
                    if r.get("targetLabel") == "job" and not r.get("sourceLabels")]
            if len(jobs) != 1 or jobs[0] not in up_jobs:
                bad(f"{what}: a relabeling must set job to one the alert rules read ({sorted(up_jobs)}), not {jobs}")
            scrape_jobs.update(jobs)
        return what, spec, eps
    metrics_port = port_of(arg_after(coord, "--metrics-listen"))
    for rel, d in by_kind.get("ServiceMonitor", []):
        what, spec, eps = endpoints(rel, d, "endpoints")
        svcs = [s for srel, s in by_kind.get("Service", []) if not in_component(srel) and
                selects((spec.get("selector") or {}).get("matchLabels"), (s.get("metadata") or {}).get("labels") or {})]
        for ep in eps:
            ports = [p for s in svcs for p in (s.get("spec") or {}).get("ports") or [] if p.get("name") == ep.get("port")]
            if not ports:
                bad(f"{what}: no Service it selects has a port named {ep.get('port')!r}")
            for p in ports:
                if p.get("targetPort") not in (cports.get(metrics_port), metrics_port):
                    bad(f"{what}: port {ep.get('port')} does not lead to the coordinator's --metrics-listen port")
    for rel, d in by_kind.get("PodMonitor", []):
        what, spec, eps = endpoints(rel, d, "podMetricsEndpoints")
        agent_labels = [(t.get("metadata") or {}).get("labels") or {} for _, k, _, _, t in workloads
                        if k == "DaemonSet" and agent in containers_of(t)]
        if not any(selects((spec.get("selector") or {}).get("matchLabels"), l) for l in agent_labels):
            bad(f"{what}: its selector does not match the agents' pods")
        for ep in eps:
            if aports.get(ep.get("port")) != mport:
                bad(f"{what}: port {ep.get('port')!r} is not the agent's --metrics-listen port")
    for rel, d in by_kind.get("PrometheusRule", []):
        if not all(g.get("name") and g.get("rules") for g in (d.get("spec") or {}).get("groups") or [None]):
            bad(f"{rel}: PrometheusRule {name_of(d)}: needs spec.groups, each with a name and rules")
    if by_kind.get("ServiceMonitor") or by_kind.get("PodMonitor"):
        for job in sorted(up_jobs - scrape_jobs):
            bad(f"the alert rules read up{{job=\"{job}\"}}, which no ServiceMonitor or PodMonitor makes")

    # Kubeflow PyTorchJobs (kubeflow/): a Master and Workers running one
    # pod, restarted on ckptd's exit 75, whose ranks reach the node's agent
    # as the demo's trainers do.
    agent_sock = arg_after(agent, "--socket") or ""
    am = mount_for(agent, aspec, agent_sock)
    agent_socket_file = (((am[1] or {}).get("hostPath") or {}).get("path"), os.path.relpath(agent_sock, am[0])) if am else None
    # What the training operator sets in the container "pytorch" (nprocPerNode: PET_NPROC_PER_NODE).
    OPERATOR_ENV = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "PET_NNODES", "PET_NPROC_PER_NODE",
                    "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PYTHONUNBUFFERED"}
    for rel, d in by_kind.get("PyTorchJob", []):
        what = f"{rel}: PyTorchJob {name_of(d)}"
        spec = d.get("spec") or {}
        replicas = spec.get("pytorchReplicaSpecs") or {}
        if set(replicas) != {"Master", "Worker"}:
            bad(f"{what}: pytorchReplicaSpecs must be Master and Worker, not {sorted(replicas)}")
            continue
        if replicas["Master"].get("replicas") != 1:
            bad(f"{what}: Master needs replicas: 1 (it serves the rendezvous)")
        if not isinstance(replicas["Worker"].get("replicas"), int) or replicas["Worker"]["replicas"] < 1:
            bad(f"{what}: Worker needs replicas: 1 or more")
        if not re.fullmatch(r"[1-9][0-9]*", str(spec.get("nprocPerNode", ""))):
            bad(f"{what}: needs nprocPerNode, the ranks torchrun starts per pod (a number, as a string)")
        if replicas["Master"].get("template") != replicas["Worker"].get("template"):
            bad(f"{what}: Master and Worker must run the same pod template")
        for role in ("Master", "Worker"):
            rw = f"{what}: {role}"
            r = replicas[role]
            if r.get("restartPolicy") != "OnFailure":
                bad(f"{rw}: needs restartPolicy: OnFailure (a pod whose ranks exit 75 is started again; "
                    f"not {r.get('restartPolicy')})")
            tmpl = r.get("template") or {}
            pspec = tmpl.get("spec") or {}
            cs = [c for c in pspec.get("containers") or [] if c.get("name") == "pytorch"]
            if not cs:
                bad(f"{rw}: no container named pytorch (the one the operator configures)")
                continue
            c = cs[0]
            cw = f"{rw}: container pytorch"
            if c.get("image") not in image_names:
                bad(f"{cw}: image {c.get('image')!r} is not one the kustomizations replace ({sorted(image_names)})")
            if not c.get("command"):
                bad(f"{cw}: no command")
            env = {e.get("name"): e for e in c.get("env") or []}
            for a in (c.get("command") or []) + (c.get("args") or []):
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(a)):
                    if var not in env and var not in OPERATOR_ENV:
                        bad(f"{cw}: $({var}) in its command line is neither in its env nor set by the operator")
            vols = {v.get("name") for v in pspec.get("volumes") or []}
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in vols:
                    bad(f"{cw}: mounts volume {m.get('name')!r}, which the pod does not declare")
            sock = arg_after(c, "--socket") or (env.get("CKPTD_SOCKET") or {}).get("value") or ""
            m = mount_for(c, pspec, sock)
            if not sock or not m or not m[1] or "hostPath" not in m[1]:
                bad(f"{cw}: CKPTD_SOCKET {sock or '(none)'} is not on a hostPath volume")
            elif (m[1]["hostPath"].get("path"), os.path.relpath(sock, m[0])) != agent_socket_file:
                bad(f"{cw}: CKPTD_SOCKET {sock} is not the agent's socket {agent_sock} (host file {agent_socket_file})")
            shm = mounts_by_path(c, pspec).get("/dev/shm")
            if not shm or (shm.get("hostPath") or {}).get("path") != "/dev/shm":
                bad(f"{cw}: must mount the host's /dev/shm (hostPath) at /dev/shm: the staging memory is there")
            if uid(c, pspec) is None or uid(c, pspec) != uid(agent, aspec):
                bad(f"{cw}: must run as the agent's uid {uid(agent, aspec)}, not {uid(c, pspec)} "
                    "(the socket and the staging are owner-only)")
            if pspec.get("hostPID"):
                bad(f"{rw}: needs no hostPID (the agent takes a trainer's pid from its connection)")
            script = (env.get("TRAINER_SCRIPT") or {}).get("value") or ""
            if script.startswith("/opt/ckptd/") and \
                    not os.path.exists(os.path.join(sys.argv[1], "..", "..", script[len("/opt/ckptd/"):])):
                bad(f"{cw}: TRAINER_SCRIPT {script}: the repository (at /opt/ckptd of the image) has no "
                    f"{script[len('/opt/ckptd/'):]}")

    # The sidecar: the agent inside the training pod, with no host privilege.
    if not sidecars:
        bad("no pod runs the agent as a sidecar beside the trainer (deploy/kubernetes/sidecar)")
    for what, tmpl in sidecars:
        spec = tmpl.get("spec") or {}
        inits = spec.get("initContainers") or []
        agents = [c for c in inits if program(c) == "ckptd-agent"]
        trainers = [c for c in spec.get("containers") or [] if program(c) == "ckptd-demo-trainer"]
        if not agents or agents[0].get("restartPolicy") != "Always":
            bad(f"{what}: the agent must be a native sidecar (an initContainer with restartPolicy: Always)")
            continue
        if not trainers:
            bad(f"{what}: the trainer must be one of the pod's containers")
            continue
        sa, st = agents[0], trainers[0]
        for field in ("hostPID", "hostIPC", "hostNetwork"):
            if spec.get(field):
                bad(f"{what}: {field} is set; the sidecar uses no host namespace")
        if spec.get("shareProcessNamespace") is not True:
            bad(f"{what}: needs shareProcessNamespace: true (the agent watches the trainer's process)")
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                bad(f"{what}: volume {v.get('name')!r} is a hostPath; the sidecar needs none")
        pod_sc = spec.get("securityContext") or {}
        for c in containers_of(tmpl):
            cw = f"{what}: container {c.get('name')!r}"
            sc = c.get("securityContext") or {}
            if sc.get("privileged"):
                bad(f"{cw}: privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                bad(f"{cw}: needs allowPrivilegeEscalation: false")
            if sc.get("readOnlyRootFilesystem") is not True:
                bad(f"{cw}: needs readOnlyRootFilesystem: true")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []) or (sc.get("capabilities") or {}).get("add"):
                bad(f"{cw}: must drop ALL capabilities and add none")
            if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
                bad(f"{cw}: needs runAsNonRoot: true")
            if sc.get("runAsUser", pod_sc.get("runAsUser")) in (None, 0):
                bad(f"{cw}: needs a non-root runAsUser")
        if (pod_sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            bad(f"{what}: needs seccompProfile RuntimeDefault")
        # The schema takes any string here (the policies: Always, OnRootMismatch).
        if "fsGroup" in pod_sc and pod_sc.get("fsGroupChangePolicy") != "OnRootMismatch":
            bad(f"{what}: with fsGroup, needs fsGroupChangePolicy: OnRootMismatch (not "
                f"{pod_sc.get('fsGroupChangePolicy') or '(none)'}): no walk over the checkpoint volume at each mount")
        if spec.get("automountServiceAccountToken") is not False:
            bad(f"{what}: needs automountServiceAccountToken: false (the pod calls no Kubernetes API)")
        aw, tw = f"{what}: container {sa.get('name')!r}", f"{what}: container {st.get('name')!r}"
        # One socket file and one /dev/shm, both on the pod's own volumes.
        where = []
        for w, c in ((aw, sa), (tw, st)):
            sock = arg_after(c, "--socket") or ""
            m = mount_for(c, spec, sock)
            if not m or not m[1] or "emptyDir" not in m[1]:
                bad(f"{w}: --socket {sock} is not on an emptyDir volume of the pod")
            else:
                where.append((m[1].get("name"), os.path.relpath(sock, m[0])))
            shm = mounts_by_path(c, spec).get("/dev/shm")
            if not shm or (shm.get("emptyDir") or {}).get("medium") != "Memory":
                bad(f"{w}: must mount an emptyDir of medium Memory at /dev/shm: the staging memory is there")
        if len(where) == 2 and where[0] != where[1]:
            bad(f"{what}: the agent's socket {where[0]} and the trainer's {where[1]} are not the same file")
        shm_a, shm_t = mounts_by_path(sa, spec).get("/dev/shm"), mounts_by_path(st, spec).get("/dev/shm")
        if shm_a and shm_t and shm_a.get("name") != shm_t.get("name"):
            bad(f"{what}: the agent and the trainer mount different volumes at /dev/shm")
        def uid_of(c):
            return (c.get("securityContext") or {}).get("runAsUser", pod_sc.get("runAsUser"))
        if uid_of(sa) != uid_of(st):
            bad(f"{what}: the agent and the trainer must run as one uid (owner-only socket and staging)")
        # Shared storage root, the coordinator's Service, its agent token.
        m = mount_for(sa, spec, arg_after(sa, "--storage-root") or "")
        if not m or not m[1] or (m[1].get("persistentVolumeClaim") or {}).get("claimName") not in claims[:1]:
            bad(f"{aw}: --storage-root is not on the coordinator's checkpoint volume")
        addr = arg_after(sa, "--coordinator") or ""
        if not any(name_of(s) == addr.rpartition(":")[0].split(".")[0] for _, s in by_kind.get("Service", [])):
            bad(f"{aw}: --coordinator {addr} is not the coordinator's Service")
        if secret_of(sa, spec, "--agent-token-file") != secret_of(coord, cspec, "--agent-token-file"):
            bad(f"{aw}: --agent-token-file is not the coordinator's agent token Secret")
        # Each pod's agent is a node of its own; its failure domain is the node.
        env = {e.get("name"): e for e in sa.get("env") or []}
        def field_of(flag):
            v = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg_after(sa, flag) or "")
            return (((env.get(v.group(1)) or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") if v else None
        if field_of("--node-id") != "metadata.name":
            bad(f"{aw}: --node-id must be the pod's name (env from fieldRef metadata.name)")
        if field_of("--failure-domain") != "spec.nodeName":
            bad(f"{aw}: --failure-domain must be the node's name (env from fieldRef spec.nodeName)")
        tier = arg_after(sa, "--local-cache")
        if tier is not None:
            m = mount_for(sa, spec, tier)
            if not m or not m[1] or "emptyDir" not in m[1] or (m[1]["emptyDir"] or {}).get("medium") == "Memory":
                bad(f"{aw}: --local-cache {tier} is not on an emptyDir on the node's disk")
        # The persist at shutdown ends before the kubelet's SIGKILL. The pod's
        # one grace period holds the trainer's stop (Kubernetes stops a native
        # sidecar only after the main containers), then --shutdown-grace, then
        # the agent's last flush of its reports (up to 2 s past the grace).
        FLUSH_S = 5
        pod_grace = int(spec.get("terminationGracePeriodSeconds") or 30)
        stop = str(((tmpl.get("metadata") or {}).get("annotations") or {}).get("ckptd/trainer-stop-seconds", ""))
        grace = arg_after(sa, "--shutdown-grace") or ""
        g = re.fullmatch(r"(\d+)s", grace)
        if not re.fullmatch(r"\d+", stop):
            bad(f"{what}: needs the annotation ckptd/trainer-stop-seconds (whole seconds the trainer "
                f"takes to exit after SIGTERM), not {stop or '(none)'}: the shutdown budget counts it")
        elif not g:
            bad(f"{aw}: --shutdown-grace {grace or '(none)'} must be whole seconds")
        elif int(stop) + int(g.group(1)) + FLUSH_S > pod_grace:
            bad(f"{what}: trainer stop {stop} s + --shutdown-grace {g.group(1)} s + flush {FLUSH_S} s = "
                f"{int(stop) + int(g.group(1)) + FLUSH_S} s exceeds terminationGracePeriodSeconds "
                f"{pod_grace}: the kubelet's SIGKILL would cut the last persist short")

for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PYEOF
}
# Kubernetes' own schemas, strict (no field Kubernetes does not know), at
# 1.29: the oldest release with native sidecars (the sidecar example's
# initContainer restartPolicy). kubernetes-validate comes from PyPI
# (scripts/install-deps.sh puts it in .tools/k8s-validate).
KV="$REPO/.tools/k8s-validate"
k8s_schemas() {
  local f rc=0
  # The manifests, and what kustomize built of them (the patches applied).
  for f in $(find "$K8S" -name '*.yaml' ! -name kustomization.yaml | sort) "$W"/k8s/build-*.yaml; do
    [ -e "$f" ] || continue
    PYTHONPATH="$KV" "$PY" -m kubernetes_validate -k 1.29.0 --strict --quiet "$f" || rc=1
  done
  return $rc
}
if PYTHONPATH="$KV" "$PY" -c "import kubernetes_validate" 2>/dev/null; then
  check "Kubernetes manifests and their kustomize builds against Kubernetes 1.29's schemas (kubernetes-validate --strict)" \
    k8s_schemas
elif [ "${CI:-}" = true ]; then
  echo "FAILED: kubernetes-validate is missing ($KV; scripts/install-deps.sh installs it from PyPI)"
  failures=$((failures + 1))
else
  echo "skipped: Kubernetes schemas (kubernetes-validate is not in $KV: run scripts/install-deps.sh with PyPI reachable)"
fi
if "$PY" -c "import yaml" 2>/dev/null; then
  check "Kubernetes manifests: structure, volumes, selectors, ports, the agent/trainer wiring, monitors, PyTorchJob" \
    k8s_structure
else
  echo "FAILED: python3-yaml is missing ($PY; Debian package python3-yaml; scripts/install-deps.sh installs it)"
  failures=$((failures + 1))
fi
# The replicated coordinators, on the build with components: [ha]: the
# replicas' stable names are the agents' list, the etcd they name is the
# etcd StatefulSet's members, and each StatefulSet has its budget.
k8s_ha_structure() {
  local etcd_bin=""
  have etcd && etcd_bin="$(command -v etcd)"
  [ -z "$etcd_bin" ] && [ -x /usr/bin/etcd ] && etcd_bin=/usr/bin/etcd
  "$PY" - "$W/k8s/build-ha.yaml" "$W/k8s/build-ha-s3.yaml" "$etcd_bin" <<'PYEOF'
import os, re, subprocess, sys
import yaml

build, s3_build, etcd_bin = sys.argv[1:]
problems = []
def bad(msg):
    problems.append(msg)

def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if isinstance(d, dict)]

def name_of(d):
    return (d.get("metadata") or {}).get("name")

def labels_of(w):
    return ((w["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}

def selects(sel, labels):
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())

def containers(w):
    spec = w["spec"]["template"]["spec"]
    return (spec.get("initContainers") or []) + (spec.get("containers") or [])

def program(c):
    cmd = c.get("command") or []
    return os.path.basename(cmd[0]) if cmd else None

def words(c):
    return [str(a) for a in (c.get("command") or [])[1:] + (c.get("args") or [])]

def arg_after(c, flag):
    """The value of --flag VALUE or --flag=VALUE."""
    a = words(c)
    for i, x in enumerate(a):
        if x == flag and i + 1 < len(a):
            return a[i + 1]
        if x.startswith(flag + "="):
            return x[len(flag) + 1:]
    return None

def expand(what, c, value, pod, ns):
    """value with its $(VAR)s as Kubernetes expands them in pod `pod`: only
    the pod's name and namespace (downward API) are known here."""
    fields = {e.get("name"): (((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"))
              for e in c.get("env") or []}
    def sub(m):
        field = fields.get(m.group(1))
        if field == "metadata.name":
            return pod
        if field == "metadata.namespace":
            return ns
        bad(f"{what}: $({m.group(1)}) is not the pod's name or namespace (env fieldRef)")
        return m.group(0)
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, value or "")

def volume_at(w, c, path):
    """The volume (or volumeClaimTemplate) whose mount holds path."""
    spec = w["spec"]["template"]["spec"]
    vols = {v.get("name"): v for v in spec.get("volumes") or []}
    for t in w["spec"].get("volumeClaimTemplates") or []:
        vols[name_of(t)] = {"name": name_of(t), "volumeClaimTemplate": t}
    best = None
    for m in c.get("volumeMounts") or []:
        mp = m.get("mountPath") or ""
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) > len(best[0]):
                best = (mp, vols.get(m.get("name")) or {})
    return best[1] if best else {}

docs = load(build)
by_kind = {}
for d in docs:
    by_kind.setdefault(d.get("kind"), []).append(d)
workloads = [d for k in ("Deployment", "DaemonSet", "StatefulSet", "Job") for d in by_kind.get(k, [])]
def running(prog):
    return [(w, c) for w in workloads for c in containers(w) if program(c) == prog]

coords, etcds, agents = running("ckptd-coordinator"), running("etcd"), running("ckptd-agent")
for prog, found in (("ckptd-coordinator", coords), ("etcd", etcds), ("ckptd-agent", agents)):
    if not found:
        bad(f"no workload runs {prog}")
if problems:
    print("\n".join(problems))
    sys.exit(1)

# The single coordinator is gone: no Deployment, no state volume, no --state-dir.
for w, c in coords:
    if w["kind"] != "StatefulSet":
        bad(f"{w['kind']} {name_of(w)} runs ckptd-coordinator: with ha, only the StatefulSet's replicas may")
    if arg_after(c, "--state-dir") is not None or "--insecure-agents" in words(c):
        bad(f"{name_of(w)}: a replica with --state-dir or --insecure-agents")
if any(name_of(p) == "ckptd-coordinator-state" for p in by_kind.get("PersistentVolumeClaim", [])):
    bad("the single coordinator's state volume ckptd-coordinator-state is still there")
if len(running("ckptd-coordinator")) != 1 or len(etcds) != 1:
    bad("expected one coordinator StatefulSet and one etcd StatefulSet")
cw, cc = coords[0]
ew, ec = etcds[0]
ns = (cw.get("metadata") or {}).get("namespace") or "default"
for d in docs:
    if d.get("kind") not in ("Namespace", "PriorityClass") and \
            ((d.get("metadata") or {}).get("namespace") or "default") != ns:
        bad(f"{d.get('kind')} {name_of(d)}: not in the namespace {ns} of the rest")

def port_of(addr):
    return addr.rsplit(":", 1)[1] if addr and ":" in addr else None

def stateful_set(w, c, least):
    """Checks a StatefulSet's own setup; returns the stable name of each pod
    (pod, host) as its headless Service gives it."""
    what = f"StatefulSet {name_of(w)}"
    n = w["spec"].get("replicas", 1)
    if n < least:
        bad(f"{what}: replicas {n}, fewer than {least}")
    svc = [s for s in by_kind.get("Service", []) if name_of(s) == w["spec"].get("serviceName")]
    if not svc:
        bad(f"{what}: serviceName {w['spec'].get('serviceName')!r} is no Service")
    else:
        spec = svc[0]["spec"]
        if spec.get("clusterIP") != "None":
            bad(f"{what}: its Service {name_of(svc[0])} is not headless (clusterIP: None)")
        if spec.get("publishNotReadyAddresses") is not True:
            bad(f"{what}: its Service {name_of(svc[0])} needs publishNotReadyAddresses: true (names resolve "
                "before the pods are ready)")
        if not selects(spec.get("selector"), labels_of(w)):
            bad(f"{what}: its Service {name_of(svc[0])} does not select its pods")
    # Spread over nodes.
    terms = (((w["spec"]["template"]["spec"].get("affinity") or {}).get("podAntiAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    terms += [t.get("podAffinityTerm") or {} for t in
              (((w["spec"]["template"]["spec"].get("affinity") or {}).get("podAntiAffinity") or {})
               .get("preferredDuringSchedulingIgnoredDuringExecution") or [])]
    if not any(t.get("topologyKey") == "kubernetes.io/hostname" and
               selects((t.get("labelSelector") or {}).get("matchLabels"), labels_of(w)) for t in terms):
        bad(f"{what}: no pod anti-affinity across nodes (topologyKey kubernetes.io/hostname, its own pods)")
    # Exactly one budget, of one pod at a time, selecting these pods only.
    pdbs = [p for p in by_kind.get("PodDisruptionBudget", [])
            if selects((p["spec"].get("selector") or {}).get("matchLabels"), labels_of(w))]
    if len(pdbs) != 1:
        bad(f"{what}: {len(pdbs)} PodDisruptionBudgets select its pods, not 1")
    for p in pdbs:
        if p.get("apiVersion") != "policy/v1" or p["spec"].get("maxUnavailable") != 1 or "minAvailable" in p["spec"]:
            bad(f"PodDisruptionBudget {name_of(p)}: needs policy/v1 and maxUnavailable: 1 alone")
        others = [name_of(o) for o in workloads if o is not w and
                  selects((p["spec"].get("selector") or {}).get("matchLabels"), labels_of(o))]
        if others:
            bad(f"PodDisruptionBudget {name_of(p)}: selects the pods of {others} too")
    # Hardened like the other pods.
    pod_sc = w["spec"]["template"]["spec"].get("securityContext") or {}
    for k in containers(w):
        sc = k.get("securityContext") or {}
        if (sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True or
                "ALL" not in ((sc.get("capabilities") or {}).get("drop") or [])):
            bad(f"{what}: container {k.get('name')} needs allowPrivilegeEscalation: false, "
                "readOnlyRootFilesystem: true and capabilities drop ALL")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            bad(f"{what}: container {k.get('name')} needs runAsNonRoot: true")
        if not k.get("readinessProbe") or not k.get("livenessProbe"):
            bad(f"{what}: container {k.get('name')} needs a readiness and a liveness probe")
    service = w["spec"].get("serviceName")
    return [(f"{name_of(w)}-{i}", f"{name_of(w)}-{i}.{service}.{ns}.svc") for i in range(n)]

# The coordinator's replicas and what they advertise.
replicas = stateful_set(cw, cc, 2)
listen_port = port_of(arg_after(cc, "--listen"))
advertised = []
for pod, host in replicas:
    a = expand(f"{name_of(cw)}: --advertise", cc, arg_after(cc, "--advertise"), pod, ns)
    advertised.append(a)
    if a != f"{host}:{listen_port}":
        bad(f"{name_of(cw)}: pod {pod} advertises {a!r}, not its stable name {host}:{listen_port} "
            "(its headless Service's, on its --listen port)")
for w, c in agents:
    listed = (arg_after(c, "--coordinator") or "").split(",")
    if len(listed) > 16:
        bad(f"{name_of(w)}: --coordinator lists {len(listed)} addresses, more than 16")
    for a in advertised:
        if a not in listed:
            bad(f"{name_of(w)}: replica address {a} is not in the agents' --coordinator {','.join(listed)}")
    for a in listed:
        if a not in advertised:
            bad(f"{name_of(w)}: --coordinator address {a} is no replica's --advertise")
# Clients keep the Service ckptd-coordinator (metrics, kubectl port-forward).
if not any(s["spec"].get("clusterIP") != "None" and selects(s["spec"].get("selector"), labels_of(cw))
           for s in by_kind.get("Service", [])):
    bad("no (non-headless) Service selects the coordinator replicas")

# The etcd the replicas use is the etcd StatefulSet's members.
members = stateful_set(ew, ec, 3)
if len(members) % 2 == 0:
    bad(f"StatefulSet {name_of(ew)}: an even number of etcd members ({len(members)})")
endpoints = [expand(f"{name_of(cw)}: --etcd-endpoints", cc, e, replicas[0][0], ns)
             for e in (arg_after(cc, "--etcd-endpoints") or "").split(",")]
clients, peers = [], []
for pod, host in members:
    what = f"{name_of(ew)}: pod {pod}"
    if expand(what, ec, arg_after(ec, "--name"), pod, ns) != pod:
        bad(f"{what}: --name is not the pod's name")
    client = expand(what, ec, arg_after(ec, "--advertise-client-urls"), pod, ns)
    peer = expand(what, ec, arg_after(ec, "--initial-advertise-peer-urls"), pod, ns)
    if not re.fullmatch(r"https?://" + re.escape(host) + r":\d+", client) or \
            not re.fullmatch(r"https?://" + re.escape(host) + r":\d+", peer):
        bad(f"{what}: advertises {client} and {peer}, not its stable name {host}")
    clients.append(re.sub(r"^https?://", "", client))
    peers.append(f"{pod}={peer}")
if sorted(endpoints) != sorted(clients):
    bad(f"the coordinators' --etcd-endpoints {','.join(endpoints)} are not the etcd members {','.join(clients)}")
cluster = expand(f"{name_of(ew)}: --initial-cluster", ec, arg_after(ec, "--initial-cluster"), members[0][0], ns)
if sorted(cluster.split(",")) != sorted(peers):
    bad(f"{name_of(ew)}: --initial-cluster {cluster} is not its members {','.join(peers)}")
if not arg_after(cc, "--etcd-prefix"):
    bad(f"{name_of(cw)}: no --etcd-prefix")
data = volume_at(ew, ec, arg_after(ec, "--data-dir") or "")
if "volumeClaimTemplate" not in data:
    bad(f"{name_of(ew)}: --data-dir {arg_after(ec, '--data-dir')} is not on a volumeClaimTemplate (a volume per member)")
if not re.fullmatch(r"[a-z0-9./-]+/etcd:v3\.[45]\.[0-9]+", ec.get("image") or ""):
    bad(f"{name_of(ew)}: image {ec.get('image')!r} is not etcd pinned to a 3.4 or 3.5 release tag")
if etcd_bin:
    text = subprocess.run([etcd_bin, "--help"], capture_output=True, text=True).stdout
    known = set(re.findall(r"--([a-z][a-z0-9-]*)", text))
    for a in words(ec):
        m = re.match(r"--([a-z][a-z0-9-]*)", a)
        if m and m.group(1) not in known:
            bad(f"{name_of(ew)}: {m.group(0)} is not in {etcd_bin} --help")
# Only the coordinators (and the members) reach etcd's client port.
policies = [p for p in by_kind.get("NetworkPolicy", []) if selects((p["spec"].get("podSelector") or {}).get("matchLabels"), labels_of(ew))]
if not policies:
    bad(f"no NetworkPolicy selects the etcd pods")
elif not any(selects(((f.get("podSelector") or {}).get("matchLabels")), labels_of(cw))
             for p in policies for r in p["spec"].get("ingress") or [] for f in r.get("from") or []):
    bad("the etcd NetworkPolicy lets the coordinators in from nowhere")

# Credentials and storage, as the single coordinator has them.
def secret(w, c, flag):
    return (volume_at(w, c, arg_after(c, flag) or "").get("secret") or {}).get("secretName")
for flag in ("--operator-token-file", "--agent-token-file"):
    if not secret(cw, cc, flag):
        bad(f"{name_of(cw)}: {flag} is not on a Secret (every replica must take the same token)")
root = (volume_at(cw, cc, arg_after(cc, "--storage-root") or "").get("persistentVolumeClaim") or {}).get("claimName")
for w, c in agents:
    if secret(w, c, "--agent-token-file") != secret(cw, cc, "--agent-token-file"):
        bad(f"{name_of(w)}: --agent-token-file is not the replicas' agent token Secret")
    if (volume_at(w, c, arg_after(c, "--storage-root") or "").get("persistentVolumeClaim") or {}).get("claimName") != root or not root:
        bad(f"{name_of(w)}: --storage-root is not on the replicas' checkpoint volume")

# With the object store too: the replicas take the ConfigMap's storage root
# and keep their own environment.
for w in load(s3_build):
    if w.get("kind") == "StatefulSet" and name_of(w) == name_of(cw):
        c = [k for k in containers(w) if program(k) == "ckptd-coordinator"][0]
        env = {e.get("name"): e for e in c.get("env") or []}
        if arg_after(c, "--storage-root") != "$(CKPTD_STORAGE_ROOT)" or \
                (((env.get("CKPTD_STORAGE_ROOT") or {}).get("valueFrom") or {}).get("configMapKeyRef") or {}).get("name") != "ckptd-s3":
            bad("with the object store: the replicas' --storage-root is not $(CKPTD_STORAGE_ROOT) from the ConfigMap ckptd-s3")
        if "POD_NAME" not in env or "POD_NAMESPACE" not in env:
            bad("with the object store: the replicas lost POD_NAME or POD_NAMESPACE (their --advertise)")
        if any("persistentVolumeClaim" in v for v in w["spec"]["template"]["spec"].get("volumes") or []):
            bad("with the object store: the replicas still mount the checkpoint volume")
        break
else:
    bad(f"the object-store build has no StatefulSet {name_of(cw)}")

print("\n".join(problems))
sys.exit(1 if problems else 0)
PYEOF
}
if [ -s "$W/k8s/build-ha.yaml" ] && [ -s "$W/k8s/build-ha-s3.yaml" ]; then
  check "Kubernetes ha: replicas' --advertise are the agents' --coordinator list, --etcd-endpoints the etcd members, budgets, spread" \
    k8s_ha_structure
fi

# -------------------------------------------------------------- 2. systemd
mkdir -p "$W/units" "$W/units-ha/ckptd-coordinator.service.d"
for u in ckptd-coordinator.service ckptd-agent.service; do
  sed -e "s|/usr/local/bin/|$BIN/|g" -e "s|EnvironmentFile=/etc/ckptd/|EnvironmentFile=$SYSD/|" "$SYSD/$u" >"$W/units/$u"
done
# A replica of replicated coordinators: the unit with the drop-in ha.conf.
cp "$W/units/ckptd-coordinator.service" "$W/units-ha/"
sed -e "s|/usr/local/bin/|$BIN/|g" -e "s|EnvironmentFile=/etc/ckptd/|EnvironmentFile=$SYSD/|" "$SYSD/ha.conf" \
  >"$W/units-ha/ckptd-coordinator.service.d/ha.conf"
verify_units() {
  local out
  out="$(cd "$W/units" && systemd-analyze verify ckptd-coordinator.service ckptd-agent.service 2>&1)" || { echo "$out"; return 1; }
  # Any word about our units (unknown keys are only warnings) fails.
  if grep -i ckptd <<<"$out"; then return 1; fi
  # The same for the coordinator with the drop-in (read from the unit's .d folder).
  out="$(cd "$W/units-ha" && systemd-analyze verify ckptd-coordinator.service 2>&1)" || { echo "$out"; return 1; }
  if grep -i ckptd <<<"$out"; then return 1; fi
  return 0
}
if need systemd-analyze systemd; then
  check "systemd-analyze verify ckptd-coordinator.service ckptd-agent.service, and the coordinator with ha.conf" \
    verify_units
  # --threshold counts tenths: 30 is an exposure of 3.0 ("OK" in its words).
  check "systemd-analyze security --offline: exposure at most 3.0 (the coordinator with ha.conf too)" \
    bash -c "cd '$W/units' && systemd-analyze security --offline=true --threshold=30 ckptd-coordinator.service ckptd-agent.service >/dev/null &&
      cd '$W/units-ha' && systemd-analyze security --offline=true --threshold=30 ckptd-coordinator.service >/dev/null"
fi
units_match_env() {
  "$PY" - "$SYSD" <<'PYEOF'
import os, re, sys
d = sys.argv[1]
problems = []
def env(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out
def unit(path):
    text = re.sub(r"\\\n\s*", " ", open(path).read())
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out
roots = set()
for u, e in (("ckptd-coordinator.service", "coordinator.env"), ("ckptd-agent.service", "agent.env")):
    uv, ev = unit(os.path.join(d, u)), env(os.path.join(d, e))
    if uv.get("EnvironmentFile") != ["/etc/ckptd/" + e]:
        problems.append(f"{u}: EnvironmentFile= is not /etc/ckptd/{e}")
    for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", " ".join(uv.get("ExecStart", []))):
        if var not in ev:
            problems.append(f"{u}: ExecStart uses ${var}, which {e} does not set")
    root = ev.get("CKPTD_STORAGE_ROOT")
    roots.add(root)
    if root not in " ".join(uv.get("ReadWritePaths", [])).split():
        problems.append(f"{u}: ReadWritePaths= does not hold the storage root {root} of {e}")
    if uv.get("RequiresMountsFor") != [root]:
        problems.append(f"{u}: RequiresMountsFor= is not the storage root {root} of {e}")
    for k in ("Restart", "User", "ProtectSystem", "NoNewPrivileges", "PrivateTmp", "ProtectHome"):
        if k not in uv:
            problems.append(f"{u}: no {k}=")
    if uv.get("RemoveIPC") != ["no"]:
        problems.append(f"{u}: RemoveIPC=no is needed (the agent's staging belongs to the same user)")
    if "DynamicUser" in uv:
        problems.append(f"{u}: DynamicUser= removes the staging memory (RemoveIPC) and changes the socket's owner")
if len(roots) != 1:
    problems.append(f"coordinator.env and agent.env name different storage roots: {sorted(map(str, roots))}")
# The drop-in ha.conf: coordinator-ha.env alone, the coordinator on etcd
# (no --state-dir, no state directory), the same storage root.
ha, hv = unit(os.path.join(d, "ha.conf")), env(os.path.join(d, "coordinator-ha.env"))
if ha.get("EnvironmentFile") != ["", "/etc/ckptd/coordinator-ha.env"]:
    problems.append("ha.conf: EnvironmentFile= must be reset, then /etc/ckptd/coordinator-ha.env")
starts = ha.get("ExecStart", [])
if len(starts) != 2 or starts[0] != "":
    problems.append("ha.conf: ExecStart= must be reset, then one command")
else:
    for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", starts[1]):
        if var not in hv:
            problems.append(f"ha.conf: ExecStart uses ${var}, which coordinator-ha.env does not set")
    if "--state-dir" in starts[1] or "%S" in starts[1]:
        problems.append("ha.conf: ExecStart with a state directory (--etcd-endpoints excludes --state-dir)")
    for flag in ("--operator-token-file %d/operator-token", "--agent-token-file %d/agent-token"):
        if flag not in starts[1]:
            problems.append(f"ha.conf: ExecStart without {flag} (every replica must take the same tokens)")
if ha.get("StateDirectory") != [""]:
    problems.append("ha.conf: StateDirectory= must be reset (the state is in etcd)")
opts = hv.get("CKPTD_COORDINATOR_OPTS", "").split()
def opt(flag):
    return opts[opts.index(flag) + 1] if flag in opts[:-1] else None
for flag in ("--etcd-endpoints", "--etcd-prefix", "--advertise"):
    if not opt(flag):
        problems.append(f"coordinator-ha.env: CKPTD_COORDINATOR_OPTS without {flag}")
if opt("--advertise") and opt("--advertise").rsplit(":", 1)[-1] != hv.get("CKPTD_LISTEN", "").rsplit(":", 1)[-1]:
    problems.append(f"coordinator-ha.env: --advertise {opt('--advertise')} is not on the port of CKPTD_LISTEN")
if hv.get("CKPTD_STORAGE_ROOT") not in roots:
    problems.append(f"coordinator-ha.env: storage root {hv.get('CKPTD_STORAGE_ROOT')} is not the other env files'")
# agent.env shows the list of replicas, this replica's --advertise among them.
lists = [l for l in re.findall(r"--coordinator (\S+)", open(os.path.join(d, "agent.env")).read()) if "," in l]
if not lists or not any(opt("--advertise") in l.split(",") for l in lists):
    problems.append(f"agent.env: no --coordinator list of replicas that holds coordinator-ha.env's --advertise "
                    f"{opt('--advertise')}")
agent = unit(os.path.join(d, "ckptd-agent.service"))
if agent.get("RuntimeDirectory") != ["ckptd"] or "%t/ckptd/" not in " ".join(agent.get("ExecStart", [])):
    problems.append("ckptd-agent.service: the socket must be in its RuntimeDirectory (%t/ckptd/)")
if "PrivateDevices" in agent:
    problems.append("ckptd-agent.service: PrivateDevices= would give it a /dev/shm of its own")
print("\n".join(problems))
sys.exit(1 if problems else 0)
PYEOF
}
check "systemd units, ha.conf and env files agree (variables, storage root, ReadWritePaths, socket, replicas)" \
  units_match_env

# ---------------------------------------------------------------- 3. shell
SCRIPTS=("$SLURM/ckptd-job.sbatch" "$SLURM/torchrun.sbatch" "$SLURM/test-single-node.sh" "$SYSD/install.sh"
         "$REPO/deploy/local/demo.sh" "$REPO/deploy/local/launch.sh" "$PROM/prometheusrule.sh"
         "$REPO/tests/deploy/demo_test.sh" "$0")
for s in "${SCRIPTS[@]}"; do
  check "bash -n ${s#"$REPO"/}" bash -n "$s"
done
if need shellcheck shellcheck; then
  check "shellcheck -S warning: the Slurm scripts, install.sh, the local demo, prometheusrule.sh, this test" \
    shellcheck -S warning -s bash "${SCRIPTS[@]}"
fi
sbatch_directives() {
  local d f
  for f in ckptd-job.sbatch torchrun.sbatch; do
    for d in '--requeue' '--open-mode=append' '--signal=B:USR1@[0-9]*'; do
      grep -q "^#SBATCH $d\$" "$SLURM/$f" || { echo "$f: no #SBATCH $d"; return 1; }
    done
  done
}
check "the sbatch scripts ask for requeueing, appended output and a signal before the time limit" sbatch_directives
# torchrun.sbatch: an agent per node in the background, then one torchrun a
# node meeting at a c10d rendezvous on the first node, and a trainer that
# is a file of this repository.
torchrun_sbatch() {
  "$PY" - "$REPO" "$SLURM/torchrun.sbatch" <<'PYEOF'
import os, re, sys
repo, path = sys.argv[1:]
text = re.sub(r"\\\n\s*", " ", open(path).read())
lines = [l.strip() for l in text.splitlines() if not l.lstrip().startswith("#")]
problems = []
bad = problems.append
agents = [l for l in lines if l.startswith("srun ") and "/ckptd-agent" in l]
if len(agents) != 1 or "--ntasks-per-node=1" not in agents[0] or not agents[0].endswith("&"):
    bad("the agents: not one 'srun --ntasks-per-node=1 ... ckptd-agent ... &' (one per node, in the background)")
train = [l for l in lines if l.startswith("srun ") and "$TORCHRUN" in l]
if len(train) != 1 or "--ntasks-per-node=1" not in train[0]:
    bad("torchrun: not one 'srun --ntasks-per-node=1 ... $TORCHRUN ...' (one torchrun a node)")
else:
    for want in ('--nnodes "$SLURM_JOB_NUM_NODES"', "--rdzv-backend c10d", '--rdzv-endpoint "$RDZV"',
                 '--rdzv-id "$SLURM_JOB_ID"', "--max-restarts", '"$TRAINER"'):
        if want not in train[0]:
            bad(f"torchrun is not given {want}")
    if not train[0].endswith("&"):
        bad("torchrun's step does not run in the background (the script must take the time-limit signal)")
if not re.search(r'^RDZV_HOST="\$\(scontrol show hostnames "\$SLURM_JOB_NODELIST" \| head -n 1\)"$', text, re.M):
    bad("the rendezvous host is not the job's first node (scontrol show hostnames ... | head -n 1)")
if not re.search(r'^export CKPTD_SOCKET="\$SOCKET"', text, re.M):
    bad("the ranks are not given the agent's socket (export CKPTD_SOCKET=\"$SOCKET\")")
m = re.search(r'^TRAINER="\$\{TRAINER:-\$SRC/([^}"]+)\}"$', text, re.M)
if not m:
    bad('no default TRAINER="${TRAINER:-$SRC/<path>}"')
elif not os.path.isfile(os.path.join(repo, m.group(1))):
    bad(f"the default trainer {m.group(1)} is no file of the repository")
print("\n".join(problems))
sys.exit(1 if problems else 0)
PYEOF
}
check "torchrun.sbatch: an agent per node, torchrun per node with a c10d rendezvous on the first, the trainer exists" \
  torchrun_sbatch
install_into_root() {
  local r="$W/install-root" f
  "$SYSD/install.sh" --bin "$BIN" --root "$r" >/dev/null || return 1
  for f in ckptd-coordinator ckptd-agent ckptctl ckptd-demo-trainer; do
    [ -x "$r/usr/local/bin/$f" ] || { echo "no /usr/local/bin/$f"; return 1; }
  done
  for f in etc/systemd/system/ckptd-coordinator.service etc/systemd/system/ckptd-agent.service \
    etc/ckptd/coordinator.env etc/ckptd/agent.env usr/lib/sysusers.d/ckptd.conf usr/local/share/doc/ckptd/operations.md; do
    [ -s "$r/$f" ] || { echo "no /$f"; return 1; }
  done
  [ "$(stat -c %a "$r/etc/ckptd/operator-token")" = 600 ] || { echo "operator-token is not 0600"; return 1; }
  grep -qE '^[0-9a-f]{64}$' "$r/etc/ckptd/operator-token" || { echo "operator-token is not 32 random bytes in hex"; return 1; }
  # A second run keeps the settings and the token.
  echo "# edited" >>"$r/etc/ckptd/agent.env"
  local token
  token="$(cat "$r/etc/ckptd/operator-token")"
  "$SYSD/install.sh" --bin "$BIN" --root "$r" >/dev/null || return 1
  grep -q "^# edited" "$r/etc/ckptd/agent.env" || { echo "a second run replaced agent.env"; return 1; }
  [ "$(cat "$r/etc/ckptd/operator-token")" = "$token" ] || { echo "a second run replaced the token"; return 1; }
  [ "$(stat -c %a "$r/etc/ckptd/agent-token")" = 600 ] || { echo "agent-token is not 0600"; return 1; }
  grep -qE '^[0-9a-f]{64}$' "$r/etc/ckptd/agent-token" || { echo "agent-token is not 32 random bytes in hex"; return 1; }
  [ "$(cat "$r/etc/ckptd/agent-token")" != "$token" ] || { echo "the agent token is the operator token"; return 1; }
}
check "install.sh --root installs binaries, units, settings and a 0600 token, and keeps edited settings" install_into_root

# ------------------------------------------------------------ 4. flags and metrics
flags_match_help() {
  local f builds=()
  for f in "$W"/k8s/build-*.yaml; do [ -e "$f" ] && builds+=("$f"); done
  "$PY" - "$BIN" "$REPO" "$DOC" "$SLURM/ckptd-job.sbatch" "$SLURM/torchrun.sbatch" "$SLURM/test-single-node.sh" \
    "$SYSD/install.sh" \
    "$SYSD/coordinator.env" "$SYSD/agent.env" "$SYSD/ckptd-coordinator.service" "$SYSD/ckptd-agent.service" \
    "$SYSD/coordinator-ha.env" "$SYSD/ha.conf" "$K8S"/*.yaml "$K8S"/*/*.yaml "$K8S/Dockerfile" \
    "$PROM/ckptd-alerts.yaml" "$PROM/prometheus.yml" "$REPO/deploy/grafana/ckptd-dashboard.json" "${builds[@]}" <<'PYEOF'
import os, re, subprocess, sys
import yaml

bin_dir, repo, files = sys.argv[1], sys.argv[2], sys.argv[3:]
BINS = ["ckptd-coordinator", "ckptd-agent", "ckptctl", "ckptd-demo-trainer", "ckptd-bench"]
BIN_RE = re.compile(r"(?<![\w.@-])(?:[^\s\"'`=(]*/)?(" + "|".join(map(re.escape, BINS)) + r")(?![\w.:@/-])")
FLAG_RE = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
SEP_RE = re.compile(r"(;|&&|\|\||\s\|\s|\s&\s|\s&$|\n)")
OPTS = {"CKPTD_COORDINATOR_OPTS": "ckptd-coordinator", "CKPTD_AGENT_OPTS": "ckptd-agent"}
FOREIGN = {"srun", "sbatch", "scancel", "scontrol", "squeue", "sinfo", "#SBATCH", "kubectl", "docker", "cmake",
           "openssl", "systemctl", "systemd-analyze", "mount", "sudoedit", "install.sh", "test-single-node.sh",
           "apt-get", "yamllint", "shellcheck", "ctest", "torchrun", "kubernetes-validate"}

problems = []
helps = {}
def help_flags(b, sub=()):
    key = (b,) + tuple(sub)
    if key not in helps:
        try:
            r = subprocess.run([os.path.join(bin_dir, b), *sub, "--help"], capture_output=True, text=True, timeout=20)
            text = r.stdout + r.stderr
        except OSError as e:
            problems.append(f"cannot run {b} --help: {e}")
            text = ""
        flags = set(FLAG_RE.findall(text)) | {"help"}
        helps[key] = flags if len(flags) > 1 else None
    return helps[key]

def allowed(b, words):
    """The flags of binary b, of its subcommand when the words after it name one."""
    if b in ("ckptctl", "ckptd-bench") and words and re.fullmatch(r"[a-z][a-z-]*", words[0]):
        sub = tuple(words[:2]) if words[0] == "drill" and len(words) > 1 else (words[0],)
        f = help_flags(b, sub)
        if f:
            return f, " ".join((b,) + sub)
    return help_flags(b), b

union = set()
for b in BINS:
    union |= help_flags(b) or set()
for sub in (("status",), ("checkpoint",), ("list",), ("restore-plan",), ("verify",), ("interval",), ("plan",),
            ("inspect",), ("drill", "run"), ("drill", "suite")):
    union |= help_flags("ckptctl", sub) or set()
for sub in ("persist", "snapshot", "overhead", "coordinator", "register", "restore", "reshard"):
    union |= help_flags("ckptd-bench", (sub,)) or set()

checked = 0
def check_segment(where, b, text):
    global checked
    words = text.split()
    ok, name = allowed(b, words)
    for f in FLAG_RE.findall(text):
        checked += 1
        if f not in ok:
            problems.append(f"{where}: {name} has no --{f} (not in its --help)")

def scan_text(where, text, bare_check=False):
    """Flags after a ckptd binary, up to a shell separator or the next binary;
    flags on a line that names CKPTD_<X>_OPTS belong to X; with bare_check,
    flags of a line with no ckptd binary and no foreign command must be
    flags of some ckptd binary."""
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        matches = list(BIN_RE.finditer(line))
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
            seg = line[m.end():end]
            s = SEP_RE.search(seg)
            check_segment(where, m.group(1), seg[: s.start()] if s else seg)
        for var, b in OPTS.items():
            if var in line and not matches:
                # VAR="value", VAR='value', VAR=value (to the end), or VAR mentioned (the rest of the line).
                m = re.search(re.escape(var) + r"""=(?:"([^"]*)"|'([^']*)'|(.*))""", line)
                value = next((g for g in m.groups() if g is not None), "") if m else line.split(var, 1)[1]
                check_segment(where, b, value)
        if bare_check and not matches and not any(v in line for v in OPTS):
            first = line.split()
            first = first[1] if first[:1] == ["sudo"] and len(first) > 1 else (first[0] if first else "")
            if os.path.basename(first) in FOREIGN or first.startswith("#"):
                continue
            for f in FLAG_RE.findall(line):
                global checked
                checked += 1
                if f not in union:
                    problems.append(f"{where}: --{f} is no flag of any ckptd binary: {line.strip()[:100]}")

def markdown(path):
    rel = os.path.relpath(path, repo)
    text = open(path).read()
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        scan_text(rel + " (code block)", block, bare_check=True)
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        scan_text(rel, span.replace("\n", " "), bare_check=True)
    # Flags outside code spans are written as code; none may hide in prose.
    for f in FLAG_RE.findall(re.sub(r"`[^`]+`", "", prose)):
        problems.append(f"{rel}: --{f} outside a code span")

def service(path):
    """A unit, or a drop-in (its ExecStart= with its EnvironmentFile=)."""
    rel = os.path.relpath(path, repo)
    text = open(path).read()
    env_name = re.search(r"EnvironmentFile=/etc/ckptd/(\S+)", text).group(1)
    env = {}
    for line in open(os.path.join(os.path.dirname(path), env_name)):
        if "=" in line and not line.startswith("#"):
            k, _, v = line.strip().partition("=")
            env[k] = v
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        if line.startswith("ExecStart="):
            cmd = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), line[len("ExecStart="):])
            cmd = cmd.replace("%t", "/run").replace("%S", "/var/lib").replace("%d", "/run/credentials/x")
            scan_text(rel + " ExecStart (with " + env_name + ")", cmd)
        elif line.startswith("#"):
            scan_text(rel, line, bare_check=True)

def env_file(path):
    rel = os.path.relpath(path, repo)
    b = "ckptd-coordinator" if "coordinator" in os.path.basename(path) else "ckptd-agent"
    for line in open(path):
        if BIN_RE.search(line):
            scan_text(rel, line)
        else:
            check_segment(rel, b, line.split("=", 1)[1] if "=" in line and not line.startswith("#") else line)

def manifest(path):
    # (a kustomize build of the test's is named by its file)
    rel = os.path.relpath(path, repo) if path.startswith(repo + "/") else "kustomize " + os.path.basename(path)
    for d in yaml.safe_load_all(open(path)):
        if not isinstance(d, dict) or d.get("kind") not in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            continue
        spec = d["spec"]["template"]["spec"]
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            words = [str(x) for x in (c.get("command") or []) + (c.get("args") or [])]
            where = f"{rel}: container {c.get('name')}"
            if words and os.path.basename(words[0]) in BINS:
                check_segment(where, os.path.basename(words[0]), " ".join(words[1:]))
            else:
                scan_text(where, " ".join(words))

for path in files:
    if path.endswith(".md"):
        markdown(path)
    elif "/deploy/prometheus/" in path or path.endswith(".json"):
        # the alert rules' and the dashboard's hints (ckptctl ... in their descriptions)
        scan_text(os.path.relpath(path, repo), open(path).read(), bare_check=True)
    elif path.endswith(".service") or path.endswith(".conf"):
        service(path)
    elif path.endswith(".env"):
        env_file(path)
    elif path.endswith(".yaml"):
        manifest(path)
    else:
        scan_text(os.path.relpath(path, repo), open(path).read())
print("\n".join(problems))
if checked < 40:
    print(f"only {checked} flags found: the scanner is broken")
    sys.exit(1)
sys.exit(1 if problems else 0)
PYEOF
}
check "every --flag given to a ckptd binary (units, env files, manifests, sbatch, alert rules, dashboard, operations.md) is in its --help" \
  flags_match_help
metrics_exist() {
  PYTHONPATH="$W" "$PY" - "$REPO" "$DOC" <<'PYEOF'
import re, sys
from metric_names import documented, registered, unknown
repo, doc = sys.argv[1], sys.argv[2]
known = registered(repo)
if len(known) < 10:
    print(f"found only {len(known)} metrics in the sources: the pattern is out of date")
    sys.exit(1)
# (a name followed by "(" is a C function of the client ABI, not a metric)
named = set(re.findall(r"\bckptd_[a-z0-9_]+\b(?!\()", open(doc).read()))
problems = [f"docs/operations.md names {n}, which no binary registers" for n in unknown(named, known)]
problems += [f"docs/operations.md calls {n} a {t}; it is registered as a {known[n]}"
             for n, t in sorted(documented(doc).items()) if n in known and known[n] != t]
print("\n".join(problems))
sys.exit(1 if problems else 0)
PYEOF
}
check "every ckptd_* metric in docs/operations.md is one a binary registers, of the type its table says" metrics_exist

# ------------------------------------------------------------------ 5. TLS
# The recipe between the markers in docs/operations.md, run as written.
sed -n '/<!-- tls-recipe:begin -->/,/<!-- tls-recipe:end -->/p' "$DOC" | sed '/^<!--/d; /^```/d' >"$W/make-certs.sh"
env_value() { sed -n "s/^$2=//p" "$SYSD/$1" | tail -n 1; }
wait_for() {  # wait_for SECONDS COMMAND...: until COMMAND succeeds; gives up at once when it returns 2
  local n=$(($1 * 10)) code
  shift
  for _ in $(seq "$n"); do
    "$@"
    code=$?
    [ "$code" -eq 0 ] && return 0
    [ "$code" -eq 2 ] && return 1
    sleep 0.1
  done
  return 1
}
tls_smoke() {
  tls_smoke_run
  local code=$?
  stop_started
  return "$code"
}
tls_smoke_run() {
  local t="$W/tls" log="$W/tls-run" port agent_opts coord_opts
  mkdir -p "$log"
  CKPTD_TLS_DIR="$t" CKPTD_TLS_SERVER_SAN="DNS:localhost,IP:127.0.0.1" CKPTD_TLS_NODES="agent node-p node-q" \
    CKPTD_TLS_OPERATORS="operator" CKPTD_TLS_NODE_SANS="IP:127.0.0.1" \
    bash "$W/make-certs.sh" >"$log/openssl.log" 2>&1 || { echo "the recipe failed:"; cat "$log/openssl.log"; return 1; }
  for f in ca.pem coordinator.pem coordinator.key agent.pem agent.key node-p.pem node-q.key operator.pem operator.key; do
    [ -s "$t/$f" ] || { echo "the recipe made no $f"; return 1; }
  done
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$log/token"
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$log/agent-token"
  # The coordinator as the unit starts it, with coordinator.env's flags, and TLS.
  coord_opts="$(env_value coordinator.env CKPTD_COORDINATOR_OPTS)"
  # shellcheck disable=SC2086  # the OPTS hold several flags, as systemd splits them
  "$BIN/ckptd-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --storage-root "$log/root" \
    --state-dir "$log/state" --operator-token-file "$log/token" --agent-token-file "$log/agent-token" $coord_opts \
    --every 10 --tls-cert "$t/coordinator.pem" --tls-key "$t/coordinator.key" --tls-ca "$t/ca.pem" \
    >"$log/coordinator.out" 2>"$log/coordinator.log" &
  local coord=$!
  echo "$coord" >>"$PIDFILE"
  wait_for 30 grep -q "listening on" "$log/coordinator.log" || { echo "no coordinator:"; cat "$log/coordinator.log"; return 1; }
  port="$(sed -n 's/^.* INFO ckptd-coordinator: listening on .*:\([0-9]*\)$/\1/p' "$log/coordinator.log")"
  grep -q "mutual TLS" "$log/coordinator.log" || { echo "the coordinator does not say mutual TLS"; return 1; }
  local tls=(--tls-ca "$t/ca.pem" --tls-cert "$t/operator.pem" --tls-key "$t/operator.key")
  "$BIN/ckptctl" status --coordinator "127.0.0.1:$port" "${tls[@]}" >"$log/status.out" 2>&1 ||
    { echo "ckptctl with the operator's certificate failed:"; cat "$log/status.out"; return 1; }
  local code=0
  "$BIN/ckptctl" status --coordinator "127.0.0.1:$port" >/dev/null 2>&1 || code=$?
  [ "$code" -eq 3 ] || { echo "ckptctl without the certificates got exit $code, not 3 (unreachable)"; return 1; }
  # The agent as the unit starts it, with agent.env's flags (its --coordinator pointed here), and TLS.
  # (Its peer replication on loopback, on ports the system picks.)
  agent_opts="$(env_value agent.env CKPTD_AGENT_OPTS |
    sed -e "s/--coordinator [^ ]*/--coordinator 127.0.0.1:$port/" -e "s/--peer-listen [^ ]*/--peer-listen 127.0.0.1:0/")"
  # shellcheck disable=SC2086
  "$BIN/ckptd-agent" --storage-root "$log/root" --socket "$log/agent.sock" --agent-token-file "$log/agent-token" \
    $agent_opts --node-id tls-node \
    --tls-ca "$t/ca.pem" --tls-cert "$t/agent.pem" --tls-key "$t/agent.key" >"$log/agent.out" 2>"$log/agent.log" &
  local agent=$!
  echo "$agent" >>"$PIDFILE"
  alive() {
    kill -0 "$agent" 2>/dev/null || return 2
    "$BIN/ckptctl" status --coordinator "127.0.0.1:$port" "${tls[@]}" --json 2>/dev/null |
      "$PY" -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(a.get("node_id")=="tls-node" and a.get("alive") for a in d["agents"]["nodes"]) else 1)'
  }
  if ! wait_for 30 alive || ! kill -0 "$agent" 2>/dev/null; then
    echo "the agent did not register over TLS:"
    "$BIN/ckptctl" status --coordinator "127.0.0.1:$port" "${tls[@]}" 2>&1
    tail -n 5 "$log/agent.log" "$log/coordinator.log"
    return 1
  fi
  kill -TERM "$agent"
  wait "$agent" || { echo "the agent did not stop cleanly"; return 1; }
  tls_peers "$t" "$log" "$port" || return 1
  kill -TERM "$coord"
  wait "$coord" || { echo "the coordinator did not stop cleanly"; return 1; }
}
# Two agents known by the recipe's node certificates alone (no agent token)
# replicate to each other's memory over TLS: a 2-rank job's newest committed
# step is held by each rank's partner. And the operator's certificate is no
# node's: an agent presenting it is refused, saying why.
tls_peers() {
  local t="$1" log="$2" port="$3" n pids=() tls=(--tls-ca "$1/ca.pem" --tls-cert "$1/operator.pem" --tls-key "$1/operator.key")
  # The agent stopped before is lost first: no partner of these two.
  gone() {
    "$BIN/ckptctl" status --coordinator "127.0.0.1:$port" "${tls[@]}" --json 2>/dev/null |
      "$PY" -c 'import json,sys; d=json.load(sys.stdin); sys.exit(1 if any(a["alive"] for a in d["agents"]["nodes"]) else 0)'
  }
  wait_for 30 gone || { echo "the first agent was not declared lost"; return 1; }
  for n in node-p node-q; do
    "$BIN/ckptd-agent" --storage-root "$log/root" --socket "$log/$n/agent.sock" --coordinator "127.0.0.1:$port" \
      --node-id "$n" --peer-listen 127.0.0.1:0 --failure-domain "$n" \
      --tls-ca "$t/ca.pem" --tls-cert "$t/$n.pem" --tls-key "$t/$n.key" >"$log/$n.out" 2>"$log/$n.log" &
    pids+=($!)
    echo "$!" >>"$PIDFILE"
  done
  "$BIN/ckptd-agent" --storage-root "$log/root" --socket "$log/op/agent.sock" --coordinator "127.0.0.1:$port" \
    --node-id operator --tls-ca "$t/ca.pem" --tls-cert "$t/operator.pem" --tls-key "$t/operator.key" \
    >"$log/op.out" 2>"$log/op.log" &
  local op=$!
  echo "$op" >>"$PIDFILE"
  for n in node-p node-q; do wait_for 30 test -S "$log/$n/agent.sock" || { echo "agent $n did not start"; cat "$log/$n.log"; return 1; }; done
  local r=0 trainers=()
  for n in node-p node-q; do
    "$BIN/ckptd-demo-trainer" --socket "$log/$n/agent.sock" --job tls-peers --rank "$r" --world-size 2 --steps 60 \
      --step-ms 50 --every 10 --state-mb 1 --agent-wait-ms 30000 >"$log/trainer-$r.out" 2>"$log/trainer-$r.log" &
    trainers+=($!)
    r=$((r + 1))
  done
  for p in "${trainers[@]}"; do wait "$p" || { echo "a trainer failed:"; cat "$log"/trainer-*.log; return 1; }; done
  copies() {
    "$BIN/ckptctl" status --coordinator "127.0.0.1:$port" "${tls[@]}" --json 2>/dev/null |
      "$PY" -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(j["job"]=="tls-peers" and j.get("peer_copies")==2 for j in d["jobs"]) else 1)'
  }
  if ! wait_for 30 copies; then
    echo "no peer copy of each rank over TLS with the recipe's node certificates:"
    "$BIN/ckptctl" status --coordinator "127.0.0.1:$port" "${tls[@]}" 2>&1
    tail -n 8 "$log/node-p.log" "$log/node-q.log"
    return 1
  fi
  wait_for 30 grep -q "is no node's" "$log/op.log" ||
    { echo "the agent with the operator's certificate was not refused saying why:"; tail -n 5 "$log/op.log"; return 1; }
  kill -TERM "${pids[@]}" "$op"
  wait "${pids[@]}" || { echo "the peer agents did not stop cleanly"; return 1; }
  wait "$op" 2>/dev/null
  return 0
}
if need openssl openssl; then
  check "the TLS recipe's certificates: coordinator (coordinator.env flags), agent (agent.env flags), ckptctl and peer replication talk mutual TLS; an operator's is no node's" \
    tls_smoke
fi

# -------------------------------------------------------------- 6. Dockerfile
dockerfile_packages() {
  local df="$K8S/Dockerfile" runtime build deps missing=() p lib pkg
  # The apt-get install lists of the build stage and of the final stage.
  build="$(awk '/^FROM /{n++} n==1' "$df" | sed -n '/--no-install-recommends/,/&&/p' | tr -d '\\' |
    tr ' ' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vx -e apt-get -e install -e rm)"
  runtime="$(awk '/^FROM /{n++} n==2' "$df" | sed -n '/--no-install-recommends/,/&&/p' | tr -d '\\' |
    tr ' ' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vx -e apt-get -e install -e rm)"
  deps="$(sed -n '/^PACKAGES=(/,/^)/p' "$REPO/scripts/install-deps.sh" | sed 's/#.*//' | tr ' ' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$')"
  [ -n "$build" ] && [ -n "$runtime" ] || { echo "could not read the Dockerfile's package lists"; return 1; }
  for p in $build; do grep -qx "$p" <<<"$deps" || missing+=("build stage: $p is not in scripts/install-deps.sh"); done
  # What the final stage gets: its packages and everything they depend on
  # (libcurl4 brings its TLS, HTTP/2 and Kerberos libraries with it).
  local closure="$runtime" more
  while :; do
    more="$(for p in $closure; do dpkg-query -W -f='${Depends},${Pre-Depends}\n' "$p" 2>/dev/null; done |
      tr ',|' '\n' | sed -E 's/\(.*\)//; s/:any//; s/^ +//; s/ +$//' | grep -E '^[a-z0-9][a-z0-9.+-]+$' |
      sort -u | grep -vxF -f <(tr ' ' '\n' <<<"$closure") || true)"
    [ -n "$more" ] || break
    closure="$closure"$'\n'"$more"
  done
  for lib in $(for b in "${BINARIES[@]}"; do ldd "$BIN/$b"; done | awk '/=>/ { print $3 }' | sort -u); do
    pkg="$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null)" || { missing+=("no package owns $lib"); continue; }
    pkg="${pkg%%:*}"
    case "$pkg" in libc6 | libgcc-s1 | libstdc++6) continue ;; esac  # in debian:12-slim
    case "$pkg" in libasan* | libubsan* | liblsan* | libtsan* | libclang-rt*) continue ;; esac  # sanitizer builds
    grep -qx "$pkg" <<<"$closure" || missing+=("final stage: $lib comes from $pkg, which it does not install")
  done
  for b in "${BINARIES[@]}"; do
    grep -q "/build/bin/$b" "$df" || missing+=("the final stage does not copy $b")
    grep -q -- "--target.*$b" "$df" || missing+=("the build stage does not build $b")
  done
  [ ${#missing[@]} -eq 0 ] || { printf '%s\n' "${missing[@]}"; return 1; }
}
if need dpkg dpkg && need ldd libc-bin; then
  check "Dockerfile: its runtime packages hold every library the binaries load; its build packages are install-deps'" \
    dockerfile_packages
fi

# ---------------------------------------------------- 7. replicated coordinators
# Two coordinators started as ha.conf starts them, with coordinator-ha.env's
# flags (the addresses made loopback ones), on a real one-member etcd: one
# leads, the other answers as a standby naming it; once the leader is
# SIGKILLed the other leads, and ckptctl given both finds it.
ETCD_BIN="$(command -v etcd 2>/dev/null)"
[ -z "$ETCD_BIN" ] && [ -x /usr/bin/etcd ] && ETCD_BIN=/usr/bin/etcd
free_ports() {  # free_ports N: N loopback ports free now
  "$PY" -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}
ha_argv() {  # ha_argv PORT ETCD_PORT ROOT CREDS: ha.conf's command line, one word a line
  "$PY" - "$SYSD" "$BIN" "$@" <<'PYEOF'
import re, sys
sysd, bin_dir, port, etcd_port, root, creds = sys.argv[1:]
env = {}
for line in open(f"{sysd}/coordinator-ha.env"):
    if "=" in line and not line.startswith("#"):
        k, _, v = line.strip().partition("=")
        env[k] = v
env.update(CKPTD_LISTEN=f"127.0.0.1:{port}", CKPTD_METRICS_LISTEN="127.0.0.1:0", CKPTD_STORAGE_ROOT=root)
opts = env.get("CKPTD_COORDINATOR_OPTS", "")
for flag, value in (("--etcd-endpoints", f"127.0.0.1:{etcd_port}"), ("--advertise", f"127.0.0.1:{port}")):
    opts, n = re.subn(re.escape(flag) + r" \S+", f"{flag} {value}", opts)
    if n != 1:
        sys.exit(f"coordinator-ha.env: CKPTD_COORDINATOR_OPTS has no {flag} VALUE")
env["CKPTD_COORDINATOR_OPTS"] = opts
text = re.sub(r"\\\n\s*", " ", open(f"{sysd}/ha.conf").read())
cmds = [l[len("ExecStart="):] for l in text.splitlines() if l.startswith("ExecStart=") and l != "ExecStart="]
if len(cmds) != 1:
    sys.exit("ha.conf: not one ExecStart= command")
out = []
for w in cmds[0].replace("%d", creds).split():
    m = re.fullmatch(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", w)
    if not m:
        out.append(w)
    elif (m.group(1) or m.group(2)) not in env:
        sys.exit(f"ha.conf: {w} is not set in coordinator-ha.env")
    elif m.group(1):
        out.append(env[m.group(1)])  # ${VAR}: one word
    else:
        out += env[m.group(2)].split()  # $VAR: split at whitespace, as systemd does
out[0] = out[0].replace("/usr/local/bin", bin_dir)
print("\n".join(out))
PYEOF
}
ha_failover() {
  ha_failover_run
  local code=$?
  stop_started
  return "$code"
}
ha_failover_run() {
  local log="$W/ha-run" etcd_client etcd_peer a b n both argv=()
  mkdir -p "$log/creds" "$log/root"
  read -r etcd_client etcd_peer a b <<<"$(free_ports 4)"
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$log/creds/operator-token"
  od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$log/creds/agent-token"
  # etcd as etcd/testing_etcd.cc starts it.
  "$ETCD_BIN" --name m0 --data-dir "$log/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "m0=http://127.0.0.1:$etcd_peer" --initial-cluster-state new --initial-cluster-token "$log" \
    --logger zap --log-outputs stderr >"$log/etcd.log" 2>&1 &
  local etcd=$!
  echo "$etcd" >>"$PIDFILE"
  etcd_healthy() {
    kill -0 "$etcd" 2>/dev/null || return 2
    "$PY" -c 'import json, sys, urllib.request
sys.exit(0 if json.load(urllib.request.urlopen(sys.argv[1], timeout=1)).get("health") == "true" else 1)' \
      "http://127.0.0.1:$etcd_client/health" 2>/dev/null
  }
  wait_for 30 etcd_healthy || { echo "etcd did not come up:"; tail -n 5 "$log/etcd.log"; return 1; }
  # The two replicas.
  local -A pid
  for n in a b; do
    ha_argv "${!n}" "$etcd_client" "$log/root" "$log/creds" >"$log/$n.argv" || { cat "$log/$n.argv"; return 1; }
    mapfile -t argv <"$log/$n.argv"
    "${argv[@]}" >"$log/$n.out" 2>"$log/$n.log" &
    pid[$n]=$!
    echo "${pid[$n]}" >>"$PIDFILE"
  done
  both="127.0.0.1:$a,127.0.0.1:$b"
  status_through() {  # status_through ADDRESSES: ckptctl status succeeds
    kill -0 "${pid[a]}" 2>/dev/null || kill -0 "${pid[b]}" 2>/dev/null || return 2
    "$BIN/ckptctl" status --coordinator "$1" >"$log/status.out" 2>&1
  }
  wait_for 30 status_through "$both" ||
    { echo "ckptctl status --coordinator $both failed:"; cat "$log/status.out"
      grep -h -m 3 " ERROR ckptd-coordinator: " "$log/a.log" "$log/b.log"; return 1; }
  # Exactly one leads (its log says so once it serves); the other stands by
  # and, asked alone, names it (ckptctl exits 3: its list lacks the leader).
  local leader standby
  one_leads() { [ "$(grep -l "leading (epoch" "$log/a.log" "$log/b.log" | wc -l)" -eq 1 ]; }
  wait_for 5 one_leads || { echo "not exactly one leader:"; tail -n 5 "$log/a.log" "$log/b.log"; return 1; }
  leader="$(basename "$(grep -l "leading (epoch" "$log/a.log" "$log/b.log")" .log)"
  standby=a
  [ "$leader" = a ] && standby=b
  grep -q "standby on 127.0.0.1:${!standby}" "$log/$standby.log" ||
    { echo "replica $standby does not say it stands by:"; cat "$log/$standby.log"; return 1; }
  names_leader() {
    "$BIN/ckptctl" status --coordinator "127.0.0.1:${!standby}" >"$log/standby.out" 2>&1
    [ $? -eq 3 ] && grep -q "is a standby; the leader is 127.0.0.1:${!leader} (epoch" "$log/standby.out"
  }
  wait_for 5 names_leader ||
    { echo "the standby, asked alone, does not name the leader 127.0.0.1:${!leader}:"; cat "$log/standby.out"; return 1; }
  local epoch
  epoch="$(sed -n 's/.*leading (epoch \([0-9]*\)).*/\1/p' "$log/$leader.log" | tail -n 1)"
  # The leader dies; the standby takes over within the lease (3 s) and a poll.
  kill -KILL "${pid[$leader]}"
  wait "${pid[$leader]}" 2>/dev/null
  local t0=$SECONDS
  wait_for 10 status_through "$both" ||
    { echo "no leader 10 s after the leader's SIGKILL:"; cat "$log/status.out"; tail -n 5 "$log/$standby.log"; return 1; }
  local taken
  taken="$(sed -n 's/.*leading (epoch \([0-9]*\)).*/\1/p' "$log/$standby.log" | tail -n 1)"
  [ -n "$taken" ] && [ "$taken" -gt "$epoch" ] ||
    { echo "replica $standby does not lead under a newer epoch than $epoch:"; tail -n 5 "$log/$standby.log"; return 1; }
  echo "took over in about $((SECONDS - t0)) s" >"$log/took"
  kill -TERM "${pid[$standby]}"
  wait "${pid[$standby]}" || { echo "the new leader did not stop cleanly on SIGTERM"; return 1; }
}
if grep -qa "was built without etcd" "$BIN/ckptd-coordinator"; then
  if [ "${CI:-}" = true ]; then
    echo "FAILED: $BIN/ckptd-coordinator was built without etcd (Debian package golang-etcd-server-dev; scripts/install-deps.sh installs it)"
    failures=$((failures + 1))
  else
    echo "skipped: replicated coordinators (this ckptd-coordinator was built without etcd)"
  fi
elif [ -n "$ETCD_BIN" ]; then
  check "replicated coordinators: two started by ha.conf with coordinator-ha.env's flags on etcd; one leads, the other takes over its SIGKILL" \
    ha_failover
elif [ "${CI:-}" = true ]; then
  echo "FAILED: etcd is missing (Debian package etcd-server; scripts/install-deps.sh installs it)"
  failures=$((failures + 1))
else
  echo "skipped: replicated coordinators (no etcd: Debian package etcd-server; scripts/install-deps.sh installs it)"
fi

# ------------------------------------------------------------ 8. monitoring
# deploy/prometheus: the alert rules and their unit tests (promtool), the
# example scrape configuration, the rules' metrics, labels, annotations and
# ckptctl hints; the PrometheusRule generated from them.
PROMTOOL="$(command -v promtool 2>/dev/null)"
[ -z "$PROMTOOL" ] && [ -x "$REPO/.tools/promtool" ] && PROMTOOL="$REPO/.tools/promtool"
if need yamllint yamllint; then
  check "yamllint deploy/prometheus" yamllint -s -c "$K8S/.yamllint" "$PROM"
fi
if [ -n "$PROMTOOL" ]; then
  check "promtool check rules deploy/prometheus/ckptd-alerts.yaml" "$PROMTOOL" check rules "$PROM/ckptd-alerts.yaml"
  # (relative to the file, as promtool reads its rule_files)
  check "promtool test rules deploy/prometheus/ckptd-alerts_test.yaml: each alert fires, and does not, where it should" \
    bash -c "cd '$PROM' && '$PROMTOOL' test rules ckptd-alerts_test.yaml"
  check "promtool check config deploy/prometheus/prometheus.yml (with the rules it names)" \
    bash -c "cd '$PROM' && '$PROMTOOL' check config prometheus.yml"
elif [ "${CI:-}" = true ]; then
  echo "FAILED: promtool is missing (from Debian's prometheus package; scripts/install-deps.sh unpacks it into .tools/)"
  failures=$((failures + 1))
else
  echo "skipped: promtool checks of deploy/prometheus (no promtool on PATH or in .tools/: run scripts/install-deps.sh)"
fi
alert_rules() {
  PYTHONPATH="$W" "$PY" - "$REPO" "$DOC" "$PROM" <<'PYEOF'
import os, re, sys
import yaml
from metric_names import documented, registered, unknown

repo, doc, prom = sys.argv[1:]
problems = []
bad = problems.append
rules = yaml.safe_load(open(os.path.join(prom, "ckptd-alerts.yaml")))
tests = yaml.safe_load(open(os.path.join(prom, "ckptd-alerts_test.yaml")))
config = yaml.safe_load(open(os.path.join(prom, "prometheus.yml")))
# Names a binary registers, or (the agent's, until its build is here) the doc's tables list.
known = {**documented(doc), **registered(repo)}
scrape_jobs = {c.get("job_name") for c in config.get("scrape_configs") or []}
for c in config.get("scrape_configs") or []:
    if c.get("job_name", "").startswith("ckptd") and c.get("honor_labels") is not True:
        bad(f"prometheus.yml: scrape job {c.get('job_name')} needs honor_labels: true (ckptd's label job)")
alerts = {}
for g in rules.get("groups") or []:
    for r in g.get("rules") or []:
        name = r.get("alert")
        if not name:
            bad(f"group {g.get('name')}: a rule that is no alert ({r.get('record')}): none is expected here")
            continue
        if not re.fullmatch(r"Ckptd[A-Z][A-Za-z]+", name):
            bad(f"{name}: alert names are CkptdCamelCase")
        if name in alerts:
            bad(f"{name}: two alerts of that name")
        alerts[name] = r
        if (r.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
            bad(f"{name}: needs labels.severity critical, warning or info")
        ann = r.get("annotations") or {}
        for a in ("summary", "description"):
            if not str(ann.get(a, "")).strip():
                bad(f"{name}: no annotations.{a}")
        # What to look at: a command of ckptctl, kubectl or the unit's log.
        if not re.search(r"ckptctl|kubectl|journalctl|\blogs?\b", str(ann.get("description", ""))):
            bad(f"{name}: its description gives no hint of where to look (ckptctl ..., kubectl ...)")
        expr = str(r.get("expr", ""))
        for n in unknown(re.findall(r"\bckptd_[a-z0-9_]+\b", expr), known):
            bad(f"{name}: {n} is no metric a binary registers or docs/operations.md lists")
        for job in re.findall(r'\bup\{[^}]*job="([^"]+)"', expr):
            if job not in scrape_jobs:
                bad(f"{name}: up{{job=\"{job}\"}}: no scrape job of prometheus.yml is called {job}")
# Each alert is tested firing, and tested where it must not fire.
fired, quiet = set(), set()
for t in tests.get("tests") or []:
    for c in t.get("alert_rule_test") or []:
        (fired if c.get("exp_alerts") else quiet).add(c.get("alertname"))
for name in sorted(alerts):
    if name not in fired:
        bad(f"{name}: ckptd-alerts_test.yaml has no case where it fires")
    if name not in quiet:
        bad(f"{name}: ckptd-alerts_test.yaml has no case where it must not fire")
for name in sorted((fired | quiet) - set(alerts)):
    bad(f"ckptd-alerts_test.yaml tests {name}, which ckptd-alerts.yaml does not define")
print("\n".join(problems))
sys.exit(1 if problems else 0)
PYEOF
}
check "alert rules: severity, summary, description with a hint; their metrics exist; up{job} a scrape job; each tested both ways" \
  alert_rules
# The Grafana dashboard: its structure, its variables, and its queries
# (metrics that exist; PromQL that promtool parses, as recording rules with
# Grafana's variables put in).
dashboard() {
  PYTHONPATH="$W" "$PY" - "$REPO" "$DOC" "$REPO/deploy/grafana/ckptd-dashboard.json" "$W/dashboard-rules.yaml" \
    "${PROMTOOL:-}" <<'PYEOF'
import json, re, subprocess, sys
from metric_names import documented, registered, unknown

repo, doc, path, rules_out, promtool = sys.argv[1:]
problems = []
bad = problems.append
try:
    d = json.load(open(path))
except ValueError as e:
    print(f"deploy/grafana/ckptd-dashboard.json: not JSON: {e}")
    sys.exit(1)
known = {**documented(doc), **registered(repo)}
DS_VARS = ("${datasource}", "$datasource")
if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 36:
    bad(f"schemaVersion {d.get('schemaVersion')}: older than Grafana 9's 36")
for k in ("uid", "title"):
    if not d.get(k):
        bad(f"no {k}")
variables = {v.get("name"): v for v in (d.get("templating") or {}).get("list") or []}
ds = variables.get("datasource") or {}
if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
    bad("needs a template variable datasource of type datasource, query prometheus")
job = variables.get("job") or {}
query = job.get("query")
query = query.get("query") if isinstance(query, dict) else query
m = re.fullmatch(r"label_values\(\s*(ckptd_[a-z0-9_]+)\s*,\s*job\s*\)", str(query or ""))
if job.get("type") != "query" or not m:
    bad(f"needs a template variable job of type query, label_values(ckptd_..., job), not {query!r}")
elif unknown([m.group(1)], known):
    bad(f"variable job: {m.group(1)} is no metric a binary registers or docs/operations.md lists")
if (job.get("datasource") or {}).get("uid") not in DS_VARS:
    bad("variable job: its datasource is not the variable ${datasource}")

def walk(panels):
    for p in panels or []:
        yield p
        yield from walk(p.get("panels"))

ids, exprs = set(), []
for p in walk(d.get("panels")):
    what = f"panel {p.get('id')} {p.get('title')!r}"
    if not isinstance(p.get("id"), int) or p["id"] in ids:
        bad(f"{what}: its id is not a number of its own")
    ids.add(p.get("id"))
    if not str(p.get("title", "")).strip():
        bad(f"panel {p.get('id')}: no title")
    g = p.get("gridPos") or {}
    if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] < 0 or g["x"] + g["w"] > 24:
        bad(f"{what}: gridPos {g} is not within the 24 columns")
    if p.get("type") == "row":
        continue
    if (p.get("datasource") or {}).get("uid") not in DS_VARS:
        bad(f"{what}: its datasource is not the variable ${{datasource}}: {p.get('datasource')}")
    targets = p.get("targets") or []
    if not targets:
        bad(f"{what}: no queries")
    refs = [t.get("refId") for t in targets]
    if len(set(refs)) != len(refs):
        bad(f"{what}: two queries with one refId")
    for t in targets:
        if "datasource" in t and (t.get("datasource") or {}).get("uid") not in DS_VARS:
            bad(f"{what}: query {t.get('refId')}: its datasource is not the variable ${{datasource}}")
        expr = str(t.get("expr") or "")
        if not expr.strip():
            bad(f"{what}: query {t.get('refId')} has no expr")
            continue
        exprs.append((f"{what} {t.get('refId')}", expr))
        for n in unknown(re.findall(r"\bckptd_[a-z0-9_]+\b", expr), known):
            bad(f"{what}: {n} is no metric a binary registers or docs/operations.md lists")
        if "histogram_quantile" in expr and not re.search(r"by \([^)]*\ble\b", expr):
            bad(f"{what}: histogram_quantile over a sum that does not keep le")
# Panels do not overlap.
cells = {}
for p in d.get("panels") or []:
    g = p.get("gridPos") or {}
    for x in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
        for y in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
            if (x, y) in cells:
                bad(f"panel {p.get('id')} overlaps panel {cells[(x, y)]}")
                break
            cells[(x, y)] = p.get("id")
        else:
            continue
        break
if not any("$job" in e for _, e in exprs):
    bad("no query uses the variable job")
# The queries as recording rules, Grafana's variables replaced, for promtool.
rules = [{"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "5m").replace("$job", ".*")}
         for i, (_, e) in enumerate(exprs)]
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(rules_out, "w"), indent=1)
if promtool:
    r = subprocess.run([promtool, "check", "rules", rules_out], capture_output=True, text=True)
    if r.returncode != 0:
        bad("promtool check rules on the dashboard's queries:\n" + r.stdout + r.stderr)
print("\n".join(dict.fromkeys(problems)))
sys.exit(1 if problems else 0)
PYEOF
}
check "Grafana dashboard: JSON, ids, titles, \${datasource} and job variables, its queries' metrics and PromQL" dashboard
# The PrometheusRule is the rules file, generated.
prometheusrule_generated() {
  "$PROM/prometheusrule.sh" >"$W/prometheusrule.yaml" || return 1
  diff -u "$K8S/monitoring/prometheusrule.yaml" "$W/prometheusrule.yaml" ||
    { echo "run: deploy/prometheus/prometheusrule.sh > deploy/kubernetes/monitoring/prometheusrule.yaml"; return 1; }
}
check "deploy/kubernetes/monitoring/prometheusrule.yaml is deploy/prometheus/prometheusrule.sh's output" \
  prometheusrule_generated

echo "$passed passed, $failures failed"
[ "$failures" -eq 0 ]
