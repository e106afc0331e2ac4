#!/usr/bin/env bash
# Run an lra_jax sweep on a multi-host Cloud TPU VM slice, one run at a time on every host.
#
#   scripts/launch_tpu_vm.sh TPU_NAME ZONE [sweep flags...]
#   scripts/launch_tpu_vm.sh lra-v4-32 us-central2-b --variants=all --tasks=all --scales=full --seeds=0,1,2 \
#       --root=/mnt/shared/runs/sweep
#
# The run list comes from `python -m lra_jax.tools.sweep --emit --distributed` (runs whose results.json
# exists are left out). Each command runs on all workers at once (`gcloud ... tpu-vm ssh --worker=all`):
# every host runs the same `python -m lra_jax.train ... --distributed`, which detects the TPU slice and
# joins the hosts into one program; each host feeds its own chips' share of every batch, host 0 writes
# the metrics and results, all hosts save the checkpoints together. Requirements on the workers:
#   - the repository checked out at $REPO_DIR with its virtual environment (.venv) installed
#     (set SETUP=1 to run `git pull && pip install -e ".[tpu]"` there first: jax's TPU build, libtpu);
#   - --root on storage every host sees (Filestore / NFS / gcsfuse mount): checkpoints and results.json
#     are written there, and a rerun of this script resumes interrupted runs and skips finished ones.
# Environment: REPO_DIR (default ~/lra_jax), PROJECT (default: gcloud's), SETUP=1, PYTHON (the local
# interpreter that plans the sweep, default python), DRY_RUN=1: print the gcloud commands it would run,
# one a line, and run none of them (the plan is still made locally). The test suite checks the dry run;
# the commands themselves have not been run on a TPU VM by the test suite.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,23p' "$0"
  exit 2
fi
TPU_NAME=$1
ZONE=$2
shift 2
REPO_DIR=${REPO_DIR:-'~/lra_jax'}
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project "$PROJECT"); fi

ssh_all() {
  local remote="cd $REPO_DIR && . .venv/bin/activate && $1"
  if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" "${PROJECT_FLAG[@]}" --worker=all \
      --command "$remote"
    echo
  else
    gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" "${PROJECT_FLAG[@]}" --worker=all \
      --command "$remote"
  fi
}

if [[ -n "${SETUP:-}" ]]; then
  ssh_all "git pull --ff-only && pip install -q -e '.[tpu]'"
fi

# The plan is made locally (same repository, same --root as the workers see it).
mapfile -t COMMANDS < <("${PYTHON:-python}" -m lra_jax.tools.sweep --emit --distributed "$@")
echo "${#COMMANDS[@]} runs to do"
failed=0
for i in "${!COMMANDS[@]}"; do
  echo "[$((i + 1))/${#COMMANDS[@]}] ${COMMANDS[$i]}"
  if ! ssh_all "${COMMANDS[$i]}"; then
    echo "  failed; continuing (rerun this script to retry: finished runs are skipped)" >&2
    failed=$((failed + 1))
  fi
done
echo "done: $((${#COMMANDS[@]} - failed)) ok, $failed failed"
[[ $failed -eq 0 ]]
