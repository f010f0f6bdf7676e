# Sourced by the H200 device scripts (loads/h200_*.sh): strict mode, the repository root as the working
# directory and on PYTHONPATH (the device has torch and pynvml but no toolkit install), and the results folder
# R=$OUT/NAME that the device tool brings back. Usage: source "$(dirname "$0")/device_env.sh" NAME
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h200-out}
R=$OUT/$1
mkdir -p "$R"
