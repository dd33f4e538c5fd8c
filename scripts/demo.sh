#!/usr/bin/env bash
# Set up, then run the main job on a built-in default: profile VGG16 (analytic, RTX 2080Ti,
# batch 64), search a plan for the paper's 4 x 2 RTX 2080Ti cluster, simulate it, and
# compare it with the baselines. Everything lands in ./out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
P=.venv/bin/planner
MODEL=${MODEL:-vgg16}
CLUSTER=${CLUSTER:-pipepar-4x2-2080ti}
mkdir -p out
$P profile "$MODEL" --batch-size 64 --mode analytic --device-flops rtx2080ti -o "out/$MODEL.profile.json"
$P search "out/$MODEL.profile.json" --cluster "$CLUSTER" -o "out/$MODEL.plan.json"
$P simulate "out/$MODEL.plan.json" --trace "out/$MODEL.trace.json" --plot "out/$MODEL.schedule.png"
$P compare "out/$MODEL.profile.json" --cluster "$CLUSTER" --plot "out/$MODEL.compare.png"
echo "demo: wrote out/$MODEL.{profile,plan,trace}.json, out/$MODEL.schedule.png, out/$MODEL.compare.png" >&2
